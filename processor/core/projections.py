"""Domain projections — rule P (the session semantics, section 6).

A domain projection folds the log of one session into one typed state
(inbox, turn boundaries, tool history, UI state) and, optionally, a *wire
view* that the service publishes.  It never changes the model surface: that
is the job of message projections (rule M).  This module is pure: no I/O,
no clocks, no threads.

Pieces
======

* :class:`ProjectionDefinition` — one unit: ``key``, ``state_version``,
  ``init(header, inherited_event_count)``, pure synchronous
  ``apply(state, event)``, ``validate_state`` and an optional
  :class:`WireView`.
* :class:`ProjectionRegistry` — shared by many sessions; reference counted
  per key (P-2).
* :class:`SessionProjections` — the cells of one session (P-3), driven
  eagerly by :meth:`SessionProjections.on_commit` after each committed event;
  readers (P-4), checkpoints (P-5), :meth:`~SessionProjections.install` and
  :meth:`~SessionProjections.hydrate` (P-9).
* :func:`restore_floor` (P-6), :func:`restore` (P-7) and
  :func:`view_checkpoint` (P-8): checkpoint arithmetic without a session.

The rules P-1..P-10 and the decisions where the spec is silent:
``docs/projection-rules.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from processor.core.errors import ProjectionError
from processor.core.events import KNOWN_TYPES, Event
from processor.core.frozen import freeze
from processor.core.log import SessionHeader, SessionLog, inherited_event_count
from processor.core.projection_cell import _Cell
from processor.core.projection_registry import (
    _UNSET,
    Checkpoint,
    CheckpointRow,
    Listener,
    ProjectionDefinition,
    ProjectionRegistry,
    Registration,
    RestoreResult,
    Snapshot,
    State,
    WireView,
    _fold,
    _row,
    _Unit,
)
from processor.core.projection_restore import (
    restore,
    restore_floor,
    usable_rows,
    view_checkpoint,
)
from processor.core.sharing import NewestTable

#: (index into a session's ``_order``, that unit's ``apply``) per unit that may react;
#: None instead of ``apply`` for a unit with ``apply_all`` (its events are queued)
_Targets = tuple[tuple[int, Callable[[State, Event], State] | None], ...]
#: Dispatch tables shared by every session whose cells are of the same units (same
#: registry generation): a table per session was ~1.6 KB of each held session
#: (figure 6).  Keyed by the units tuple; the few newest are kept (older ones are
#: of registries gone or replaced).
_SHARED_DISPATCH: Final[NewestTable[tuple[_Unit, ...], dict[str, _Targets]]] = NewestTable(
    "dispatch", 8
)


#: ``_fast_seq`` when the fast path must be re-checked (no seq is below -1)
_NO_SEQ: Final = -2

_NO_DISPATCH: dict[str, _Targets] = {}  # before the first _prime (never written)

#: Most events an ``apply_all`` unit's queue holds before it is folded in (a
#: cell's ``pending``): the queue is bounded, and an offline log queued whole
#: until the first read was a second pass over every event after they had
#: left the cache (-12% last-level misses per event).
PENDING_MAX: Final = 256


__all__ = [
    "Checkpoint",
    "CheckpointRow",
    "Listener",
    "ProjectionDefinition",
    "ProjectionRegistry",
    "Registration",
    "RestoreResult",
    "SessionProjections",
    "Snapshot",
    "State",
    "WireView",
    "restore",
    "restore_floor",
    "view_checkpoint",
]


class SessionProjections:
    """The cells of one session, driven eagerly by every committed event.

    ``log`` is the session's :class:`SessionLog`; the session appends each
    event to it and then calls :meth:`on_commit`.  The log may be a suffix
    (``base_seq > 0``, after a checkpoint restore): cells installed from
    checkpoint rows catch up from there, while a unit without a cell needs
    the whole log and raises (P-7).
    """

    __slots__ = (
        "_cells",
        "_dispatch",
        "_drained",
        "_fast_seq",
        "_generation",
        "_listeners",
        "_order",
        "header",
        "log",
        "registry",
    )

    def __init__(
        self, registry: ProjectionRegistry, header: SessionHeader, log: SessionLog
    ) -> None:
        self.registry = registry
        self.header = header
        self.log = log
        self._cells: dict[str, _Cell] = {}
        # a tuple, () while there are none (most sessions): an empty list is 56 bytes
        self._listeners: tuple[Listener, ...] = ()
        self._drained: dict[str, Any] = {}
        self._generation = -1
        # Fast path of on_commit: every cell of ``_order`` is at ``_fast_seq``
        # (_NO_SEQ: unknown, re-check), and ``_dispatch`` maps an event type to
        # the (index in ``_order``, apply) of the units that may change on it
        # (shared by the sessions of the same units).  While it is
        # set, the cells' own ``observed_seq`` may lag: ``_flush`` writes it
        # before anything reads a cell, so the hot path does not write ten
        # watermarks per event.  Whatever replaces or moves a cell outside
        # the fast path calls ``_invalidate`` first.
        # (an int, not ``int | None``: compiled, the per-event compare and write
        # stay C integers instead of boxing the seq twice per event)
        self._fast_seq: int = _NO_SEQ
        self._dispatch: dict[str, _Targets] = _NO_DISPATCH
        self._order: list[_Cell] = []

    # ------------------------------------------------------------ driving

    def _flush(self) -> None:
        """Write the fast path's watermark into its cells (see ``__init__``).

        Cells of units with ``apply_all`` also fold their queued events here,
        once per batch of commits instead of one new state per event: every
        reader of a cell calls this first, so none sees a queued state.
        """
        seq = self._fast_seq
        if seq == _NO_SEQ:
            return
        order = self._order
        for cell in order:
            cell.observed_seq = seq
        error: BaseException | None = None
        for cell in order:
            pending = cell.pending
            if pending is None:
                continue
            cell.pending = None
            apply_all = cell.definition.apply_all
            assert apply_all is not None
            try:
                cell.state = apply_all(cell.state, pending)
            except BaseException as exc:  # a broken apply_all: the contract says it never raises
                # the cell stays before its queued events: the next read folds them
                # one by one through apply (P-3), which raises at the event itself
                cell.observed_seq = pending[0].seq - 1
                self._fast_seq = _NO_SEQ
                error = exc
        if error is not None:
            raise error

    def _invalidate(self) -> None:
        self._flush()
        self._fast_seq = _NO_SEQ

    def _sync(self) -> None:
        """Drop cells of released keys and of re-registered incarnations.

        Every reader of the cells calls this first (it also flushes the
        fast path's watermark).
        """
        self._flush()
        if self._generation == self.registry.generation:
            return
        self._invalidate()
        self._generation = self.registry.generation
        for key in list(self._cells):
            if self.registry._incarnation(key) is not self._cells[key].unit:
                del self._cells[key]

    def _new_cell(self, unit: _Unit) -> tuple[_Cell, bool]:
        """P-3: a unit without a cell folds ``init`` over the whole prefix.

        Returns the cell and whether the fold changed the state object
        relative to ``init`` (listeners hear about that change too).
        """
        definition = unit.definition
        if self.log.base_seq > 0:
            raise ProjectionError(
                self.log.base_seq,
                "P-7",
                f"{definition.key}: no cell and the retained log "
                f"starts at seq {self.log.base_seq}; re-read from seq 0",
            )
        events = self.log.events_from(0)
        initial = definition.init(self.header, inherited_event_count(events))
        state, seq = _fold(definition, initial, events, -1)
        return _Cell(unit, state, seq), state is not initial

    def _advance(self, cell: _Cell) -> bool:
        """Catch a cell up through the contiguous tail; True if the state changed."""
        end = self.log.end_seq
        if cell.observed_seq >= end:
            return False
        if cell.observed_seq + 1 < self.log.base_seq:
            raise ProjectionError(
                self.log.base_seq,
                "P-3",
                f"{cell.definition.key}: cannot advance across missing seq {cell.observed_seq + 1}",
            )
        before = cell.state
        state, seq = _fold(
            cell.definition,
            cell.state,
            self.log.events_from(cell.observed_seq + 1),
            cell.observed_seq,
        )
        cell.state, cell.observed_seq = state, seq
        return state is not before

    def materialize(self) -> None:
        """Bring every registered unit to the end of the log (P-3, P-4)."""
        self._sync()
        changed: list[_Cell] = []
        end = self.log.end_seq
        for unit in self.registry._incarnations():
            cell = self._cells.get(unit.definition.key)
            if cell is None:
                self._invalidate()
                cell, moved = self._new_cell(unit)
                self._cells[unit.definition.key] = cell
            else:
                if cell.observed_seq != end:
                    self._invalidate()
                moved = self._advance(cell)
            if moved:
                changed.append(cell)
        if changed and self._listeners:
            for cell in changed:
                view = cell.current_view() if cell.definition.wire is not None else None
                for listener in self._listeners:
                    listener(cell.definition.key, cell.state, view, cell.observed_seq)

    def on_commit(self, event: Event) -> None:
        """Drive every unit with a just-committed event (already in the log).

        Units that have no cell yet fold the whole prefix first; existing
        cells catch up through the contiguous tail (P-3).
        """
        if event.seq > self.log.end_seq or event.seq < self.log.base_seq:
            raise ProjectionError(
                event.seq,
                "P-3",
                f"on_commit: seq {event.seq} is not in the "
                f"retained log ({self.log.base_seq}..{self.log.end_seq}); "
                "append it to the log first",
            )
        if event.seq != self.log.end_seq or not self._apply_next(event):
            self.materialize()

    def on_append(self, event: Event) -> None:
        """:meth:`on_commit` for the event the caller has just appended as the log's last.

        The session's own hot path: the log checks were made by the append.
        """
        if not self._apply_next(event):
            self.materialize()

    def _apply_next(self, event: Event) -> bool:
        """Fast path of :meth:`materialize` for the last event of the log (P-3 unchanged).

        When no registration changed and every unit already has a cell at
        ``event.seq - 1``, catching up is exactly one ``apply`` per unit that
        may react to the event's type (the others would return the same
        object by P-1, so skipping them is the same fold).  Unknown
        (ignorable) types have no targets: they only advance the watermark.
        """
        seq = event.seq
        stale = self._fast_seq != seq - 1 or self._generation != self.registry.generation
        if stale and not self._prime(seq - 1):
            return False
        targets = self._dispatch.get(event.type)
        if targets is None:
            targets = self._targets(event.type)
        if not targets:  # no unit reacts to this type: only the watermark moves
            self._fast_seq = seq
            return True
        changed: list[_Cell] | None = None
        cell = None
        full = False  # a queue reached PENDING_MAX: fold the queues in now
        order = self._order
        try:
            if not self._listeners:
                # nobody to tell about identity changes (P-1): no list of them,
                # and the units with apply_all take their events in one call
                # when the cell is next read (_flush)
                for index, apply in targets:
                    cell = order[index]
                    if apply is None:
                        pending = cell.pending
                        if pending is None:
                            cell.pending = [event]
                        else:
                            pending.append(event)
                            if len(pending) >= PENDING_MAX:
                                full = True
                    else:
                        cell.state = apply(cell.state, event)
            else:
                # (add_listener flushed every queue: listeners hear each event)
                for index, apply in targets:
                    cell = order[index]
                    before = cell.state
                    after = (apply or cell.definition.apply)(before, event)
                    if after is not before:
                        cell.state = after
                        if changed is None:
                            changed = [cell]
                        else:
                            changed.append(cell)
        except BaseException:
            self._fail_at(cell, seq)
            raise
        self._fast_seq = seq
        if changed is not None:
            self._flush()
            self._notify(changed)
        elif full:
            self._flush()  # what the next read would do, on events still in cache
        return True

    def _fail_at(self, failed: _Cell | None, seq: int) -> None:
        """An ``apply`` raised: cells before it in order advance, it and later ones stay.

        That is what one unit after the other would have left (each unit's
        catch-up is all-or-nothing); the fast path is re-checked next time.
        """
        self._invalidate()
        if failed is None:  # interrupted before any apply ran: nothing moved
            return
        for cell in self._order:
            if cell is failed:
                break
            cell.observed_seq = seq

    def _prime(self, prev: int) -> bool:
        """Check that every registered unit has its cell at ``prev`` (fast path usable)."""
        self._invalidate()
        if self._generation != self.registry.generation:
            return False
        units = self.registry._incarnations()
        cells = self._cells
        if len(cells) != len(units):
            return False
        order: list[_Cell] = []
        for unit in units:
            cell = cells.get(unit.definition.key)
            if cell is None or cell.unit is not unit or cell.observed_seq != prev:
                return False
            order.append(cell)
        self._order = order
        self._dispatch = _SHARED_DISPATCH.get(tuple(units), {})
        self._fast_seq = prev
        return True

    def _targets(self, etype: str) -> _Targets:
        """(index, apply) of the units that may react to ``etype``, in registration order.

        Only known types are remembered: an ignorable type is any string the
        input chooses, and the table is shared process-wide (one entry per
        distinct unknown type would grow it without bound)."""
        if etype not in KNOWN_TYPES:
            return ()
        targets = tuple(
            (index, cell.definition.apply if cell.definition.apply_all is None else None)
            for index, cell in enumerate(self._order)
            if cell.definition.event_types is None or etype in cell.definition.event_types
        )
        self._dispatch[etype] = targets
        return targets

    def _notify(self, changed: list[_Cell]) -> None:
        for cell in changed:
            view = cell.current_view() if cell.definition.wire is not None else None
            for listener in self._listeners:
                listener(cell.definition.key, cell.state, view, cell.observed_seq)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(key, state, view, seq)`` on an identity change (P-1).

        Returns a function that removes the listener.
        """
        self._flush()  # fold queued events first: from now on each event is heard
        self._listeners = (*self._listeners, listener)

        def remove() -> None:
            listeners = list(self._listeners)
            if listener in listeners:
                listeners.remove(listener)
                self._listeners = tuple(listeners)

        return remove

    # ------------------------------------------------------------ reading

    def state_of(self, key: str) -> State:
        """P-4: live state at the end of the log (None for an unknown key)."""
        self.materialize()
        cell = self._cells.get(key)
        return cell.state if cell is not None else None

    def view_of(self, key: str) -> Any:
        """The validated view of one wire unit at the log end (None if absent)."""
        self.materialize()
        cell = self._cells.get(key)
        if cell is None or cell.definition.wire is None:
            return None
        return cell.validated_view()

    def observed_seq(self, key: str) -> int | None:
        """The watermark of an existing cell (never folds); None without a cell."""
        self._sync()
        cell = self._cells.get(key)
        return cell.observed_seq if cell is not None else None

    def views_of(self, key: str) -> tuple[Any, Any] | None:
        """``(previous, current)`` view of an existing wire cell (never folds)."""
        self._sync()
        cell = self._cells.get(key)
        if cell is None or cell.definition.wire is None:
            return None
        current = cell.current_view()
        return cell.prev_view, current

    def wire_keys(self) -> list[str]:
        return [d.key for d in self.registry.definitions() if d.wire is not None]

    def snapshot(self, keys: Iterable[str] | None = None) -> Snapshot:
        """P-4: materialize all, then validated views of the wire units.

        ``keys`` restricts the values (unknown or non-wire keys are absent);
        every unit is materialized anyway so the cut is consistent.
        """
        self.materialize()
        wanted = None if keys is None else set(keys)
        values: dict[str, Any] = {}
        for definition in self.registry.definitions():
            if definition.wire is None or (wanted is not None and definition.key not in wanted):
                continue
            values[definition.key] = self._cells[definition.key].validated_view()
        return Snapshot(self.log.end_seq, values)

    def cached_snapshot(self) -> Snapshot | None:
        """P-4: never folds; existing wire cells only; the lowest watermark.

        A hint, not a baseline: cells may be at different watermarks.  None
        when no wire cell exists.
        """
        self._sync()
        cells = [c for c in self._cells.values() if c.definition.wire is not None]
        if not cells:
            return None
        return Snapshot(
            min(c.observed_seq for c in cells),
            {c.definition.key: c.validated_view() for c in cells},
        )

    def drain_view_changes(self) -> dict[str, tuple[Any, int]]:
        """Wire views whose identity changed since the last drain.

        ``{key: (view, observed_seq)}`` for a runner that publishes coalesced
        changes after a batch of commits: a view that is the same object as
        the one drained last time is unchanged and not returned (P-1).  A
        released key is simply no longer returned (check the registry for
        removals); a re-registered key reports its fresh view.
        """
        self.materialize()
        out: dict[str, tuple[Any, int]] = {}
        for key, cell in self._cells.items():
            if cell.definition.wire is None:
                continue
            view = cell.validated_view()
            if self._drained.get(key, _UNSET) is not view:
                self._drained[key] = view
                out[key] = (view, cell.observed_seq)
        for key in [k for k in self._drained if k not in self._cells]:
            del self._drained[key]
        return out

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, *, detached: bool = True) -> Checkpoint:
        """P-5: ``{key: {ver, seq, val}}`` for every unit.

        ``val`` is a mutable deep copy (thawed); with ``detached=False`` it is
        frozen instead, and a deep-frozen state is not copied at all (for a
        caller that only encodes the rows, e.g. the service's checkpoint).
        """
        self.materialize()
        return {
            d.key: _row(d, self._cells[d.key].observed_seq, self._cells[d.key].state, detached)
            for d in self.registry.definitions()
        }

    def install(
        self,
        rows: Mapping[str, Any],
        last_seq: int | None = None,
        frozen: Callable[[Any], Any] = freeze,
    ) -> None:
        """Adopt checkpoint rows as cells (restoring a session without its prefix).

        Every registered unit needs a usable row: version matches, the state
        validates and its ``seq`` lies in ``base_seq - 1 .. end_seq`` of the
        retained log (so the cell can catch up through the tail without the
        prefix); with ``last_seq`` the row must be exactly at it.  Otherwise
        nothing is installed and a :class:`ProjectionError` (P-7) asks to
        re-read from seq 0.  The cell watermark is the row's seq.  A cell
        that already exists and is not behind the row is kept (never moved
        back, as in P-9).
        """
        self._sync()
        lo, hi = self.log.base_seq - 1, self.log.end_seq
        if last_seq is not None:
            if not lo <= last_seq <= hi:
                raise ProjectionError(
                    last_seq,
                    "P-7",
                    f"install at seq {last_seq}: the "
                    f"retained log covers {lo + 1}..{hi}; re-read from seq 0",
                )
            lo = hi = last_seq
        staged = usable_rows(self.registry._incarnations(), rows, lo, hi, last_seq, frozen)
        for unit, state, seq in staged:
            cell = self._cells.get(unit.definition.key)
            if cell is None or cell.observed_seq < seq:
                self._invalidate()
                self._cells[unit.definition.key] = _Cell(unit, state, seq)

    def hydrate(self, cp: Mapping[str, Any], events: Sequence[Event], base_seq: int) -> Snapshot:
        """P-9: view the cells when all are at endSeq; else restore and install.

        ``events`` start at ``base_seq`` (the restore floor, P-6).  When every
        registered unit already has a cell exactly at endSeq their views are
        returned without folding.  Otherwise :func:`restore` runs and its rows
        are installed for units whose cell is missing or behind endSeq; a
        cell ahead of endSeq is kept (never moved back).  The returned
        snapshot is at endSeq.
        """
        end = events[-1].seq if events else base_seq - 1
        self._sync()
        units = self.registry._incarnations()
        cells = [self._cells.get(u.definition.key) for u in units]
        if units and all(c is not None and c.observed_seq == end for c in cells):
            return Snapshot(
                end,
                {
                    c.definition.key: c.validated_view()
                    for c in cells
                    if c is not None and c.definition.wire is not None
                },
            )
        result = restore(self.registry, self.header, cp, events, base_seq)
        for unit, cell in zip(units, cells, strict=True):
            row = result.rows[unit.definition.key]
            if cell is None or cell.observed_seq < row["seq"]:
                self._invalidate()
                self._cells[unit.definition.key] = _Cell(unit, freeze(row["val"]), row["seq"])
        return result.snapshot
