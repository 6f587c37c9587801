"""A stopped member ends within a bound, however long its brokers have been gone.

``processor run`` on SIGTERM (or SIGINT):

1. asks the loop to stop and sets :data:`STOPPING` (process-wide): retries of
   broker calls (``retry.py``) and the transactions' init give up at once
   instead of riding out their deadline;
2. if no broker answers (librdkafka said all brokers are down and none has
   answered since), the loop leaves without committing the open batch (a
   commit could only wait out its timeouts): nothing of it commits, the next
   owner folds it again; the exit status is :data:`EXIT_UNCOMMITTED` and one
   line says so;
3. a watchdog armed at the signal ends the process :data:`STOP_BOUND_S`
   after it whatever still blocks (a librdkafka call that never returns, a
   close that waits for a coordinator that went away), with the same status
   and one line naming the bound.  ``os._exit``: nothing more runs, so
   nothing more commits.

The bound is the ``stop_bound_s`` setting (default 30 s), well inside the
90 s termination grace period of docs/operations.md.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from processor.kafka.retry import STOPPING as STOPPING

#: Default of ``stop_bound_s``: the longest a stop takes.
STOP_BOUND_S = 30.0
#: Exit status of a stop that left the open batch uncommitted.
EXIT_UNCOMMITTED = 4


def uncommitted_line(events: int, why: str) -> str:
    """The one line a stop without a commit ends with."""
    return (
        f"processor: stopped {why}: nothing of the open batch ({events} events) was "
        f"committed; the next owner of its partitions folds them again (exit {EXIT_UNCOMMITTED})"
    )


class Watchdog:
    """Ends the process ``bound_s`` after :meth:`arm`, unless it exited first."""

    def __init__(
        self,
        bound_s: float,
        open_events: Callable[[], int],
        *,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.bound_s = bound_s
        self.open_events = open_events
        self._exit = exit
        self._armed_at: float | None = None
        self._lock = threading.Lock()

    def listen(self) -> None:
        """Arm at the signal itself, not when the main thread gets to its Python
        handler: a main thread blocked inside a librdkafka call runs no Python
        code, but the interpreter's C handler writes to the wakeup fd at once.
        Call from the main thread, after installing the Python handlers."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)

        def wait() -> None:
            # the fd gets every signal with a Python handler: only a stop arms
            while os.read(r, 1)[0] not in (signal.SIGTERM, signal.SIGINT):
                pass
            STOPPING.set()
            self.arm()

        threading.Thread(target=wait, name="stop-signal", daemon=True).start()

    def arm(self) -> None:
        """Start counting (once: a second signal does not extend the bound)."""
        with self._lock:
            if self._armed_at is not None:
                return
            self._armed_at = time.monotonic()
        threading.Thread(target=self._fire, name="stop-watchdog", daemon=True).start()

    def _fire(self) -> None:
        time.sleep(self.bound_s)
        try:
            events = self.open_events()
        except Exception:  # the loop's state mid-change: the line still goes out
            events = -1
        why = f"after its {self.bound_s:g} s stop bound (a Kafka call did not return)"
        line = uncommitted_line(max(events, 0), why)
        with_logs = logging.getLogger()
        for handler in with_logs.handlers:
            handler.flush()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self._exit(EXIT_UNCOMMITTED)
