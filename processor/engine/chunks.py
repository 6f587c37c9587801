"""A list published as closed chunks plus an inline tail (the parted format).

A list that a head would otherwise carry whole (node refs, header seqs,
replacements) is cut into chunks of :data:`CHUNK_ITEMS`.  Closed chunks are
records of their own, rewritten only when their items changed (a replace
rewrites from the chunk of its first changed position on; appends never
touch a closed chunk) and stamped with the ``lastSeq`` they were written at;
the head names the version of every closed chunk and carries the open tail
itself.  So a batch that appends rewrites no chunk at all, and a reader that
holds a head knows exactly which chunk versions it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from processor.protocol import CHUNK_ITEMS


@dataclass(slots=True)
class ChunkWrites:
    writes: list[tuple[int, list[Any]]]  # (index, items) to (re)write
    removed: list[int]  # indices no closed chunk has any more: tombstone


@dataclass(slots=True)
class ChunkLedger:
    """The closed chunks of one list as last written: ``(version, items)`` each.

    A tuple, ``()`` (one shared object) while there are none, as in most held
    sessions: an empty list was 56 bytes in three ledgers of each (figure 6).
    """

    closed: tuple[tuple[int, list[Any]], ...] = ()

    def update(self, items: Sequence[Any], version: int) -> ChunkWrites:
        """Bring the ledger to ``items``: the chunks to write and to tombstone."""
        n = len(items) // CHUNK_ITEMS
        if not n and not self.closed:
            return ChunkWrites([], [])
        closed = list(self.closed)
        writes: list[tuple[int, list[Any]]] = []
        for i in range(n):
            chunk = list(items[i * CHUNK_ITEMS : (i + 1) * CHUNK_ITEMS])
            if i < len(closed):
                if closed[i][1] == chunk:
                    continue
                closed[i] = (version, chunk)
            else:
                closed.append((version, chunk))
            writes.append((i, chunk))
        removed = list(range(n, len(closed)))
        self.closed = tuple(closed[:n])
        return ChunkWrites(writes, removed)

    @property
    def versions(self) -> list[int]:
        return [version for version, _ in self.closed]

    @staticmethod
    def tail(items: Sequence[Any]) -> list[Any]:
        return list(items[len(items) // CHUNK_ITEMS * CHUNK_ITEMS :])

    @classmethod
    def restored(cls, items: Sequence[Any], versions: Sequence[int]) -> ChunkLedger:
        """The ledger of a restored list whose closed chunks are at ``versions``."""
        return cls(
            tuple(
                (int(v), list(items[i * CHUNK_ITEMS : (i + 1) * CHUNK_ITEMS]))
                for i, v in enumerate(versions)
            )
        )
