"""Domain projections — rule P.

A domain projection folds the log into one typed state per session (inbox,
turn boundaries, tool history, UI state).  It never changes the model
surface.  The registry is shared by many sessions; each session keeps one
*cell* per unit with the state and its ``observedSeq`` watermark.

P-10: ``stateVersion`` versions one unit's fold semantics and state shape —
the cache key of its checkpoint rows — not the session format.  Bumping it
makes old rows unusable and forces a refold from the log; a checkpoint is a
cache and never replaces the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processor.core.errors import ProjectionError
from processor.core.events import Event
from processor.core.frozen import freeze, thaw
from processor.core.log import SessionHeader, SessionLog, inherited_event_count

State = Any
Listener = Callable[[str, Any, Any, int], None]


@dataclass(frozen=True, slots=True)
class WireView:
    """How a unit is published: ``view(state)`` and a validator of the view."""

    view: Callable[[State], Any]
    validate_view: Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class ProjectionDefinition:
    """One domain projection unit (see the module docstring).

    ``apply`` must be pure and synchronous and return the *same object* when
    the event is irrelevant (P-1); state is plain JSON and a state-carrying
    event carries the complete post-change value, never a delta.
    """

    key: str
    state_version: int
    init: Callable[[SessionHeader, int], State]
    apply: Callable[[State, Event], State]
    validate_state: Callable[[State], None]
    wire: WireView | None = None

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("projection key must be non-empty")
        if type(self.state_version) is not int or self.state_version < 0:
            raise ValueError(f"{self.key}: stateVersion must be a non-negative integer")


class Registration:
    """Handle returned by :meth:`ProjectionRegistry.register`; release once."""

    __slots__ = ("_key", "_registry", "released")

    def __init__(self, registry: ProjectionRegistry, key: str) -> None:
        self._registry = registry
        self._key = key
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._registry._release(self._key)


class ProjectionRegistry:
    """P-2: definitions by key, reference counted per registrant.

    Same key + same stateVersion adds a reference and keeps the first
    definition (later ones are not compared: registrants must agree on the
    semantics of a key/version themselves); a different stateVersion is
    refused; the key disappears when its last registrant leaves.
    """

    __slots__ = ("_defs", "_refs", "generation")

    def __init__(self) -> None:
        self._defs: dict[str, ProjectionDefinition] = {}
        self._refs: dict[str, int] = {}
        #: bumped on every change of the key set, so sessions notice
        self.generation = 0

    def register(self, definition: ProjectionDefinition) -> Registration:
        current = self._defs.get(definition.key)
        if current is not None:
            if current.state_version != definition.state_version:
                raise ProjectionError(
                    None, "P-2", f"projection {definition.key!r} is registered with "
                    f"stateVersion {current.state_version}; refusing stateVersion "
                    f"{definition.state_version}")
            self._refs[definition.key] += 1
        else:
            self._defs[definition.key] = definition
            self._refs[definition.key] = 1
            self.generation += 1
        return Registration(self, definition.key)

    def _release(self, key: str) -> None:
        refs = self._refs.get(key, 0) - 1
        if refs > 0:
            self._refs[key] = refs
            return
        self._refs.pop(key, None)
        self._defs.pop(key, None)
        self.generation += 1

    def get(self, key: str) -> ProjectionDefinition | None:
        return self._defs.get(key)

    def refs(self, key: str) -> int:
        return self._refs.get(key, 0)

    def definitions(self) -> list[ProjectionDefinition]:
        return list(self._defs.values())

    def __contains__(self, key: object) -> bool:
        return key in self._defs


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Views of wire units at one consistent cut ``as_of_seq``."""

    as_of_seq: int
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    snapshot: Snapshot
    rows: Mapping[str, Any]


class _Cell:
    __slots__ = ("definition", "observed_seq", "prev_view", "state", "view", "view_state")

    def __init__(self, definition: ProjectionDefinition, state: State, observed_seq: int) -> None:
        self.definition = definition
        self.state = state
        self.observed_seq = observed_seq
        self.view_state: Any = _UNSET  # the state object `view` was computed from
        self.view: Any = None
        self.prev_view: Any = None

    def current_view(self) -> Any:
        """P-1: recompute the view only when the state object changed."""
        wire = self.definition.wire
        assert wire is not None
        if self.view_state is not self.state:
            view = wire.view(self.state)
            if view is not self.view:
                self.prev_view, self.view = self.view, view
            self.view_state = self.state
        return self.view


_UNSET: Any = object()


def _fold(definition: ProjectionDefinition, state: State, events: Iterable[Event],
          after_seq: int) -> tuple[State, int]:
    """Apply events with seq > after_seq, checking contiguity (P-3)."""
    seq = after_seq
    for event in events:
        if event.seq <= seq:
            continue
        if event.seq != seq + 1:
            raise ProjectionError(event.seq, "P-3", f"{definition.key}: cannot advance "
                                  f"across missing seq {seq + 1}")
        if event.is_known:  # ignorable unknown events advance the watermark only
            state = definition.apply(state, event)
        seq = event.seq
    return state, seq


class SessionProjections:
    """The cells of one session, driven eagerly by every committed event."""

    __slots__ = ("_cells", "_drained", "_generation", "_listeners", "header", "log", "registry")

    def __init__(self, registry: ProjectionRegistry, header: SessionHeader,
                 log: SessionLog) -> None:
        self.registry = registry
        self.header = header
        self.log = log
        self._cells: dict[str, _Cell] = {}
        self._listeners: list[Listener] = []
        self._drained: dict[str, Any] = {}
        self._generation = -1

    # ------------------------------------------------------------ driving

    def _sync_definitions(self) -> None:
        """Drop cells of released keys; a re-registered key starts over."""
        if self._generation == self.registry.generation:
            return
        self._generation = self.registry.generation
        for key in list(self._cells):
            if self.registry.get(key) is not self._cells[key].definition:
                del self._cells[key]

    def _new_cell(self, definition: ProjectionDefinition) -> _Cell:
        """P-3: a unit without a cell folds init over the whole prefix."""
        if self.log.base_seq > 0:
            raise ProjectionError(
                self.log.base_seq, "P-7", f"{definition.key}: no cell and the log starts at "
                f"seq {self.log.base_seq}; re-read from seq 0")
        events = self.log.events_from(0)
        state = definition.init(self.header, inherited_event_count(events))
        state, seq = _fold(definition, state, events, -1)
        return _Cell(definition, state, seq)

    def _advance(self, cell: _Cell) -> None:
        end = self.log.end_seq
        if cell.observed_seq >= end:
            return
        if cell.observed_seq + 1 < self.log.base_seq:
            raise ProjectionError(self.log.base_seq, "P-3", f"{cell.definition.key}: cannot "
                                  f"advance across missing seq {cell.observed_seq + 1}")
        before = cell.state
        cell.state, cell.observed_seq = _fold(cell.definition, cell.state,
                                              self.log.events_from(cell.observed_seq + 1),
                                              cell.observed_seq)
        if cell.state is not before and self._listeners:
            view = cell.current_view() if cell.definition.wire is not None else None
            for listener in list(self._listeners):
                listener(cell.definition.key, cell.state, view, cell.observed_seq)

    def materialize(self) -> None:
        """Bring every registered unit to the end of the log."""
        self._sync_definitions()
        for definition in self.registry.definitions():
            cell = self._cells.get(definition.key)
            if cell is None:
                self._cells[definition.key] = self._new_cell(definition)
            else:
                self._advance(cell)

    def on_commit(self, event: Event) -> None:
        """Drive every unit with a just-committed event (already in the log)."""
        self.materialize()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Called on an identity change of a unit's state (P-1); returns a remover."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    # ------------------------------------------------------------ reading

    def state_of(self, key: str) -> State | None:
        """P-4: live state at the end of the log (None for an unknown key)."""
        self.materialize()
        cell = self._cells.get(key)
        return cell.state if cell is not None else None

    def view_of(self, key: str) -> Any:
        """The current (validated) view of one wire unit at the log end, or None."""
        self.materialize()
        cell = self._cells.get(key)
        if cell is None or cell.definition.wire is None:
            return None
        view = cell.current_view()
        _validate_view(cell.definition, view, cell.observed_seq)
        return view

    def observed_seq(self, key: str) -> int | None:
        cell = self._cells.get(key)
        return cell.observed_seq if cell is not None else None

    def wire_keys(self) -> list[str]:
        return [d.key for d in self.registry.definitions() if d.wire is not None]

    def snapshot(self, keys: Sequence[str] | None = None) -> Snapshot:
        """P-4: materialize all, then validated views of the wire units."""
        self.materialize()
        values: dict[str, Any] = {}
        for definition in self.registry.definitions():
            if definition.wire is None or (keys is not None and definition.key not in keys):
                continue
            view = self._cells[definition.key].current_view()
            _validate_view(definition, view, self.log.end_seq)
            values[definition.key] = view
        return Snapshot(self.log.end_seq, values)

    def cached_snapshot(self) -> Snapshot | None:
        """P-4: never folds; existing wire cells only; lowest watermark; a hint."""
        self._sync_definitions()
        cells = [c for c in self._cells.values() if c.definition.wire is not None]
        if not cells:
            return None
        return Snapshot(min(c.observed_seq for c in cells),
                        {c.definition.key: c.current_view() for c in cells})

    def drain_view_changes(self) -> dict[str, tuple[Any, int]]:
        """Wire views whose identity changed since the last drain (for publishing)."""
        self.materialize()
        out: dict[str, tuple[Any, int]] = {}
        for key, cell in self._cells.items():
            if cell.definition.wire is None:
                continue
            view = cell.current_view()
            if self._drained.get(key, _UNSET) is not view:
                _validate_view(cell.definition, view, cell.observed_seq)
                self._drained[key] = view
                out[key] = (view, cell.observed_seq)
        for key in [k for k in self._drained if k not in self._cells]:
            del self._drained[key]
        return out

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self) -> dict[str, dict[str, Any]]:
        """P-5: ``{key: {ver, seq, val}}`` for every unit, ``val`` detached."""
        self.materialize()
        return {key: {"ver": c.definition.state_version, "seq": c.observed_seq,
                      "val": thaw(c.state)} for key, c in self._cells.items()}

    def install(self, rows: Mapping[str, Any], last_seq: int) -> None:
        """Adopt rows at ``last_seq`` for a session whose log starts after it.

        Every registered unit needs a usable row (ver matches, seq ==
        last_seq, valid state); otherwise the prefix is needed (P-7).
        """
        self._sync_definitions()
        for definition in self.registry.definitions():
            state = _usable_row(definition, rows.get(definition.key), last_seq, last_seq)
            if state is _UNSET:
                raise ProjectionError(
                    None, "P-7", f"{definition.key}: checkpoint row missing, stale or of "
                    f"another stateVersion; re-read from seq 0")
            self._cells[definition.key] = _Cell(definition, state, last_seq)

    def hydrate(self, cp: Mapping[str, Any], events: Sequence[Event],
                base_seq: int) -> Snapshot:
        """P-9: view cells already at endSeq; otherwise restore and install.

        A cell is never moved back: one ahead of the restored seq is kept.
        """
        end = events[-1].seq if events else base_seq - 1
        self._sync_definitions()
        defs = self.registry.definitions()
        if defs and all(k.key in self._cells and self._cells[k.key].observed_seq >= end
                        for k in defs):
            return Snapshot(end, {d.key: self._cells[d.key].current_view() for d in defs
                                  if d.wire is not None})
        result = restore(self.registry, self.header, cp, events, base_seq)
        for definition in defs:
            cell = self._cells.get(definition.key)
            row = result.rows[definition.key]
            if cell is None or cell.observed_seq < row["seq"]:
                self._cells[definition.key] = _Cell(definition, freeze(row["val"]), row["seq"])
        return result.snapshot


def _validate_view(definition: ProjectionDefinition, view: Any, seq: int) -> None:
    assert definition.wire is not None
    try:
        definition.wire.validate_view(view)
    except ValueError as exc:
        raise ProjectionError(seq, "P-4", f"{definition.key}: invalid view: {exc}") from None


def _usable_row(definition: ProjectionDefinition, row: Any, lo: int, hi: int) -> Any:
    """The row's state when it is usable for seqs lo..hi, else ``_UNSET``."""
    if not isinstance(row, Mapping) or row.get("ver") != definition.state_version:
        return _UNSET
    seq = row.get("seq")
    if type(seq) is not int or not lo <= seq <= hi:
        return _UNSET
    state = freeze(row.get("val"))
    try:
        definition.validate_state(state)
    except ValueError:
        return _UNSET
    return state


def restore_floor(registry: ProjectionRegistry, cp: Mapping[str, Any]) -> int | None:
    """P-6: the first seq to re-read, one event below the lowest need (the anchor).

    need = row.seq + 1 when the row exists with the right ver, else 0;
    floor = max(min(need) - 1, 0); None when no unit is registered.  Reading
    one event below lets restore prove the stored log still reaches the
    watermark instead of trusting a checkpoint of a log that was shortened.
    """
    defs = registry.definitions()
    if not defs:
        return None
    needs = []
    for definition in defs:
        row = cp.get(definition.key)
        ok = isinstance(row, Mapping) and row.get("ver") == definition.state_version and (
            type(row.get("seq")) is int)
        needs.append(row["seq"] + 1 if ok else 0)  # type: ignore[index]
    return max(min(needs) - 1, 0)


def restore(registry: ProjectionRegistry, header: SessionHeader, cp: Mapping[str, Any],
            events: Sequence[Event], base_seq: int) -> RestoreResult:
    """P-7: rebuild every unit at endSeq from its row (or init) plus events."""
    end = events[-1].seq if events else base_seq - 1
    if events and events[0].seq != base_seq:
        raise ProjectionError(events[0].seq, "P-7", f"restore events start at seq "
                              f"{events[0].seq}, expected base seq {base_seq}")
    values: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    for definition in registry.definitions():
        state = _usable_row(definition, cp.get(definition.key), base_seq - 1, end)
        if state is _UNSET:
            if base_seq > 0:
                raise ProjectionError(
                    base_seq, "P-7", f"{definition.key}: checkpoint row is unusable and the "
                    f"events start at seq {base_seq}; re-read from seq 0")
            after = -1
            state = definition.init(header, inherited_event_count(events))
        else:
            after = cp[definition.key]["seq"]
        state, seq = _fold(definition, state, events, after)
        if seq != end:
            raise ProjectionError(end, "P-7", f"{definition.key}: restore reached seq {seq}, "
                                  f"not the log end {end}")
        rows[definition.key] = {"ver": definition.state_version, "seq": end,
                                "val": thaw(state)}
        if definition.wire is not None:
            view = definition.wire.view(state)
            _validate_view(definition, view, end)
            values[definition.key] = view
    return RestoreResult(Snapshot(end, values), rows)


def view_checkpoint(registry: ProjectionRegistry, cp: Mapping[str, Any]) -> dict[str, Any]:
    """P-8: zero-I/O views of rows whose ver matches and whose val validates."""
    out: dict[str, Any] = {}
    for definition in registry.definitions():
        if definition.wire is None:
            continue
        row = cp.get(definition.key)
        if not isinstance(row, Mapping) or row.get("ver") != definition.state_version:
            continue
        state = freeze(row.get("val"))
        try:
            definition.validate_state(state)
            view = definition.wire.view(state)
            definition.wire.validate_view(view)
        except ValueError:
            continue
        out[definition.key] = view
    return out
