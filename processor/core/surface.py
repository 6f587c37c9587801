"""Surface planning — rule S (and M-2/M-3 dispatch).

The surface is the ordered list of seqs whose messages the model sees.  An
event is first *planned* against the current surface (pure: yields a plan or
a :class:`SessionError`, changes nothing) and then *committed*.  The live
:class:`SurfaceManager` and the offline :func:`fold_surface` are two drivers
of the one planner, :func:`plan_event`, so live appends and replays can never
disagree about what a replacement means (S-9, G-5).

Only what planning needs is retained: the events of current nodes (S-4..S-6
look at them), every ``request/header`` (D-3 resolves ``headerSeq``), the
projected message overrides (M-2) and the replacement history (G-5).  That
state is small and serialisable, so the service can checkpoint it and keep
planning without the log prefix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from processor.core.errors import SessionError
from processor.core.event_checks import (
    check_header,
    check_header_seq,
    check_settlement,
    check_surface_fields,
)
from processor.core.events import (
    ABSENT,
    KNOWN_TYPES,
    MAX_SAFE_INT,
    MESSAGE_PROJECTION_TYPES,
    SURFACE_TYPES,
    Event,
    parse_event,
)
from processor.core.frozen import freeze
from processor.core.message_projections import MessageProjectionRegistry, ProjectionContext
from processor.core.surface_plans import (
    AppendPlan as AppendPlan,
)
from processor.core.surface_plans import (  # re-exported: the plans are planned here
    LogOnlyPlan as LogOnlyPlan,
)
from processor.core.surface_plans import (
    Plan as Plan,
)
from processor.core.surface_plans import (
    ProjectPlan as ProjectPlan,
)
from processor.core.surface_plans import (
    Replacement as Replacement,
)
from processor.core.surface_plans import (
    ReplacePlan as ReplacePlan,
)

# ---------------------------------------------------------------- state


#: The one empty ``projection_types_used`` (``frozenset(())`` is a new object)
_NO_TYPES: Final[frozenset[str]] = frozenset()


@dataclass(slots=True)
class SurfaceState:
    """Everything the planner reads; mutated only by :func:`commit_plan`."""

    next_seq: int = 0
    nodes: list[int] = field(default_factory=list)
    node_events: dict[int, Event] = field(default_factory=dict)
    headers: dict[int, Event] = field(default_factory=dict)
    overrides: dict[int, Any] = field(default_factory=dict)
    replacements: list[Replacement] = field(default_factory=list)
    #: a frozenset replaced when it grows (rarely): one shared empty one in the
    #: sessions that never used a projection, not an empty set (216 bytes) each
    projection_types_used: frozenset[str] = _NO_TYPES
    replace_generation: int = 0
    content_generation: int = 0
    #: Session format whose message rules apply (3, 4), or None for either; it
    #: comes from the file header, so it is not part of the checkpoint.
    dialect: int | None = None

    def event_of(self, seq: int) -> Event | None:
        return self.node_events.get(seq) or self.headers.get(seq)

    def message_of(self, seq: int) -> Any:
        """Current message of a node: a projected override wins (G-1)."""
        if seq in self.overrides:
            return self.overrides[seq]
        ev = self.node_events.get(seq)
        return ev.message if ev is not None else None

    # -- checkpoint support: plain JSON in, plain JSON out
    def to_json(self) -> dict[str, Any]:
        return {
            "nextSeq": self.next_seq,
            "nodes": list(self.nodes),
            "nodeEvents": [self.node_events[s].to_json() for s in self.nodes],
            "headers": [ev.to_json() for ev in self.headers.values()],
            "overrides": [[s, m] for s, m in self.overrides.items()],
            "replacements": [r.to_json() for r in self.replacements],
            "projectionTypesUsed": sorted(self.projection_types_used),
            "replaceGeneration": self.replace_generation,
            "contentGeneration": self.content_generation,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SurfaceState:
        node_events = {ev.seq: ev for ev in map(parse_event, raw["nodeEvents"])}
        nodes = [int(s) for s in raw["nodes"]]
        if sorted(node_events) != sorted(nodes):
            raise ValueError("surface checkpoint: node events do not match nodes")
        return cls(
            next_seq=int(raw["nextSeq"]),
            nodes=nodes,
            node_events=node_events,
            headers={ev.seq: ev for ev in map(parse_event, raw["headers"])},
            overrides={int(s): freeze(m) for s, m in raw["overrides"]},
            replacements=[
                Replacement(r["seq"], r["startSeq"], r["endSeq"], tuple(r["shadowed"]))
                for r in raw["replacements"]
            ],
            projection_types_used=frozenset(raw["projectionTypesUsed"]) or _NO_TYPES,
            replace_generation=int(raw["replaceGeneration"]),
            content_generation=int(raw["contentGeneration"]),
        )


# ---------------------------------------------------------------- planner


def _is_seq(value: Any) -> bool:
    # Integers only: parse_event already made an integral float (3.0) the int.
    return type(value) is int and 0 <= value <= MAX_SAFE_INT


def _surface_op(event: Event) -> tuple[int, int] | None:
    """S-2: ``"append"`` (None) or ``(startSeq, endSeq)`` of a replace."""
    op, seq = event.surface_op, event.seq
    if op is ABSENT or op is None:
        raise SessionError(seq, "S-2", f"{event.type} requires surfaceOp")
    if op == "append":
        return None
    if (
        not isinstance(op, dict)
        or op.get("op") != "replace"
        or set(op) != {"op", "startSeq", "endSeq"}
    ):
        raise SessionError(
            seq,
            "S-2",
            'surfaceOp must be "append" or exactly {op:"replace", startSeq, endSeq}',
        )
    start, end = op["startSeq"], op["endSeq"]
    if not _is_seq(start) or not _is_seq(end):
        raise SessionError(seq, "S-2", "replace startSeq and endSeq must be non-negative integers")
    if start >= seq or end >= seq:
        raise SessionError(seq, "S-2", f"replace range {start}..{end} must lie before seq {seq}")
    return start, end


def _source_seqs(event: Event) -> tuple[int, ...] | None:
    """S-3: validated ``sourceEventSeqs`` or None when absent."""
    raw, seq = event.source_event_seqs, event.seq
    if raw is ABSENT:
        return None
    if event.type == "assistant/message":
        raise SessionError(seq, "S-3", "assistant/message must not carry sourceEventSeqs")
    if not isinstance(raw, list) or not raw:
        raise SessionError(seq, "S-3", "sourceEventSeqs must be a non-empty array")
    # One pass for the common case (a few valid, distinct, earlier seqs);
    # any failure re-runs the checks in the rule's order for its message.
    seen: set[int] = set()
    for s in raw:
        if type(s) is not int or s < 0 or s >= seq or s in seen:
            break
        seen.add(s)
    else:
        return tuple(raw)
    if not all(_is_seq(s) for s in raw):
        raise SessionError(seq, "S-3", "sourceEventSeqs must hold non-negative integers")
    if len(set(raw)) != len(raw):
        raise SessionError(seq, "S-3", "sourceEventSeqs must not repeat a seq")
    future = [s for s in raw if s >= seq]
    if future:
        raise SessionError(
            seq, "S-3", f"sourceEventSeqs must reference earlier seqs; got {future[0]}"
        )
    raise AssertionError("unreachable: the fast pass refused a valid sourceEventSeqs")


def _same_except(new: Any, old: Any, skip: str) -> bool:
    """Both objects hold the same keys with equal values, ``skip`` aside.

    What the S-5 loops below conclude when they raise nothing, without the
    two key sets, their union and two ``get`` calls per key they build.
    """
    for key, value in new.items():
        if key != skip and (key not in old or value != old[key]):
            return False
    return all(key == skip or key in new for key in old)


def _check_tool_result_replace(event: Event, old: Event) -> None:
    """S-5: a tool/result rewrite may change only ``message.content``."""
    seq = event.seq
    if old.type != "tool/result":
        raise SessionError(
            seq, "S-5", f"tool/result replacement must shadow a tool/result, not {old.type}"
        )
    new_data, old_data = event.data, old.data
    if _same_except(new_data, old_data, "message") and _same_except(
        new_data["message"], old_data["message"], "content"
    ):
        return  # the usual rewrite; otherwise the loops name the first difference
    for key in set(new_data) | set(old_data):
        if key != "message" and new_data.get(key, ABSENT) != old_data.get(key, ABSENT):
            raise SessionError(
                seq,
                "S-5",
                f"tool/result replacement may change only message.content; data.{key} differs",
            )
    new_msg, old_msg = new_data["message"], old_data["message"]
    for key in set(new_msg) | set(old_msg):
        if key != "content" and new_msg.get(key, ABSENT) != old_msg.get(key, ABSENT):
            raise SessionError(
                seq,
                "S-5",
                f"tool/result replacement may change only message.content; message.{key} differs",
            )


def _plan_replace(
    state: SurfaceState, event: Event, start: int, end: int, sources: tuple[int, ...] | None
) -> ReplacePlan:
    seq = event.seq
    for endpoint in (start, end):
        if endpoint not in state.node_events:
            raise SessionError(
                seq, "S-4", f"replace endpoint {endpoint} is not a current surface node"
            )
    nodes = state.nodes
    si = nodes.index(start)
    # both are nodes (checked above); the end is searched from the start on
    # (list.index compares every int before it), the whole list only when
    # it lies before the start, which S-4 refuses below
    try:
        ei = nodes.index(end, si)
    except ValueError:
        ei = nodes.index(end)
    if si > ei:
        raise SessionError(
            seq, "S-4", f"replace start {start} comes after end {end} on the surface"
        )
    shadowed = tuple(state.nodes[si : ei + 1])
    cited = set(sources or ())
    missing = [s for s in shadowed if s not in cited]
    if missing:
        raise SessionError(
            seq,
            "S-4",
            "replace must cite every shadowed node in sourceEventSeqs; missing "
            + ", ".join(map(str, missing)),
        )
    if event.type == "tool/result":
        if len(shadowed) != 1:
            raise SessionError(
                seq,
                "S-5",
                f"tool/result replacement must shadow exactly one node, not {len(shadowed)}",
            )
        _check_tool_result_replace(event, state.node_events[shadowed[0]])
    if (
        si == 0
        and state.node_events[state.nodes[0]].type == "system/message"
        and (event.type != "system/message" or ei != 0)
    ):
        raise SessionError(
            seq,
            "S-6",
            "a replace starting at the system head must be a system/message "
            "covering exactly that node",
        )
    return ReplacePlan(seq, start, end, si, ei, shadowed)


def _plan_projection(
    state: SurfaceState, event: Event, registry: MessageProjectionRegistry | None
) -> ProjectPlan | None:
    """M-2/M-3: dispatch to a message projection, or None when not one."""
    projection = registry.get(event.type) if registry is not None else None
    if projection is None:
        if event.type in MESSAGE_PROJECTION_TYPES:
            raise SessionError(
                event.seq, "M-3", f"{event.type} requires a message projection, none is registered"
            )
        return None
    ctx = ProjectionContext(
        nodes=tuple(state.nodes),
        event_of=state.event_of,
        message_of=state.message_of,
        projected=MappingProxyType(dict(state.overrides)),
    )
    result = projection.project(event, ctx)
    overrides: dict[int, Any] = {}
    for target, message in result.items():
        if target not in state.node_events:
            raise SessionError(
                event.seq,
                "M-1",
                f"{event.type} projected seq {target}, which is not a surface node",
            )
        old = state.message_of(target)
        if (
            not isinstance(message, dict)
            or message.get("id") != old.get("id")
            or message.get("role") != old.get("role")
        ):
            raise SessionError(
                event.seq,
                "M-1",
                f"{event.type} must keep the identity (id, role) of the message at seq {target}",
            )
        overrides[target] = freeze(message)
    return ProjectPlan(event.seq, event.type, MappingProxyType(overrides))


#: What :func:`plan_event` does with a known type after S-1 and M-2: nothing
#: more (log-only, opaque data), D-4, D-7, or the surface checks (D, S-2..S-6).
#: One dict lookup per event instead of up to five set and string tests.
_OPAQUE: Final = 0
_HEADER: Final = 1
_ATTEMPT: Final = 2
_SURFACE: Final = 3
_KIND_OF_TYPE: Final[dict[str, int]] = {
    t: (
        _SURFACE
        if t in SURFACE_TYPES
        else _HEADER
        if t == "request/header"
        else _ATTEMPT
        if t == "assistant/attempt"
        else _OPAQUE
    )
    for t in KNOWN_TYPES
}


def plan_event(
    state: SurfaceState, event: Event, message_projections: MessageProjectionRegistry | None = None
) -> Plan:
    """Plan ``event`` against ``state``; raise :class:`SessionError` if invalid.

    Order: contiguity (S-1), message projections (M-2, before surfaceOp
    handling), known type (E-4), data checks (D), then surface rules (S-2..S-6).
    """
    seq = event.seq
    if seq != state.next_seq:
        raise SessionError(seq, "S-1", f"seq {seq} is not contiguous; expected {state.next_seq}")
    etype = event.type
    # M-2 dispatch first; the common case (no projection for this type) costs
    # one dict lookup here instead of a call into _plan_projection per event.
    if etype in MESSAGE_PROJECTION_TYPES or (
        message_projections is not None and message_projections.get(etype) is not None
    ):
        plan = _plan_projection(state, event, message_projections)
        if plan is not None:
            return plan
    kind = _KIND_OF_TYPE.get(etype)
    if kind is None:
        if event.ignorable is True:
            return LogOnlyPlan(seq)
        raise SessionError(seq, "E-4", f"unknown event type {etype!r} (not marked ignorable: true)")
    if kind != _SURFACE:
        # check_event_data's log-only part, the type already known
        if kind == _HEADER:
            check_header(event)
        elif kind == _ATTEMPT and event.ignorable is not True:
            check_settlement(event)  # D-7; an ignorable attempt is opaque (issue 36 item 5)
        return LogOnlyPlan(seq)
    added = check_surface_fields(event, state.dialect)
    if added:  # D-3 (a bound method per surface event was a tenth of the checks)
        check_header_seq(event, added, state.event_of)
    op = event.surface_op
    if isinstance(op, str) and op == "append":  # (compiled: a str compare, not a generic one)
        # S-2 passed ("append"); S-3 still judges sourceEventSeqs when present
        if event.source_event_seqs is not ABSENT:
            _source_seqs(event)
        return AppendPlan(seq)
    replace = _surface_op(event)
    sources = _source_seqs(event)
    if replace is None:
        return AppendPlan(seq)
    return _plan_replace(state, event, replace[0], replace[1], sources)


def commit_plan(state: SurfaceState, event: Event, plan: Plan) -> None:
    """Apply a plan made by :func:`plan_event` for this very event (S-7, M-2)."""
    # Exact type tests, most frequent first: a log-only plan (half the events)
    # used to fall through three isinstance checks.
    kind = type(plan)
    if kind is LogOnlyPlan:
        pass
    elif kind is AppendPlan:
        # one int object for the node and its key (compiled, each use of the
        # native int ``plan.seq`` as an object allocated another)
        seq: Any = plan.seq
        state.nodes.append(seq)
        state.node_events[seq] = event
    elif isinstance(plan, ReplacePlan):
        seq = plan.seq
        state.nodes[plan.start_index : plan.end_index + 1] = [seq]
        node_events, overrides = state.node_events, state.overrides
        for s in plan.shadowed:
            del node_events[s]
            if overrides and s in overrides:  # most sessions never project a message
                del overrides[s]
        node_events[seq] = event
        state.replacements.append(
            Replacement(plan.seq, plan.start_seq, plan.end_seq, plan.shadowed)
        )
        state.replace_generation += 1
        state.content_generation += 1
    elif isinstance(plan, ProjectPlan):
        state.overrides.update(plan.overrides)
        if plan.projection_type not in state.projection_types_used:
            state.projection_types_used = state.projection_types_used | {plan.projection_type}
        state.content_generation += 1
    if event.type == "request/header":
        state.headers[event.seq] = event
    state.next_seq = event.seq + 1


def assert_projections(state: SurfaceState, registry: MessageProjectionRegistry | None) -> None:
    """M-4: a projection this session used must still be registered."""
    used = state.projection_types_used
    # Runs before every commit: compare against the registry's keys instead
    # of building its type set each time.
    if not used or (registry is not None and registry.has_all(used)):
        return
    gone = sorted(t for t in used if registry is None or registry.get(t) is None)
    if gone:
        raise SessionError(
            None,
            "M-4",
            f"message projection {gone[0]!r} was removed after this session "
            "committed events through it; its messages cannot be rebuilt",
        )


# ---------------------------------------------------------------- drivers


class SurfaceManager:
    """Incremental driver: validate the next event, then commit it (S-9).

    :meth:`validate_next` stages ``(candidate, expected seq, plan)`` without
    touching nodes; :meth:`commit` reuses the staged plan when it receives
    exactly that candidate object at that seq and re-plans otherwise.
    """

    __slots__ = ("_m4_removals", "_m4_used", "_m4_used_count", "_registry", "_staged", "state")

    def __init__(
        self,
        message_projections: MessageProjectionRegistry | None = None,
        state: SurfaceState | None = None,
    ) -> None:
        self.state = state if state is not None else SurfaceState()
        self._registry = message_projections
        self._staged: tuple[Event, int, Plan] | None = None
        # The last passed M-4 check: the used-type set (object and size) and
        # the registry's removal count it was made against.
        self._m4_used: frozenset[str] | None = None
        self._m4_used_count = -1
        self._m4_removals = -1

    def _check_m4(self) -> None:
        """:func:`assert_projections`, skipped when nothing it reads changed.

        The used set only grows and a registry changes its answer only by a
        removal, so an unchanged (set, size, removals) passes again.
        """
        used = self.state.projection_types_used
        if not used:
            return
        registry = self._registry
        removals = registry.removals if registry is not None else -2
        if (
            used is self._m4_used
            and len(used) == self._m4_used_count
            and removals == self._m4_removals
        ):
            return
        assert_projections(self.state, registry)
        self._m4_used, self._m4_used_count, self._m4_removals = used, len(used), removals

    @property
    def nodes(self) -> Sequence[int]:
        return self.state.nodes

    @property
    def replace_generation(self) -> int:
        return self.state.replace_generation

    @property
    def content_generation(self) -> int:
        return self.state.content_generation

    @property
    def message_projections(self) -> MessageProjectionRegistry | None:
        return self._registry

    def validate_next(self, candidate: Event) -> Plan:
        self._check_m4()
        plan = plan_event(self.state, candidate, self._registry)
        self._staged = (candidate, self.state.next_seq, plan)
        return plan

    def commit(self, event: Event) -> Plan:
        state = self.state
        staged = self._staged
        if staged is None:
            # the offline fold and the service's own appends: nothing staged.
            # _check_m4's tests, inline: once a projection was used (M-4) they
            # run per event, and the call was most of their cost.
            used = state.projection_types_used
            if used and (
                used is not self._m4_used
                or len(used) != self._m4_used_count
                or (self._registry.removals if self._registry is not None else -2)
                != self._m4_removals
            ):
                self._check_m4()
            plan = plan_event(state, event, self._registry)
        else:
            self._staged = None
            if staged[0] is event and staged[1] == state.next_seq:
                plan = staged[2]
            else:
                self._check_m4()
                plan = plan_event(state, event, self._registry)
        commit_plan(state, event, plan)
        return plan


@dataclass(frozen=True, slots=True)
class SurfaceFold:
    """Result of :func:`fold_surface` (G-5)."""

    nodes: tuple[int, ...]
    replacements: tuple[Replacement, ...]
    projected: Mapping[int, Any]
    replace_generation: int
    content_generation: int


def fold_surface(
    events: Sequence[Event], message_projections: MessageProjectionRegistry | None = None
) -> SurfaceFold:
    """Offline driver: fold a whole log (from seq 0) with the same planner."""
    state = SurfaceState()
    for event in events:
        commit_plan(state, event, plan_event(state, event, message_projections))
    return SurfaceFold(
        nodes=tuple(state.nodes),
        replacements=tuple(state.replacements),
        projected=MappingProxyType(dict(state.overrides)),
        replace_generation=state.replace_generation,
        content_generation=state.content_generation,
    )
