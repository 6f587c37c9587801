"""Child processes that never outlive their parent.

Every process the project starts on someone's behalf (the demo's members,
the bench's helpers, the tests' members) is started through
:func:`popen_tied`: on Linux the child asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``, as the dev broker does), whatever ended
the parent (``kill <pid>``, SIGKILL, a crash), and a member ends within its
stop bound on SIGTERM (``processor/service/loop/stopping.py``).  :func:`stop`
is the parent's side: SIGTERM, then SIGKILL past a bound.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from processor.kafka_dist import die_with_parent, load_prctl


def _tie_to(parent: int) -> Callable[[], None] | None:
    """The pre-exec hook: die with ``parent`` (also if it died during the fork)."""
    if not load_prctl():  # resolved before the fork: the hook does no dlopen
        return None

    def hook() -> None:  # in the child between fork and exec
        die_with_parent()
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def popen_tied(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **kwargs)`` whose child gets SIGTERM when this
    process (precisely: the thread that starts it) ends."""
    hook = _tie_to(os.getpid())
    if hook is not None:
        kwargs.setdefault("preexec_fn", hook)
    return subprocess.Popen(list(cmd), **kwargs)


#: How long :func:`stop` waits before SIGKILL: a member's stop bound (30 s) and a margin.
STOP_WAIT_S = 35.0


def stop(procs: Sequence[subprocess.Popen[Any]], bound_s: float = STOP_WAIT_S) -> list[int]:
    """SIGTERM every process, SIGKILL those still running ``bound_s`` later;
    their exit statuses (negative: the signal that ended one)."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + bound_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    return [proc.wait() for proc in procs]
