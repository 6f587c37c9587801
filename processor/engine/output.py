"""What a changed session publishes: its changed views, then its checkpoint.

Views are coalesced (one record per session and view per batch, only those
whose value changed, ``SessionRuntime.view_changes``); a view too large for
one record is split into parts, written parts first and head last, so a
reader that sees the head has every part.  Parts a shrunk view no longer
has are tombstoned, so a compacted topic does not keep them forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from processor.codec import (
    Anchor,
    Checkpoint,
    Codec,
    View,
    session_key,
    split_view,
    stale_part_keys,
    view_key,
)
from processor.config import ServiceConfig
from processor.core.session import CHECKPOINT_VERSION
from processor.engine.records import Out, Tally
from processor.engine.runtime import SessionRuntime, ViewChange


def checkpoint_of(rt: SessionRuntime) -> Checkpoint:
    """The checkpoint record of a session: the core's state, the service's, the anchor."""
    session = rt.session
    core = session.checkpoint(detached=False)  # encoded at once: no thawed copy (issue 15)
    rows = core.pop("rows")
    digest = session.last_digest
    return Checkpoint(
        session_id=rt.session_id,
        last_seq=session.last_seq,
        anchor=Anchor(
            rt.partition, rt.last_offset, session.last_seq, bytes.fromhex(digest) if digest else b""
        ),
        rows=rows,
        surface={"core": core, "service": rt.service_state(), "header": session.header},
        core_version=CHECKPOINT_VERSION,
    )


def session_output(
    rt: SessionRuntime,
    changes: Iterable[ViewChange],
    view_parts: dict[tuple[str, str], int],
    *,
    config: ServiceConfig,
    codec: Codec,
    tally: Tally,
) -> Iterator[Out]:
    """The records of ``changes`` and the session's checkpoint, in produce order.

    ``view_parts``: (session, view) -> parts last published, updated here.
    """
    views, partition, sid = config.topics.views, rt.partition, rt.session_id
    as_of = rt.last_seq
    for change in changes:
        ident = (sid, change.name)
        old_parts = view_parts.get(ident, 1)
        if change.removed:
            for k in stale_part_keys(sid, change.name, old_parts, 0):
                yield Out(views, partition, k, None)
            view_parts.pop(ident, None)
            continue
        records = split_view(
            View.of(sid, change.name, as_of, change.state_version, change.value),
            config.max_view_bytes,
        )
        for k in stale_part_keys(sid, change.name, old_parts, len(records)):
            yield Out(views, partition, k, None)
        for record in sorted(records, key=lambda r: -r.part):  # parts first, head last
            yield Out(
                views, partition, view_key(sid, change.name, record.part), codec.encode_view(record)
            )
        view_parts[ident] = len(records)
        tally.views_published += len(records)
    yield Out(
        config.topics.checkpoints,
        partition,
        session_key(sid),
        codec.encode_checkpoint(checkpoint_of(rt)),
    )
    tally.checkpoints_published += 1
