"""Projection units as the registry holds them (P-1..P-7): a unit's definition,
its wire view, the registry, fold results, and the helpers that fold a unit
or read a checkpoint row.  The per-session cells are in ``projections.py``,
checkpoint arithmetic without a session in ``projection_restore.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from processor.core.errors import ProjectionError, raised_from
from processor.core.events import Event
from processor.core.frozen import freeze, thaw
from processor.core.log import SessionHeader

#: A unit's state: a plain JSON value (the built-ins use deep-frozen JSON).
State = Any
#: ``listener(key, state, view, observed_seq)``; ``view`` is None for non-wire units.
Listener = Callable[[str, Any, Any, int], None]
#: One checkpoint row: ``{"ver": int, "seq": int, "val": JSON}``.
CheckpointRow = dict[str, Any]
#: ``{key: row}`` for every unit (P-5).
Checkpoint = dict[str, CheckpointRow]

#: What a validator of untrusted stored data may raise to reject it.
_BAD_DATA: Final = (ValueError, TypeError, KeyError, IndexError, AttributeError)

#: A unit's key is its view's name on the wire (``<session>/<key>``) and its
#: checkpoint part's (``u.<key>``); these names belong to the service's own
#: records, so a unit that took one would overwrite them or be read as one
#: (processor/protocol.py re-exports them for the codec and the readers).
INTERNAL_VIEW_PREFIX: Final = "~"  # the parted format's records (~h, ~m<seq>, ...)
CORE_VIEWS: Final = ("messages", "surface", "transcript", "status")
TRANSCRIPT_PAGE_PREFIX: Final = "transcript."


def reserved_key_reason(key: str) -> str | None:
    """Why ``key`` cannot name a unit, or None when it can."""
    if key.startswith(INTERNAL_VIEW_PREFIX):
        return f"names starting with {INTERNAL_VIEW_PREFIX!r} are the service's parted view records"
    if key in CORE_VIEWS or key.startswith(TRANSCRIPT_PAGE_PREFIX):
        return "it is the name of a core view"
    if "\x00" in key:
        return "a NUL byte ends a checkpoint part key's session id"
    if "#" in key or "/" in key:
        # views keys are <session>/<name>[#<part>]: a reader maps a tombstone's
        # key back by its last '/' and its '#' (docs/views-format.md, section 3)
        return "'/' and '#' delimit the session, the name and the part in a views key"
    return None


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


_UNSET: Final[Any] = _Unset()


@dataclass(frozen=True, slots=True)
class WireView:
    """How a unit is published.

    ``view(state)`` must return the same object when nothing visible changed
    (P-1); ``validate_view(view)`` raises ``ValueError`` for a view that must
    not be published (snapshots refuse it instead of publishing garbage).
    """

    view: Callable[[State], Any]
    validate_view: Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class ProjectionDefinition:
    """One domain projection unit (see the module docstring).

    ``apply`` must be pure and synchronous and return the *same object* when
    the event is irrelevant (P-1); state is plain JSON and a state-carrying
    event carries the complete post-change value, never a delta (so a fold
    from any checkpoint converges).  ``validate_state`` raises ``ValueError``
    for a state the unit cannot continue from; it guards checkpoint rows.
    """

    key: str
    state_version: int
    init: Callable[[SessionHeader, int], State]
    apply: Callable[[State, Event], State]
    validate_state: Callable[[State], None]
    wire: WireView | None = None
    #: The event types ``apply`` may change the state for, or None for "any".
    #: Every other event must return the same object (P-1), so the driver
    #: skips the call: with ten units most calls would be no-ops otherwise.
    event_types: frozenset[str] | None = None
    #: Optional: ``apply`` over a list of events in one call, the same result
    #: as applying them one by one (the same object when none changes it, an
    #: equal state otherwise).  With it the session queues the unit's events
    #: and folds them once before anyone reads the cell, instead of building
    #: a new frozen state per event.  It must not raise: the queued events
    #: were committed long before a reader makes it run.
    apply_all: Callable[[State, list[Event]], State] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("projection key must be a non-empty string")
        if type(self.state_version) is not int or self.state_version < 0:
            raise ValueError(f"{self.key}: stateVersion must be a non-negative integer")
        if self.event_types is not None and not isinstance(self.event_types, frozenset):
            raise ValueError(f"{self.key}: event_types must be a frozenset or None")


class _Unit:
    """One incarnation of a registered key: the first definition and its refs.

    The object's identity is the incarnation: a session's cell remembers it,
    so a key that was released and registered again is noticed even when a
    session did not look in between.
    """

    __slots__ = ("definition", "refs")

    def __init__(self, definition: ProjectionDefinition) -> None:
        self.definition = definition
        self.refs = 1


class Registration:
    """Handle returned by :meth:`ProjectionRegistry.register`.

    :meth:`release` drops this registrant's reference; calling it again does
    nothing (a double release must not drop another registrant's reference).
    """

    __slots__ = ("_key", "_registry", "_released", "_unit")

    def __init__(self, registry: ProjectionRegistry, key: str, unit: _Unit) -> None:
        self._registry = registry
        self._key = key
        self._unit = unit
        self._released = False

    @property
    def key(self) -> str:
        return self._key

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._registry._release(self._key, self._unit)


class ProjectionRegistry:
    """P-2: definitions by key, reference counted per registrant.

    Same key + same ``state_version`` adds a reference and keeps the first
    definition (later ones are not compared: registrants must agree on the
    semantics of a key/version themselves); a different ``state_version`` is
    refused with a :class:`ProjectionError` (rule P-2); the key disappears
    when its last registrant releases it, and sessions then show it absent.
    """

    __slots__ = ("_generation", "_units")

    def __init__(self) -> None:
        self._units: dict[str, _Unit] = {}
        self._generation = 0

    @property
    def generation(self) -> int:
        """Bumped whenever the key set changes, so sessions resync cheaply."""
        return self._generation

    def register(self, definition: ProjectionDefinition) -> Registration:
        if not isinstance(definition, ProjectionDefinition):
            raise TypeError("register() needs a ProjectionDefinition")
        reason = reserved_key_reason(definition.key)
        if reason is not None:
            raise ProjectionError(
                None, "P-2", f"projection key {definition.key!r} is reserved: {reason}"
            )
        unit = self._units.get(definition.key)
        if unit is not None:
            have = unit.definition.state_version
            if have != definition.state_version:
                raise ProjectionError(
                    None,
                    "P-2",
                    f"projection {definition.key!r} is registered with "
                    f"stateVersion {have}; refusing stateVersion {definition.state_version}",
                )
            unit.refs += 1
        else:
            unit = _Unit(definition)
            self._units[definition.key] = unit
            self._generation += 1
        return Registration(self, definition.key, unit)

    def _release(self, key: str, unit: _Unit) -> None:
        if self._units.get(key) is not unit:
            return
        unit.refs -= 1
        if unit.refs <= 0:
            del self._units[key]
            self._generation += 1

    def get(self, key: str) -> ProjectionDefinition | None:
        unit = self._units.get(key)
        return unit.definition if unit is not None else None

    def refs(self, key: str) -> int:
        unit = self._units.get(key)
        return unit.refs if unit is not None else 0

    def definitions(self) -> list[ProjectionDefinition]:
        """Registered definitions in registration order."""
        return [u.definition for u in self._units.values()]

    def keys(self) -> list[str]:
        return list(self._units)

    def _incarnations(self) -> list[_Unit]:
        return list(self._units.values())

    def _incarnation(self, key: str) -> _Unit | None:
        return self._units.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._units

    def __len__(self) -> int:
        return len(self._units)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Views of wire units at one consistent cut ``as_of_seq`` (-1: empty log)."""

    as_of_seq: int
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What :func:`restore` rebuilt: the snapshot and fresh rows, both at endSeq."""

    snapshot: Snapshot
    rows: Checkpoint


def _fold(
    definition: ProjectionDefinition, state: State, events: Iterable[Event], after_seq: int
) -> tuple[State, int]:
    """Apply the events with seq > ``after_seq``, refusing a gap (P-3).

    Ignorable unknown events advance the watermark but are never applied.
    """
    seq = after_seq
    for event in events:
        if event.seq <= seq:
            continue
        if event.seq != seq + 1:
            raise ProjectionError(
                event.seq, "P-3", f"{definition.key}: cannot advance across missing seq {seq + 1}"
            )
        if event.is_known:
            state = definition.apply(state, event)
        seq = event.seq
    return state, seq


def _validate_view(definition: ProjectionDefinition, view: Any, seq: int | None) -> None:
    wire = definition.wire
    assert wire is not None
    try:
        wire.validate_view(view)
    except ValueError as exc:
        err = ProjectionError(seq, "P-4", f"{definition.key}: invalid view: {exc}")
        raise raised_from(err, None) from None


def _row_version_matches(definition: ProjectionDefinition, row: Any) -> bool:
    """The row exists and was written by this unit's stateVersion (strict int)."""
    if not isinstance(row, Mapping):
        return False
    ver = row.get("ver")
    return type(ver) is int and ver == definition.state_version


def _row_state(
    definition: ProjectionDefinition,
    row: Any,
    lo: int,
    hi: int,
    frozen: Callable[[Any], Any] = freeze,
) -> Any:
    """The validated, frozen state of a row usable for ``lo <= row.seq <= hi``.

    Returns ``_UNSET`` when the row is missing, of another version, outside
    the window or invalid.  The state is a frozen copy (``freeze`` copies
    plain containers), so the restored state never aliases the caller's
    checkpoint dict.
    """
    if not _row_version_matches(definition, row):
        return _UNSET
    seq = row.get("seq")
    if type(seq) is not int or not lo <= seq <= hi or "val" not in row:
        return _UNSET
    state = frozen(row["val"])
    try:
        definition.validate_state(state)
    except _BAD_DATA:
        return _UNSET
    return state


def _row(
    definition: ProjectionDefinition, seq: int, state: State, detached: bool = True
) -> CheckpointRow:
    # Not detached: a deep-frozen state is lent as it is (nobody can mutate
    # it, so P-5 holds without the copy); a plain mutable state is still
    # copied (freeze copies plain containers).
    return {
        "ver": definition.state_version,
        "seq": seq,
        "val": thaw(state) if detached else freeze(state),
    }
