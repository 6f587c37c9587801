"""A generator for the previous wire format (format 2, revision 6a53084).

Format 2 wrote every message as its own views record ``~m<seq>[.<g>]`` and
every event / override as its own checkpoint part ``e.<seq>`` /
``o.<seq>.<g>``; format 3 bundles them per session and transaction.  Topics
written by format 2 must still assemble and restore, so tests produce them
with the writer switched back (the rest of the records are the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from processor.engine import checkpoint_parts, view_parts


@contextmanager
def format2() -> Iterator[None]:
    """Within the block, the engine writes format 2 (no bundles)."""
    saved = view_parts.BUNDLES, checkpoint_parts.BUNDLES
    view_parts.BUNDLES = checkpoint_parts.BUNDLES = False
    try:
        yield
    finally:
        view_parts.BUNDLES, checkpoint_parts.BUNDLES = saved
