"""What an in-place replay hands the engine per session (docs/views-format.md, VF-6).

An in-place ``processor replay`` refolds every session from seq 0 while the
views topic still holds the old records, and holds a session's views back
until it reaches the seq it had published.  Its first publication writes
the views whole: new bundles would restart at ``~b0`` (rewriting a
written-once key with other contents) and the old bundles and format-2
``~m`` records would stay, named by no head and never tombstoned.  So the
floor also says where the old bundle numbers ended and which old records
to tombstone in that first publication (node and transcript chunks, the
units and the head are rewritten under their keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.codec import Checkpoint
from processor.config import ServiceConfig
from processor.engine.output import session_tombstones
from processor.engine.view_parts import ViewLedger


@dataclass(frozen=True, slots=True)
class PublishFloor:
    """A session's publish floor (``seq``) with what its old views hold."""

    seq: int
    next_bundle: int = 0
    stale: tuple[str, ...] = ()

    def adopt(self, ledger: ViewLedger) -> None:
        """At the first publication: continue the bundle numbers, drop the old records."""
        ledger.next_bundle = max(ledger.next_bundle, self.next_bundle)
        ledger.legacy += self.stale


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
