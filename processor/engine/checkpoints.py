"""The checkpoints a partition restores from, out of the checkpoints topic's records.

One place turns the (key, value) records of a checkpoints partition, read
from the start, into the newest usable checkpoint per session: the Kafka
restore and the broker-less tests (compaction simulated) call the same
function, so a format change cannot split them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from processor.codec import Checkpoint, Codec, CodecError


@dataclass
class RestoredCheckpoints:
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    records_read: int = 0
    bad_records: int = 0


def latest_checkpoints(
    codec: Codec,
    records: Iterable[tuple[bytes | None, bytes | None]],
    on_bad: Callable[[str, CodecError], None] | None = None,
) -> RestoredCheckpoints:
    """Newest checkpoint per session of ``records`` in log order (tombstones remove).

    An unreadable record drops its session's checkpoint (it is refolded) and
    is reported through ``on_bad``; it never stops the restore.
    """
    result = RestoredCheckpoints()
    for key, value in records:
        result.records_read += 1
        if key is None:
            continue
        sid = key.decode("utf-8", "replace")
        if value is None:
            result.checkpoints.pop(sid, None)
            continue
        try:
            result.checkpoints[sid] = codec.decode_checkpoint(value)
        except CodecError as exc:
            result.bad_records += 1
            if on_bad is not None:
                on_bad(sid, exc)
            result.checkpoints.pop(sid, None)
    return result
