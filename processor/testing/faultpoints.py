"""Crash points for the fault suite: die at an exact place in the protocol.

``PROCESSOR_FAULTPOINT=<name>`` SIGKILLs this process the first time
:func:`hit` is called with ``name`` while the file named by
``PROCESSOR_FAULTPOINT_ARM`` exists (armed at once when that variable is
unset).  The tests use it to leave a transaction open with its views and
checkpoints produced but its offsets never sent — a zombie's footprint that
timing alone cannot reproduce.  With ``PROCESSOR_FAULTPOINT_ACTION=stop`` the
process SIGSTOPs itself there instead (once): the test then changes the
world (stops the broker) and SIGCONTs it, so the step after the point runs
into that change — a broker gone exactly as a restore begins.  Unset
(production), :func:`hit` is one dict lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

_POINT = os.environ.get("PROCESSOR_FAULTPOINT", "")
_ARM = os.environ.get("PROCESSOR_FAULTPOINT_ARM", "")
_STOP = os.environ.get("PROCESSOR_FAULTPOINT_ACTION", "kill").strip().lower() == "stop"
_stopped = False

#: Points the runner passes: the transaction's records are produced, its
#: offsets not yet sent.
BEFORE_SEND_OFFSETS = "before-send-offsets"
#: The transaction committed, the local store not yet written (it is then
#: behind the topic: the next assignment catches it up).
AFTER_COMMIT = "after-commit"
#: A slice of a background fill is in the store, its partitions not resumed
#: yet (the store is partial: the next assignment verifies and catches it up).
FILL_SLICE_APPLIED = "fill-slice-applied"
#: A partition was assigned (and paused), its restore not begun.
BEFORE_RESTORE = "before-restore"
#: A fill's jobs are open (stored positions verified), their consumer not assigned.
BEFORE_FILL_READ = "before-fill-read"


def configured(name: str) -> bool:
    """Whether this process runs with fault point ``name`` (armed or not)."""
    return name == _POINT


def hit(name: str, prepare: Callable[[], object] | None = None) -> None:
    """Die here if armed; ``prepare`` runs first (e.g. flush, so what the
    transaction produced really reached the broker before the crash)."""
    if not _POINT or name != _POINT:
        return
    if _ARM and not Path(_ARM).exists():
        return
    if prepare is not None:
        prepare()
    if _STOP:
        global _stopped
        if not _stopped:  # once: the test resumes it, and the step after the point runs
            _stopped = True
            os.kill(os.getpid(), signal.SIGSTOP)
        return
    os.kill(os.getpid(), signal.SIGKILL)
