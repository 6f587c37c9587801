"""End the ``processor`` process without freeing what a command built.

``processor fold`` builds one large acyclic heap (every kept event of the
log, the session's messages) and exits.  Freeing it one object at a time
touches each cold cache line once more (~0.66 us per kept event, BENCHMARKS
§3 core5) for memory the OS takes back anyway.  A command hands such a heap
to ``hold``; ``main`` then flushes stdout and stderr and leaves with
``os._exit``.  Only ``main`` (the installed command) enables this: a command
run in-process (click's test runner, a library caller) frees as usual.
"""

from __future__ import annotations

import os
import sys
from typing import ClassVar


class _State:
    enabled: ClassVar[bool] = False
    held: ClassVar[list[object]] = []


def enable() -> None:
    """Let ``hold`` keep objects until a quick exit (called by ``main`` only)."""
    _State.enabled = True


def hold(obj: object) -> None:
    """Keep ``obj`` alive until the process ends, if ``main`` runs this process."""
    if _State.enabled:
        _State.held.append(obj)


def exit_now(code: int) -> None:
    """Leave with ``code`` without tearing down a held heap.

    Returns (and the caller exits normally) when nothing is held, or when
    flushing fails: the normal exit then reports the failure as it would.
    """
    if not _State.held:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)
