"""Event envelope, event types and data checks (SESSION-SEMANTICS §0–2).

These are the agent runtime's own load checks (``assertSessionEventEnvelope``,
``validateSessionEventData``, ``assertCurrentLlmShape`` and its message shape
checks): we accept what it accepts and refuse what it refuses, at the same
event.  The table runtime check -> rule id -> test is docs/runtime-load-checks.md.

The envelope is validated once, where bytes or dicts become an :class:`Event`;
everything downstream may then trust its shape.  Envelope rules have no id in
the spec, so they carry ours: E-1 key set, E-2 field types (JavaScript safe
integers, ``ignorable`` absent or true), E-3 plain JSON, E-4 known type or
``ignorable``, E-5 no surfaceOp/sourceEventSeqs on log-only types.  The data
checks D-1..D-7 need earlier events (D-3 looks up a ``request/header``), so
they take a lookup function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson

from processor.core.errors import SessionError
from processor.core.frozen import freeze, json_problem

SURFACE_TYPES: Final = frozenset(
    {"system/message", "developer/message", "user/message", "assistant/message", "tool/result"}
)
#: Types that only make sense through a registered message projection (M-3).
MESSAGE_PROJECTION_TYPES: Final = frozenset({"image/offload"})
#: The runtime's ``KNOWN_SESSION_EVENT_TYPES`` (its newest generated catalog).
#: A type in here needs no ``ignorable`` marker; a type outside it does (E-4).
KNOWN_TYPES: Final = frozenset(
    {
        "agent-preset/selected", "agent/inbox/spliced", "approval/asked",
        "approval/decided", "approval/policy", "assistant/attempt", "assistant/message",
        "command/done", "command/run", "compaction/end", "compaction/prune",
        "compaction/start", "compaction/summary", "deliverables/presented",
        "developer/message", "feedback/message-delete", "feedback/message-put",
        "feedback/record", "goal/change", "hook/invoked", "hook/result", "image/offload",
        "llm/retry", "llm/retry-started", "model/selection", "permission/preset",
        "plan/mode", "request/context", "request/header", "sandbox/mode",
        "schedule/change", "session-log-deepseek/delivery-accepted", "session/end-seed",
        "session/title", "session/title-llm-request", "slots/dispatch", "step/end",
        "step/start", "subagent/catalog", "subagent/descriptor",
        "subagent/model-selection-policy", "system/message", "team/member",
        "team/message/delivered", "team/message/queued", "team/task", "todo/write",
        "tool-workflow/agent-end", "tool-workflow/agent-start", "tool-workflow/run-end",
        "tool-workflow/run-start", "tool/call", "tool/ptc-dispatch",
        "tool/ptc-dispatch-start", "tool/result", "turn/end", "turn/start",
        "user/message", "web/deepseek-search-llm-request", "workspace/changes",
    }
)
#: Known types that neither join the surface nor project messages.
LOG_ONLY_TYPES: Final = KNOWN_TYPES - SURFACE_TYPES - MESSAGE_PROJECTION_TYPES

#: The role a message of each surface type carries.  A ``tool/result`` carries
#: a ``tool`` message (format v4) or, in the released v3 form, a ``user``
#: message wrapping one ``tool-result`` block; see :func:`check_message_shape`.
ROLE_OF_TYPE: Final = {
    "system/message": "system",
    "developer/message": "developer",
    "user/message": "user",
    "assistant/message": "assistant",
    "tool/result": "tool",
}
#: JavaScript's Number.MAX_SAFE_INTEGER: the runtime refuses larger integers
#: where it needs exact ones (seq, time, turn, step, seq references).
MAX_SAFE_INT: Final = 2**53 - 1
HEADER_REASONS: Final = frozenset({"initial", "resume", "change", "series"})

_ENVELOPE_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"}
)
_REQUIRED_KEYS: Final = ("type", "seq", "time", "data")


class _Absent:
    """Marks an optional envelope key that is not there (distinct from null)."""

    __slots__ = ()
    _instance: ClassVar[_Absent | None] = None

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


_EventMaker = Callable[[str, int, int, Any, Any, Any, "bool | None"], Event]


def _slot_event_maker() -> _EventMaker:
    """``Event(...)`` for parse_event without the frozen dataclass ``__init__``.

    That ``__init__`` goes through ``object.__setattr__`` for each of the seven
    fields (about 2 us of the ~9 us an event's parse takes); writing the slot
    descriptors directly gives the same object in under 1 us.  Where Event is
    not a plain slotted class (a compiled build), or the probe does not come
    out identical, the ordinary constructor is used.
    """
    fields = ("type", "seq", "time", "data", "surface_op", "source_event_seqs", "ignorable")
    try:
        setters = [vars(Event)[f].__set__ for f in fields]
        new = object.__new__
        s_type, s_seq, s_time, s_data, s_op, s_src, s_ign = setters

        def make(etype: str, seq: int, time: int, data: Any, surface_op: Any,
                 source_event_seqs: Any, ignorable: bool | None) -> Event:
            event: Event = new(Event)
            s_type(event, etype)
            s_seq(event, seq)
            s_time(event, time)
            s_data(event, data)
            s_op(event, surface_op)
            s_src(event, source_event_seqs)
            s_ign(event, ignorable)
            return event

        probe_args = ("t", 1, 2, [3], "append", [0], True)
        probe = make(*probe_args)
        if tuple(getattr(probe, f) for f in fields) == probe_args and repr(probe) == repr(
            Event(*probe_args)
        ):
            return make
    except (KeyError, AttributeError, TypeError):
        pass
    return Event


_new_event: _EventMaker = _slot_event_maker()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def safe_int(value: Any) -> int | None:
    """``value`` as a JavaScript safe integer, or None.

    The runtime reads JSON numbers as doubles and asks ``Number.isSafeInteger``:
    ``3.0`` is the integer 3 there, ``-0.0`` and anything beyond 2**53-1 are not
    exact and are refused.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -MAX_SAFE_INT <= value <= MAX_SAFE_INT else None
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SAFE_INT:
        if value == 0 and math.copysign(1.0, value) < 0:
            return None
        return int(value)
    return None


def is_seq(value: Any) -> bool:
    """A non-negative safe integer (a seq, turn, step or index)."""
    n = safe_int(value)
    return n is not None and n >= 0


def _seq_hint(raw: Mapping[str, Any]) -> int | None:
    seq = safe_int(raw.get("seq"))
    return seq if seq is not None and seq >= 0 else None


def parse_event(raw: Any, *, trusted_json: bool = False) -> Event:
    """Validate an envelope (a dict decoded from JSON) and freeze it.

    The envelope rules are the runtime's ``assertSessionEventEnvelope``: the
    seven keys only, ``type`` a string, ``seq`` a non-negative safe integer,
    ``time`` a safe integer, ``data`` present (any JSON value), ``ignorable``
    absent or exactly ``true``.  ``trusted_json`` skips the plain-JSON walk when
    ``raw`` came from a strict JSON decoder (orjson refuses NaN/Infinity itself).
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
    etype = raw["type"]
    seq = safe_int(raw["seq"])
    if seq is None or seq < 0:
        raise SessionError(
            None, "E-2", f"seq must be a non-negative safe integer (<= 2**53-1), got {raw['seq']!r}"
        )
    if not isinstance(etype, str):
        raise SessionError(seq, "E-2", "type must be a string")
    time = safe_int(raw["time"])
    if time is None:
        raise SessionError(seq, "E-2", "time must be a safe integer (epoch ms, <= 2**53-1)")
    if "ignorable" in raw and raw["ignorable"] is not True:
        raise SessionError(
            seq, "E-2", f"ignorable must be absent or true, got {raw['ignorable']!r}"
        )
    ignorable: bool | None = True if "ignorable" in raw else None
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
    return _new_event(
        etype,
        seq,
        time,
        freeze(raw["data"]),
        freeze(raw["surfaceOp"]) if "surfaceOp" in raw else ABSENT,
        freeze(raw["sourceEventSeqs"]) if "sourceEventSeqs" in raw else ABSENT,
        ignorable,
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


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _has_provider_model(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _nonempty_str(value.get("provider"))
        and _nonempty_str(value.get("model"))
    )


def _check_tool_result_v4(seq: int, message: Mapping[str, Any], call_id: str) -> None:
    """Format v4: a first-class ``tool`` message answering ``source.callId``."""
    if message.get("toolCallId") != call_id:
        raise SessionError(seq, "D-6", "tool/result message toolCallId must equal source.callId")
    if "isError" in message and not isinstance(message["isError"], bool):
        raise SessionError(seq, "D-6", "tool/result message isError must be a boolean")
    for block in message["content"]:
        if isinstance(block, dict) and block.get("type") == "tool-result":
            raise SessionError(
                seq, "D-6", "a tool-role message must not wrap a tool-result block"
            )


def _check_tool_result_v3(seq: int, message: Mapping[str, Any], call_id: str) -> None:
    """Released v3 form: a ``user`` message with exactly one ``tool-result`` block."""
    content = message["content"]
    block = content[0] if len(content) == 1 else None
    if (
        not isinstance(block, dict)
        or block.get("type") != "tool-result"
        or not isinstance(block.get("content"), list)
    ):
        raise SessionError(
            seq, "D-6", "a user-role tool/result message must contain exactly one tool-result "
            "block with a content list"
        )
    if block.get("toolCallId") != call_id:
        raise SessionError(seq, "D-6", "tool-result block toolCallId must equal source.callId")


def check_message_shape(event: Event, dialect: int | None = None) -> None:
    """D-6 (with D-1): a surface event carries a message the runtime can replay.

    ``dialect`` selects the session format whose message rules apply: 4 (the
    runtime's newest: tool results are ``tool`` messages, system messages come
    from ``system-prompt``), 3 (the released v3 form: a tool result is a
    ``user`` message wrapping one ``tool-result`` block, a system message has a
    ``plugin`` source) or None, used where no file header names the format
    (Kafka, header-less files): each message may take either form.
    """
    _check_message_shape(event, event.message, dialect)


def _check_message_shape(event: Event, message: Any, dialect: int | None) -> None:
    """:func:`check_message_shape` with ``event.message`` already in hand."""
    seq, etype = event.seq, event.type
    if etype != "user/message" and not isinstance(event.data, dict):
        raise SessionError(seq, "D-6", f"{etype} data must be an object")
    where = "data" if etype == "user/message" else "data.message"
    if not isinstance(message, dict) or not _nonempty_str(message.get("id")):
        raise SessionError(seq, "D-6", f"{etype} lacks an identified message ({where}.id)")
    role = message.get("role")
    if (role == "developer") != (etype == "developer/message"):
        raise SessionError(
            seq, "D-1", f"developer/message type and role developer must occur together "
            f"(type {etype}, role {role!r})"
        )
    if etype == "tool/result":
        allowed = {3: ("user",), 4: ("tool",)}.get(dialect or 0, ("tool", "user"))
        if role not in allowed:
            raise SessionError(
                seq, "D-6", f"{where}.role must be {' or '.join(map(repr, allowed))} for "
                f"tool/result, got {role!r}"
            )
    elif role != ROLE_OF_TYPE[etype]:
        raise SessionError(
            seq, "D-6", f"{where}.role must be {ROLE_OF_TYPE[etype]!r} for {etype}, got {role!r}"
        )
    source = message.get("source")
    if not isinstance(source, dict) or not _nonempty_str(source.get("kind")):
        raise SessionError(seq, "D-6", f"{where}.source must be an object with a non-empty kind")
    if not isinstance(message.get("content"), list):
        raise SessionError(seq, "D-6", f"{where}.content must be a list of blocks")
    kind = source["kind"]
    if dialect == 4 and kind == "plugin":
        raise SessionError(seq, "D-6", f"{where}.source.kind 'plugin' is the v3 form; format v4 "
                           "needs a producer-owned kind")
    if etype == "system/message":
        v4_ok = kind == "system-prompt"
        v3_ok = kind == "plugin" and _nonempty_str(source.get("plugin"))
        if not (v4_ok if dialect == 4 else v3_ok if dialect == 3 else v4_ok or v3_ok):
            raise SessionError(
                seq, "D-6", f"system/message source must be {{kind: 'system-prompt'}} (v4) or "
                f"{{kind: 'plugin', plugin}} (v3), got kind {kind!r}"
            )
    elif etype == "assistant/message":
        if kind != "model" or not _has_provider_model(source):
            raise SessionError(
                seq, "D-6", "assistant/message source must be {kind: 'model', provider, model}"
            )
    elif etype == "tool/result":
        call_id = source.get("callId")
        if kind != "tool" or not _nonempty_str(call_id):
            raise SessionError(
                seq, "D-6", "tool/result source must be {kind: 'tool', callId} with a "
                "non-empty callId"
            )
        if role == "tool":
            _check_tool_result_v4(seq, message, str(call_id))
        else:
            _check_tool_result_v3(seq, message, str(call_id))


def _check_settlement(event: Event) -> None:
    """D-7: assistant/attempt and assistant/message settle one step of one turn."""
    data = event.data
    if (
        not isinstance(data, dict)
        or not is_seq(data.get("turn"))
        or not is_seq(data.get("step"))
        or not isinstance(data.get("stream"), list)
    ):
        raise SessionError(
            event.seq, "D-7", f"{event.type} needs turn and step (non-negative safe integers) "
            "and a stream list"
        )


def _check_tool_blocks(event: Event, message: Any) -> list[str]:
    """D-2: tool-addition/removal blocks of ``message`` (the event's); returns the added names."""
    added: list[str] = []
    is_dev = event.type == "developer/message"
    for block in _blocks(message):
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


def _check_header_seq_presence(event: Event, added: list[str]) -> None:
    """D-3, relation-free part: headerSeq exactly when there are additions."""
    seq = event.seq
    has = isinstance(event.data, dict) and "headerSeq" in event.data
    if not added and has:
        raise SessionError(seq, "D-3", "headerSeq is only allowed with tool additions")
    if added and not has:
        raise SessionError(seq, "D-3", "developer message with tool additions needs headerSeq")


def _check_header_seq(event: Event, added: list[str], lookup: EventLookup) -> None:
    """D-3: the headerSeq of tool additions points at a header declaring them."""
    seq = event.seq
    if not added:
        return
    header_seq = safe_int(event.data["headerSeq"])
    if header_seq is None or header_seq < 0 or header_seq >= seq:
        raise SessionError(
            seq, "D-3", f"headerSeq {event.data['headerSeq']!r} must be an earlier seq"
        )
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


_ADAPTER_DEFAULT_KEYS: Final = frozenset({"reasoningEffort", "maxTokens"})


def _check_header(event: Event) -> None:
    """D-4: the request/header payload, as the runtime's load path checks it."""
    seq, data = event.seq, event.data
    if not isinstance(data, dict):
        raise SessionError(seq, "D-4", "request/header data must be an object")
    header = data.get("header")
    if not isinstance(header, dict):
        raise SessionError(seq, "D-4", "request/header data.header must be an object")
    if "system" in header:
        raise SessionError(
            seq, "D-4", "header.system is refused: the prompt lives on the surface as "
            "system/message"
        )
    if "tools" in header:
        tools = header["tools"]
        if not isinstance(tools, list):
            raise SessionError(seq, "D-4", "header.tools must be a list")
        if not tools:
            raise SessionError(seq, "D-4", "header.tools: [] is refused (omit it instead)")
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise SessionError(seq, "D-4", "every header tool must be an object with a name")
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, dict) and not defaults:
        raise SessionError(seq, "D-4", "header.adapterDefaults: {} is refused (omit it instead)")
    config = header.get("config")
    if not isinstance(config, dict) or not _has_provider_model(config):
        raise SessionError(
            seq, "D-4", "header.config must name a provider and a model (non-empty strings)"
        )
    effort = config.get("reasoningEffort")
    if "reasoningEffort" in config and not _nonempty_str(effort):
        raise SessionError(seq, "D-4", "header.config.reasoningEffort must be a non-empty string")
    if "adapterDefaults" in header:
        if not isinstance(defaults, dict):
            raise SessionError(seq, "D-4", "header.adapterDefaults must be an object")
        for key, flag in defaults.items():
            if key not in _ADAPTER_DEFAULT_KEYS or flag is not True:
                raise SessionError(
                    seq, "D-4", f"header.adapterDefaults.{key} is invalid (only reasoningEffort "
                    "and maxTokens, each exactly true)"
                )
            if key not in config:
                raise SessionError(
                    seq, "D-4", f"header.adapterDefaults.{key} requires header.config.{key}"
                )
    if data.get("reason") not in HEADER_REASONS:
        raise SessionError(
            seq, "D-4", f"request/header reason must be one of initial|resume|change|series, "
            f"got {data.get('reason')!r}"
        )
    if "startsSeries" in data and data["startsSeries"] is not True:
        raise SessionError(seq, "D-4", "request/header startsSeries must be absent or true")


def check_event_data(event: Event, lookup: EventLookup, dialect: int | None = None) -> None:
    """Run the data checks D-1..D-7 that apply to ``event``.

    Log-only types other than request/header and assistant/attempt are opaque:
    their ``data`` may be any JSON value, as in the runtime.
    """
    etype = event.type
    if etype not in KNOWN_TYPES:
        return  # ignorable unknown type: opaque
    if etype in SURFACE_TYPES:
        # The runtime's order: relation-free data checks (D-1, D-2, headerSeq
        # presence, D-5), then the message shape (D-6), then the settlement
        # fields (D-7), then the header the additions point at (D-3).
        message = event.message
        if isinstance(event.data, dict) and isinstance(message, dict):
            role = message.get("role")
            if (role == "developer") != (etype == "developer/message"):
                raise SessionError(
                    event.seq, "D-1", f"developer/message type and role developer must occur "
                    f"together (type {etype}, role {role!r})"
                )
        added = _check_tool_blocks(event, message)
        if etype == "developer/message":
            _check_header_seq_presence(event, added)
        if etype == "tool/result":
            data = event.data
            if not isinstance(data, dict):
                raise SessionError(event.seq, "D-6", "tool/result data must be an object")
            if "error" in data and not (
                isinstance(message, dict) and message.get("isError") is True
            ):
                raise SessionError(
                    event.seq, "D-5", "tool/result with error requires message.isError === true"
                )
        _check_message_shape(event, message, dialect)
        if etype == "assistant/message":
            _check_settlement(event)
        if etype == "developer/message":
            _check_header_seq(event, added, lookup)
        return
    if etype == "request/header":
        _check_header(event)
    elif etype == "assistant/attempt":
        _check_settlement(event)
