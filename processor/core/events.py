"""Event envelope and event types (docs/session-semantics.md §0–2).

These are the agent runtime's own load checks (``assertSessionEventEnvelope``,
``validateSessionEventData``, ``assertCurrentLlmShape`` and its message shape
checks): we accept what it accepts and refuse what it refuses, at the same
event.  The table runtime check -> rule id -> test is docs/runtime-load-checks.md.

The envelope is validated once, where bytes or dicts become an :class:`Event`;
everything downstream may then trust its shape.  Envelope rules have no id in
the spec, so they carry ours: E-1 key set, E-2 field types (JavaScript safe
integers, ``ignorable`` absent or true), E-3 plain JSON, E-4 known type or
``ignorable``, E-5 no surfaceOp/sourceEventSeqs on log-only types.  The data
checks D-1..D-7 (``event_checks.py``) need earlier events (D-3 looks up a
``request/header``), so they take a lookup function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson

from processor.core.errors import SessionError, raised_from
from processor.core.freezing import freeze_item
from processor.core.frozen import JsonDepthError, freeze, json_problem
from processor.core.leaf import SETTLE, register
from processor.core.sharing import FrozenTable

SURFACE_TYPES: Final = frozenset(
    {"system/message", "developer/message", "user/message", "assistant/message", "tool/result"}
)
#: Types that only make sense through a registered message projection (M-3).
MESSAGE_PROJECTION_TYPES: Final = frozenset({"image/offload"})
#: The runtime's ``KNOWN_SESSION_EVENT_TYPES`` (its newest generated catalog).
#: A type in here needs no ``ignorable`` marker; a type outside it does (E-4).
KNOWN_TYPES: Final = frozenset(
    {
        "agent-preset/selected",
        "agent/inbox/spliced",
        "approval/asked",
        "approval/decided",
        "approval/policy",
        "assistant/attempt",
        "assistant/message",
        "command/done",
        "command/run",
        "compaction/end",
        "compaction/prune",
        "compaction/start",
        "compaction/summary",
        "deliverables/presented",
        "developer/message",
        "feedback/message-delete",
        "feedback/message-put",
        "feedback/record",
        "goal/change",
        "hook/invoked",
        "hook/result",
        "image/offload",
        "llm/retry",
        "llm/retry-started",
        "model/selection",
        "permission/preset",
        "plan/mode",
        "request/context",
        "request/header",
        "sandbox/mode",
        "schedule/change",
        "session-log-deepseek/delivery-accepted",
        "session/end-seed",
        "session/title",
        "session/title-llm-request",
        "slots/dispatch",
        "step/end",
        "step/start",
        "subagent/catalog",
        "subagent/descriptor",
        "subagent/model-selection-policy",
        "system/message",
        "team/member",
        "team/message/delivered",
        "team/message/queued",
        "team/task",
        "todo/write",
        "tool-workflow/agent-end",
        "tool-workflow/agent-start",
        "tool-workflow/run-end",
        "tool-workflow/run-start",
        "tool/call",
        "tool/ptc-dispatch",
        "tool/ptc-dispatch-start",
        "tool/result",
        "turn/end",
        "turn/start",
        "user/message",
        "web/deepseek-search-llm-request",
        "workspace/changes",
    }
)
#: Known types that may not carry surface metadata (E-5).
_LOG_ONLY_KNOWN: Final = KNOWN_TYPES - SURFACE_TYPES
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


#: compiled, a Final is a C static; ``orjson.dumps`` was a module attribute
#: looked up per call (the digest: one per folded event)
_DUMPS: Final = orjson.dumps
_SORT_KEYS: Final = orjson.OPT_SORT_KEYS


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
        return _DUMPS(self.to_json(), option=_SORT_KEYS)

    def same_as(self, other: Event) -> bool:
        """Exact-duplicate test (the seq gate's digest comparison)."""
        return self.digest_bytes() == other.digest_bytes()


_EventMaker = Callable[[str, int, int, Any, Any, Any, "bool | None"], Event]


def _slot_event_maker() -> _EventMaker:
    """``Event(...)`` for parse_event without the frozen dataclass ``__init__``.

    That ``__init__`` goes through ``object.__setattr__`` for each of the seven
    fields (about 2 us of the ~9 us an event's parse takes); writing the slot
    descriptors directly gives the same object in under 1 us (the compiled
    build's class too).  Where the probe does not come out identical, the
    ordinary constructor is used.
    """
    fields = ("type", "seq", "time", "data", "surface_op", "source_event_seqs", "ignorable")
    try:
        setters = [vars(Event)[f].__set__ for f in fields]
        # Event.__new__, not object.__new__: the same thing for the pure class,
        # and the allocator of the compiled one (whose dataclass __init__ is
        # interpreted there and was about 1.5x the cost of these slot writes)
        new = Event.__new__
        s_type, s_seq, s_time, s_data, s_op, s_src, s_ign = setters

        def make(
            etype: str,
            seq: int,
            time: int,
            data: Any,
            surface_op: Any,
            source_event_seqs: Any,
            ignorable: bool | None,
        ) -> Event:
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


def _native_event(
    etype: str,
    seq: int,
    time: int,
    data: Any,
    surface_op: Any,
    source_event_seqs: Any,
    ignorable: bool | None,
) -> Event:
    """``Event(...)`` for the compiled build: the slots written by mypyc's own
    attribute stores (the setters the descriptors of :func:`_slot_event_maker`
    call, without a Python-level call each: ~3k of the instructions of an
    event's parse).  The pure build's frozen dataclass refuses these writes,
    so there :func:`_new_event_maker` keeps the descriptors."""
    event: Event = _EVENT_NEW(Event)
    event.type = etype  # type: ignore[misc]
    event.seq = seq  # type: ignore[misc]
    event.time = time  # type: ignore[misc]
    event.data = data  # type: ignore[misc]
    event.surface_op = surface_op  # type: ignore[misc]
    event.source_event_seqs = source_event_seqs  # type: ignore[misc]
    event.ignorable = ignorable  # type: ignore[misc]
    return event


_EVENT_NEW: Final = Event.__new__


def _new_event_maker() -> _EventMaker:
    """:func:`_native_event` where it builds the same event as ``Event(...)``
    (the compiled build), else :func:`_slot_event_maker`."""
    fields = ("type", "seq", "time", "data", "surface_op", "source_event_seqs", "ignorable")
    probe_args = ("t", 1, 2, [3], "append", [0], True)
    try:
        probe = _native_event(*probe_args)
        if tuple(getattr(probe, f) for f in fields) == probe_args and repr(probe) == repr(
            Event(*probe_args)
        ):
            return _native_event
    except (AttributeError, TypeError):  # FrozenInstanceError is an AttributeError
        pass
    return _slot_event_maker()


_new_event: _EventMaker = _new_event_maker()

# An Event parse_event builds holds scalars, ABSENT and frozen values, and is
# immutable: it cannot be part of a reference cycle either (leaf.py).
register((Event,), (ABSENT,))
_SETTLE: Final = SETTLE
#: The one copy of each known type and of "append" that decoded events share:
#: a decoder makes a fresh str per event, which the fold keeps (~60 B each,
#: cold in cache when the log is freed), and the fold's set and dict look-ups
#: of a shared one end at the identity test.  A frozen table: these strings
#: come from the input (an ignorable type is any string), so only the known
#: ones are shared.
SHARED_STRINGS: Final[FrozenTable[str]] = FrozenTable("event_strings", (*KNOWN_TYPES, "append"))
_SHARED: Final[dict[str, str]] = SHARED_STRINGS.values  # read inline per event


def _frozen_event(
    etype: str,
    seq: int,
    time: int,
    raw: dict[str, Any],
    has_op: bool,
    has_src: bool,
    ignorable: bool | None,
) -> Event:
    """The Event of a checked envelope: its JSON frozen, the event untracked by
    the collector where the build can (leaf.py)."""
    op = raw["surfaceOp"] if has_op else ABSENT
    if type(op) is dict:
        op = _integral_seqs(op, ("startSeq", "endSeq"))
    src = raw["sourceEventSeqs"] if has_src else ABSENT
    if type(src) is list:
        src = _integral_list(src)
    event = _new_event(
        _SHARED.get(etype, etype),
        seq,
        time,
        freeze(raw["data"]),
        freeze(op) if has_op else ABSENT,
        freeze(src) if has_src else ABSENT,
        ignorable,
    )
    return event if _SETTLE is None else _SETTLE(event)


def _integral(value: Any) -> Any:
    """An integral float seq (JSON ``3.0``) as the integer it is to the runtime.

    The runtime reads every JSON number as a double, so ``3.0`` and ``3`` are
    the same seq there (S-2, S-3); anything else is left for the checks to refuse.
    """
    n = safe_int(value) if type(value) is float else None
    return value if n is None or n < 0 else n


def _integral_seqs(op: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    if not any(type(op.get(k)) is float for k in keys):
        return op
    return {k: _integral(v) if k in keys else v for k, v in op.items()}


def _integral_list(values: list[Any]) -> list[Any]:
    for v in values:
        if type(v) is float:
            return [_integral(x) for x in values]
    return values


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
    if type(raw) is dict:
        # The common case, a well-formed envelope from a JSON decoder: the same
        # checks as below in a few C-level tests (key presence and count, exact
        # int types).  Anything else (a float seq, an unknown key, an error)
        # takes the full path, which decides and words the refusal.
        seq = raw.get("seq")
        time = raw.get("time")
        etype = raw.get("type")
        if (
            trusted_json
            and type(etype) is str
            and type(seq) is int
            and 0 <= seq <= MAX_SAFE_INT
            and type(time) is int
            and -MAX_SAFE_INT <= time <= MAX_SAFE_INT
            and "data" in raw
        ):
            # type, seq, time and data are there (None is neither str nor
            # int): the keys are the envelope's when the rest are optional
            # ones.  Counting membership tests costs a fraction of comparing
            # the key view with a set, which walked every key twice.
            n = len(raw)
            if n == 4:  # type, seq, time, data only
                return _frozen_event(etype, seq, time, raw, False, False, None)
            has_op = "surfaceOp" in raw
            has_src = "sourceEventSeqs" in raw
            ignorable = raw.get("ignorable", ABSENT)
            if (
                n == 4 + has_op + has_src + (ignorable is not ABSENT)
                and (ignorable is True or ignorable is ABSENT)
                and (etype not in _LOG_ONLY_KNOWN or not (has_op or has_src))
            ):
                return _frozen_event(
                    etype, seq, time, raw, has_op, has_src, True if ignorable is True else None
                )
    return _parse_event_checked(raw, trusted_json)


#: compiled: freeze in place (freezing.freeze_item); None in the pure build
_FREEZE_ITEM: Final = freeze_item


def parse_event_owned(raw: Any) -> Event:
    """:func:`parse_event` (``trusted_json``) of an envelope its caller has just
    decoded from JSON and keeps no other reference into.

    The same event and the same refusals.  Compiled, ``raw["data"]``'s dicts
    and lists become the event's frozen ones in place instead of being copied
    (``raw["data"]`` is then the event's ``data``); elsewhere it is
    :func:`parse_event`.
    """
    freeze_data = _FREEZE_ITEM
    if freeze_data is not None and type(raw) is dict and "data" in raw:
        try:
            freeze_data(raw, "data")
        except JsonDepthError:
            # too deep: parse_event refuses it, after the checks that come first
            return parse_event(raw, trusted_json=True)
    return parse_event(raw, trusted_json=True)


def _parse_event_checked(raw: Any, trusted_json: bool) -> Event:
    """:func:`parse_event`, every check in the runtime's order (and its refusals)."""
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
    return _frozen_event(
        etype, seq, time, raw, "surfaceOp" in raw, "sourceEventSeqs" in raw, ignorable
    )


def parse_event_bytes(line: bytes | str) -> Event:
    """Parse one JSON envelope (a JSONL line or a Kafka ``data`` string)."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        err = SessionError(None, "E-3", f"event is not valid JSON: {exc}")
        raise raised_from(err, None) from None
    return parse_event_owned(raw)


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
