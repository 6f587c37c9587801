"""Checkpoint arithmetic without a session (P-5..P-7): how far back a restore
must read, restoring the units from rows plus a tail, and the views a
checkpoint implies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from processor.core.errors import ProjectionError
from processor.core.events import Event
from processor.core.frozen import freeze
from processor.core.log import SessionHeader, inherited_event_count
from processor.core.projection_registry import (
    _BAD_DATA,
    _UNSET,
    Checkpoint,
    ProjectionRegistry,
    RestoreResult,
    Snapshot,
    State,
    _fold,
    _row,
    _row_state,
    _row_version_matches,
    _Unit,
    _validate_view,
)


def restore_floor(registry: ProjectionRegistry, cp: Mapping[str, Any]) -> int | None:
    """P-6: the first seq to re-read, one event below the lowest need (the anchor).

    need = row.seq + 1 when the row exists with the right ``ver``, else 0;
    floor = max(min(need) - 1, 0); None when no unit is registered.  Reading
    one event below lets :func:`restore` prove the stored log still reaches
    the watermark instead of trusting a checkpoint of a log that was
    shortened: the anchor event must be there, or the rows fall outside the
    events and are refused.
    """
    definitions = registry.definitions()
    if not definitions:
        return None
    needs: list[int] = []
    for definition in definitions:
        row: Any = cp.get(definition.key)
        seq = row.get("seq") if isinstance(row, Mapping) else None
        ok = _row_version_matches(definition, row) and type(seq) is int and seq >= -1
        needs.append(seq + 1 if ok and seq is not None else 0)
    return max(min(needs) - 1, 0)


def restore(
    registry: ProjectionRegistry,
    header: SessionHeader,
    cp: Mapping[str, Any],
    events: Sequence[Event],
    base_seq: int,
) -> RestoreResult:
    """P-7: rebuild every unit at endSeq from its row (or ``init``) plus events.

    ``events`` are the stored log from ``base_seq`` (contiguous); endSeq is
    the last event's seq, or ``base_seq - 1`` without events.  A row is
    usable when its ``ver`` matches, ``base_seq - 1 <= row.seq <= endSeq``
    and its ``val`` passes ``validate_state``.  An unusable row is refused
    when ``base_seq > 0`` ("re-read from seq 0": the prefix is not here);
    with ``base_seq == 0`` the unit folds from ``init``.  Returns the
    validated snapshot and fresh rows, both at endSeq.  Nothing in ``cp`` is
    aliased by the result.
    """
    if base_seq < 0:
        raise ValueError("base_seq must be >= 0")
    for i, event in enumerate(events):
        if event.seq != base_seq + i:
            raise ProjectionError(
                event.seq, "P-3", f"restore: cannot advance across missing seq {base_seq + i}"
            )
    end = events[-1].seq if events else base_seq - 1
    inherited: int | None = None
    values: dict[str, Any] = {}
    rows: Checkpoint = {}
    for definition in registry.definitions():
        row: Any = cp.get(definition.key)
        state = _row_state(definition, row, base_seq - 1, end)
        if state is _UNSET:
            if base_seq > 0:
                raise ProjectionError(
                    base_seq,
                    "P-7",
                    f"{definition.key}: checkpoint row is missing, of another "
                    f"stateVersion, invalid or outside seq {base_seq - 1}..{end}, and the "
                    f"events start at seq {base_seq}; re-read from seq 0",
                )
            if inherited is None:
                inherited = inherited_event_count(events)
            state, after = definition.init(header, inherited), -1
        else:
            after = row["seq"]
        state, seq = _fold(definition, state, events, after)
        assert seq == end
        rows[definition.key] = _row(definition, end, state)
        if definition.wire is not None:
            view = definition.wire.view(state)
            _validate_view(definition, view, end)
            values[definition.key] = view
    return RestoreResult(Snapshot(end, values), rows)


def view_checkpoint(registry: ProjectionRegistry, cp: Mapping[str, Any]) -> dict[str, Any]:
    """P-8: zero-I/O views of rows whose ``ver`` matches and whose ``val`` validates.

    Bad rows (missing, other version, invalid state or view) are absent:
    this is a best-effort render of stored data, never an error.
    """
    out: dict[str, Any] = {}
    for definition in registry.definitions():
        wire = definition.wire
        row: Any = cp.get(definition.key)
        if wire is None or not _row_version_matches(definition, row) or "val" not in row:
            continue
        state = freeze(row["val"])
        try:
            definition.validate_state(state)
            view = wire.view(state)
            wire.validate_view(view)
        except _BAD_DATA:
            continue
        out[definition.key] = view
    return out


def usable_rows(
    units: Sequence[_Unit],
    rows: Mapping[str, Any],
    lo: int,
    hi: int,
    last_seq: int | None,
    frozen: Callable[[Any], Any],
) -> list[tuple[_Unit, State, int]]:
    """P-7: each unit's checkpoint row as ``(unit, state, seq)``, all usable
    (version matches, the state validates, ``seq`` in ``lo..hi``) or
    :class:`ProjectionError`, which asks to re-read from seq 0."""
    staged: list[tuple[_Unit, State, int]] = []
    for unit in units:
        definition = unit.definition
        row: Any = rows.get(definition.key)
        state = _row_state(definition, row, lo, hi, frozen)
        if state is _UNSET:
            raise ProjectionError(
                last_seq,
                "P-7",
                f"{definition.key}: checkpoint row is missing, of another "
                f"stateVersion, invalid or outside seq {lo}..{hi}; re-read from seq 0",
            )
        staged.append((unit, state, row["seq"]))
    return staged
