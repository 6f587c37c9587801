"""What an in-place replay hands the engine per session (docs/views-format.md, section 8).

An in-place ``processor replay`` refolds every session from seq 0 while the
views topic still holds the old records, and holds a session's views back
until it reaches the seq it had published.  Its first publication writes
the views whole: new bundles would restart at ``~b0`` (rewriting a
written-once key with other contents) and the old bundles and format-2
``~m`` records would stay, named by no head and never tombstoned.  So the
floor also says where the old bundle numbers ended and which old records
to tombstone in that first publication (node and transcript chunks are
rewritten under the same keys, the head and the units too).

:class:`PublishFloor` is an ``int`` (the seq) so the runner passes it to the
engine unchanged, as a plain floor.
"""

from __future__ import annotations

from processor.codec import Checkpoint
from processor.config import ServiceConfig
from processor.engine.output import session_tombstones


class PublishFloor(int):
    """A publish floor (seq) with what the old views of the session hold."""

    next_bundle: int
    stale: tuple[str, ...]

    def __new__(cls, seq: int, next_bundle: int = 0, stale: tuple[str, ...] = ()) -> PublishFloor:
        floor = super().__new__(cls, seq)
        floor.next_bundle = next_bundle
        floor.stale = stale
        return floor


def replay_floor(partition: int, sid: str, cp: Checkpoint, config: ServiceConfig) -> PublishFloor:
    """The floor of a session whose checkpoint ``cp`` an in-place replay drops."""
    parted = cp.surface.get("service", {}).get("parted") or {}
    next_bundle = int(parted.get("views", {}).get("nextBundle", 0))
    prefix = f"{sid}/".encode()
    stale = tuple(
        key[len(prefix) :].decode()
        for topic, _, key in session_tombstones(partition, sid, cp, (), config)
        if topic == config.topics.views and key[len(prefix) :].startswith((b"~b", b"~m"))
    )
    return PublishFloor(cp.last_seq, next_bundle, stale)
