"""Event envelope, event types and data checks (SESSION-SEMANTICS §0–2).

The envelope is validated once, where bytes or dicts become an :class:`Event`;
everything downstream may then trust its shape.  Envelope rules have no id in
the spec, so they carry ours: E-1 key set, E-2 field types, E-3 plain JSON,
E-4 known type or ``ignorable``, E-5 no surfaceOp/sourceEventSeqs on log-only
types.  The data checks D-1..D-6 need earlier events (D-3 looks up a
``request/header``), so they take a lookup function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from processor.core.errors import SessionError
from processor.core.frozen import freeze, json_problem

SURFACE_TYPES: Final = frozenset(
    {"system/message", "developer/message", "user/message", "assistant/message", "tool/result"}
)
LOG_ONLY_TYPES: Final = frozenset(
    {
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "assistant/attempt",
        "tool/call",
        "request/header",
        "request/context",
        "session/end-seed",
        "llm/retry",
        "llm/retry-started",
        "agent/inbox/spliced",
    }
)
#: Types that only make sense through a registered message projection (M-3).
MESSAGE_PROJECTION_TYPES: Final = frozenset({"image/offload"})
KNOWN_TYPES: Final = SURFACE_TYPES | LOG_ONLY_TYPES | MESSAGE_PROJECTION_TYPES

ROLE_OF_TYPE: Final = {
    "system/message": "system",
    "developer/message": "developer",
    "user/message": "user",
    "assistant/message": "assistant",
    "tool/result": "tool",
}
HEADER_REASONS: Final = frozenset({"initial", "resume", "change", "series"})

_ENVELOPE_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"}
)
_REQUIRED_KEYS: Final = ("type", "seq", "time", "data")


class _Absent:
    """Marks an optional envelope key that is not there (distinct from null)."""

    __slots__ = ()
    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Final = _Absent()


@dataclass(frozen=True, slots=True, eq=False)
class Event:
    """One validated envelope.  ``data`` is deep-frozen JSON.

    ``surface_op`` and ``source_event_seqs`` hold the raw JSON values (or
    :data:`ABSENT`); their meaning is checked by the surface planner (S-2,
    S-3) because the rules that judge them belong there.
    """

    type: str
    seq: int
    time: int
    data: Any
    surface_op: Any = ABSENT
    source_event_seqs: Any = ABSENT
    ignorable: bool | None = None

    @property
    def is_surface(self) -> bool:
        return self.type in SURFACE_TYPES

    @property
    def is_known(self) -> bool:
        return self.type in KNOWN_TYPES

    @property
    def message(self) -> Any:
        """The message a surface event carries (D-6), or None."""
        if self.type == "user/message":
            return self.data
        if self.type in SURFACE_TYPES and isinstance(self.data, dict):
            return self.data.get("message")
        return None

    def to_json(self) -> dict[str, Any]:
        """The camelCase envelope; its values stay frozen (``thaw`` to edit)."""
        out: dict[str, Any] = {
            "type": self.type,
            "seq": self.seq,
            "time": self.time,
            "data": self.data,
        }
        if self.surface_op is not ABSENT:
            out["surfaceOp"] = self.surface_op
        if self.source_event_seqs is not ABSENT:
            out["sourceEventSeqs"] = self.source_event_seqs
        if self.ignorable is not None:
            out["ignorable"] = self.ignorable
        return out

    def to_bytes(self) -> bytes:
        """Compact JSON of the envelope, keys in envelope order."""
        return orjson.dumps(self.to_json())

    def digest_bytes(self) -> bytes:
        """Canonical bytes (sorted keys) for duplicate detection."""
        return orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)

    def same_as(self, other: Event) -> bool:
        """Exact-duplicate test (the seq gate's digest comparison)."""
        return self.digest_bytes() == other.digest_bytes()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seq_hint(raw: Mapping[str, Any]) -> int | None:
    seq = raw.get("seq")
    return seq if _is_int(seq) else None


def parse_event(raw: Any, *, trusted_json: bool = False) -> Event:
    """Validate an envelope (a dict decoded from JSON) and freeze it.

    ``trusted_json`` skips the plain-JSON walk when ``raw`` came from a strict
    JSON decoder (orjson refuses NaN/Infinity itself).
    """
    if not isinstance(raw, dict):
        raise SessionError(None, "E-1", "event envelope must be a JSON object")
    seq_hint = _seq_hint(raw)
    extra = sorted(set(raw) - _ENVELOPE_KEYS)
    if extra:
        raise SessionError(seq_hint, "E-1", f"unknown envelope key(s): {', '.join(extra)}")
    missing = [k for k in _REQUIRED_KEYS if k not in raw]
    if missing:
        raise SessionError(seq_hint, "E-1", f"missing envelope key(s): {', '.join(missing)}")
    etype, seq, time = raw["type"], raw["seq"], raw["time"]
    if not _is_int(seq) or seq < 0:
        raise SessionError(None, "E-2", f"seq must be an integer >= 0, got {seq!r}")
    if not isinstance(etype, str) or not etype:
        raise SessionError(seq, "E-2", "type must be a non-empty string")
    if not _is_int(time):
        raise SessionError(seq, "E-2", "time must be an integer (epoch ms)")
    ignorable = raw.get("ignorable")
    if ignorable is not None and not isinstance(ignorable, bool):
        raise SessionError(seq, "E-2", "ignorable must be a boolean")
    if "ignorable" in raw and ignorable is None:
        raise SessionError(seq, "E-2", "ignorable must be a boolean")
    if not trusted_json:
        for key in ("data", "surfaceOp", "sourceEventSeqs"):
            if key in raw:
                problem = json_problem(raw[key], key)
                if problem:
                    raise SessionError(seq, "E-3", f"{problem}; data must be plain JSON")
    # E-4 (unknown type without ignorable) is judged by the planner, which
    # knows the session's registered message-projection types.
    if etype in KNOWN_TYPES and etype not in SURFACE_TYPES:
        for key in ("surfaceOp", "sourceEventSeqs"):
            if key in raw:
                raise SessionError(seq, "E-5", f"{etype} must not carry {key}")
    return Event(
        type=etype,
        seq=seq,
        time=time,
        data=freeze(raw["data"]),
        surface_op=freeze(raw["surfaceOp"]) if "surfaceOp" in raw else ABSENT,
        source_event_seqs=freeze(raw["sourceEventSeqs"]) if "sourceEventSeqs" in raw else ABSENT,
        ignorable=ignorable,
    )


def parse_event_bytes(line: bytes | str) -> Event:
    """Parse one JSON envelope (a JSONL line or a Kafka ``data`` string)."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise SessionError(None, "E-3", f"event is not valid JSON: {exc}") from None
    return parse_event(raw, trusted_json=True)


def make_event(
    etype: str,
    seq: int,
    data: Any,
    *,
    time: int = 0,
    surface_op: Any = ABSENT,
    source_event_seqs: Any = ABSENT,
    ignorable: bool | None = None,
) -> Event:
    """Build and validate an event from Python values (writers, tests)."""
    raw: dict[str, Any] = {"type": etype, "seq": seq, "time": time, "data": data}
    if surface_op is not ABSENT:
        raw["surfaceOp"] = surface_op
    if source_event_seqs is not ABSENT:
        raw["sourceEventSeqs"] = source_event_seqs
    if ignorable is not None:
        raw["ignorable"] = ignorable
    return parse_event(raw)


# --------------------------------------------------------------------------
# Data checks — rule D.  ``lookup(seq)`` returns an earlier event or None.
# --------------------------------------------------------------------------

EventLookup = Callable[[int], "Event | None"]


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def check_message_shape(event: Event) -> None:
    """D-6 (and D-1): a surface event carries a well-formed message."""
    seq, etype = event.seq, event.type
    if etype != "user/message" and not isinstance(event.data, dict):
        raise SessionError(seq, "D-6", f"{etype} data must be an object")
    message = event.message
    where = "data" if etype == "user/message" else "data.message"
    if not isinstance(message, dict):
        raise SessionError(seq, "D-6", f"{etype} {where} must be a message object")
    role = message.get("role")
    if (role == "developer") != (etype == "developer/message"):
        raise SessionError(
            seq, "D-1", f"developer/message type and role developer must occur together "
            f"(type {etype}, role {role!r})"
        )
    mid = message.get("id")
    if not isinstance(mid, str) or not mid:
        raise SessionError(seq, "D-6", f"{where}.id must be a non-empty string")
    if role != ROLE_OF_TYPE[etype]:
        raise SessionError(
            seq, "D-6", f"{where}.role must be {ROLE_OF_TYPE[etype]!r} for {etype}, got {role!r}"
        )
    if not isinstance(message.get("content"), list):
        raise SessionError(seq, "D-6", f"{where}.content must be a list of blocks")


def _check_tool_blocks(event: Event) -> list[str]:
    """D-2: tool-addition/removal blocks; returns the added tool names."""
    added: list[str] = []
    is_dev = event.type == "developer/message"
    for block in _blocks(event.message):
        btype = block.get("type") if isinstance(block, dict) else None
        if btype not in ("tool-addition", "tool-removal"):
            continue
        if not is_dev:
            raise SessionError(
                event.seq, "D-2", f"{btype} blocks are only allowed in developer messages"
            )
        name = block.get("toolName")
        if not isinstance(name, str) or not name:
            raise SessionError(event.seq, "D-2", f"{btype} block needs a non-empty toolName")
        if btype == "tool-addition":
            if "tool" in block:
                raise SessionError(
                    event.seq, "D-2",
                    f"tool-addition {name!r} must not inline a tool definition",
                )
            added.append(name)
    return added


def _check_header_seq(event: Event, added: list[str], lookup: EventLookup) -> None:
    """D-3: headerSeq exactly when there are additions, pointing at the header."""
    seq = event.seq
    has = isinstance(event.data, dict) and "headerSeq" in event.data
    if not added:
        if has:
            raise SessionError(seq, "D-3", "headerSeq is only allowed with tool additions")
        return
    if not has:
        raise SessionError(seq, "D-3", "developer message with tool additions needs headerSeq")
    header_seq = event.data["headerSeq"]
    if not _is_int(header_seq) or header_seq < 0 or header_seq >= seq:
        raise SessionError(seq, "D-3", f"headerSeq {header_seq!r} must be an earlier seq")
    target = lookup(header_seq)
    if target is None or target.type != "request/header":
        raise SessionError(seq, "D-3", f"headerSeq {header_seq} is not a request/header")
    tools = target.data["header"].get("tools") or []
    for name in added:
        matches = [t for t in tools if isinstance(t, dict) and t.get("name") == name]
        if len(matches) != 1:
            raise SessionError(
                seq, "D-3",
                f"header {header_seq} must declare exactly one tool {name!r}, found {len(matches)}",
            )
        tool = matches[0]
        if not isinstance(tool.get("description"), str):
            raise SessionError(seq, "D-3", f"tool {name!r} in header {header_seq} needs a "
                               "string description")
        if not isinstance(tool.get("parameters"), dict):
            raise SessionError(seq, "D-3", f"tool {name!r} in header {header_seq} needs object "
                               "parameters")
        if "deferLoading" in tool and tool["deferLoading"] is not True:
            raise SessionError(seq, "D-3", f"tool {name!r} deferLoading must be true when present")


def _check_header(event: Event) -> None:
    """D-4: the request/header payload."""
    seq, data = event.seq, event.data
    header = data.get("header")
    if not isinstance(header, dict):
        raise SessionError(seq, "D-4", "request/header data.header must be an object")
    if "system" in header:
        raise SessionError(
            seq, "D-4", "header.system is refused: the prompt lives on the surface as "
            "system/message"
        )
    if not isinstance(header.get("config"), dict):
        raise SessionError(seq, "D-4", "header.config must be an object")
    if "tools" in header:
        tools = header["tools"]
        if not isinstance(tools, list):
            raise SessionError(seq, "D-4", "header.tools must be a list")
        if not tools:
            raise SessionError(seq, "D-4", "header.tools: [] is refused (omit it instead)")
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise SessionError(seq, "D-4", "every header tool must be an object with a name")
    if "adapterDefaults" in header:
        defaults = header["adapterDefaults"]
        if not isinstance(defaults, dict):
            raise SessionError(seq, "D-4", "header.adapterDefaults must be an object")
        if not defaults:
            raise SessionError(
                seq, "D-4", "header.adapterDefaults: {} is refused (omit it instead)"
            )
    if data.get("reason") not in HEADER_REASONS:
        raise SessionError(
            seq, "D-4", f"request/header reason must be one of initial|resume|change|series, "
            f"got {data.get('reason')!r}"
        )


def check_event_data(event: Event, lookup: EventLookup) -> None:
    """Run the data checks D-1..D-6 that apply to ``event``."""
    etype = event.type
    if not event.is_known:
        return  # ignorable unknown type: opaque
    if etype in SURFACE_TYPES:
        check_message_shape(event)
        added = _check_tool_blocks(event)
        if etype == "developer/message":
            _check_header_seq(event, added, lookup)
        if (
            etype == "tool/result"
            and "error" in event.data
            and event.data["message"].get("isError") is not True
        ):
            raise SessionError(
                    event.seq, "D-5", "tool/result with error requires message.isError === true"
                )
        return
    if not isinstance(event.data, dict):
        raise SessionError(event.seq, "D-6", f"{etype} data must be an object")
    if etype == "request/header":
        _check_header(event)

