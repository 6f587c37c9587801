"""A ``Processor`` run loop on a daemon thread, for tests that drive it from outside.

Whatever the loop raises is kept in ``errors`` so the test names it in its own
assertion (a thread's exception otherwise only reaches stderr).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from processor.service.loop.runner import Processor


def until(
    done: Callable[[], bool], errors: list[BaseException], what: str, timeout_s: float = 30
) -> None:
    """Wait for ``done``; a loop error or ``timeout_s`` fails the test naming ``what``
    (a bound the tests' in-memory holds, 60 s, never reach)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert not errors, errors
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class RunningProcessor:
    def __init__(self, proc: Processor) -> None:
        self.proc = proc
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.proc.run()
        except BaseException as exc:  # the test's assertion names it
            self.errors.append(exc)

    def stop(self, timeout: float = 60) -> None:
        """Ask the loop to stop and wait for it (the caller asserts on ``errors``)."""
        self.proc.stop()
        self.thread.join(timeout)
        if self.thread.is_alive():  # a stop must be bounded (issue 39): the test names it
            self.errors.append(TimeoutError(f"the loop did not stop within {timeout:g} s"))
