"""Offline folding of session files: what ``processor fold`` prints.

``fold_file`` is the library form of the command, so tests and the demo's
cross-check use exactly what users run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from processor.core.builtin import default_registry
from processor.core.defaults import fold_session, session_from_checkpoint
from processor.core.errors import SessionError
from processor.core.events import Event
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionRegistry, restore, restore_floor
from processor.core.session import Session
from processor.files import read_session_file


@dataclass(frozen=True, slots=True)
class FoldResult:
    output: dict[str, Any]
    session: Session

    @property
    def session_checkpoint(self) -> dict[str, Any]:
        """The full session checkpoint (surface + rows), built when asked.

        ``processor fold`` prints only ``output``; encoding every surface
        node for a checkpoint nobody writes was wasted work per event.
        """
        return self.session.checkpoint()


def session_output(
    session: Session,
    rows: Mapping[str, Any] | None = None,
    projections: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document ``processor fold`` prints for a folded session."""
    snap = session.projections.snapshot()
    return {
        "asOfSeq": session.last_seq,
        "surface": session.surface_view(),
        "messages": session.derive_messages(),
        "transcript": session.transcript(),
        "projections": dict(projections if projections is not None else snap.values),
        "checkpoint": dict(rows if rows is not None else session.projections.checkpoint()),
    }


def fold_events(
    events: Sequence[Event], header: SessionHeader | None = None, dialect: int | None = None
) -> Session:
    return fold_session(events, header, dialect=dialect)


def _restore_rows(
    session_events: Sequence[Event],
    header: SessionHeader,
    rows: Mapping[str, Any],
    registry: ProjectionRegistry,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """P-6/P-7: restore projection rows from their floor over the log tail."""
    floor = restore_floor(registry, rows)
    if floor is None:
        return {}, {}
    end = session_events[-1].seq if session_events else -1
    if floor > end + 1:
        raise SessionError(
            floor,
            "P-7",
            f"checkpoint needs seq {floor}, but the log ends at "
            f"{end}: the log was shortened below the checkpoint",
        )
    tail = [e for e in session_events if e.seq >= floor]
    result = restore(registry, header, rows, tail, floor)
    return dict(result.snapshot.values), dict(result.rows)


def fold_file(
    path: str | Path,
    *,
    at_seq: int | None = None,
    checkpoint_path: str | Path | None = None,
    drop_torn_tail: bool = False,
) -> FoldResult:
    """Fold a session file (optionally a prefix, optionally from a checkpoint)."""
    file = read_session_file(path, drop_torn_tail=drop_torn_tail, stop_after_seq=at_seq)
    events = file.events if at_seq is None else [e for e in file.events if e.seq <= at_seq]
    if checkpoint_path is None:
        session = fold_events(events, file.header, file.dialect)
        return FoldResult(session_output(session), session)
    raw = orjson.loads(Path(checkpoint_path).read_bytes())
    if isinstance(raw, dict) and "surface" in raw and "lastSeq" in raw:
        session = restore_session(raw, events, file.header, file.dialect)
        return FoldResult(session_output(session), session)
    rows = raw["checkpoint"] if isinstance(raw, dict) and "asOfSeq" in raw else raw
    registry = default_registry()
    session = fold_session(
        events, file.header, projections=ProjectionRegistry(), dialect=file.dialect
    )
    values, fresh_rows = _restore_rows(events, file.header, rows, registry)
    return FoldResult(session_output(session, fresh_rows, values), session)


def restore_session(
    checkpoint: Mapping[str, Any],
    events: Sequence[Event],
    header: SessionHeader | None = None,
    dialect: int | None = None,
) -> Session:
    """Continue a session checkpoint over the log, proving the anchor first."""
    session = session_from_checkpoint(checkpoint, header, dialect=dialect)
    last = session.last_seq
    by_seq = {e.seq: e for e in events}
    anchor = by_seq.get(last) if last >= 0 else None
    if last >= 0 and (anchor is None or not session.matches_anchor(checkpoint, anchor)):
        raise SessionError(
            last,
            "P-6",
            "checkpoint anchor event is missing or different in this log; re-read from seq 0",
        )
    session.extend(e for e in events if e.seq > last)
    return session
