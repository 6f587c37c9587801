"""A ``Processor`` run loop on a daemon thread, for tests that drive it from outside.

Whatever the loop raises is kept in ``errors`` so the test names it in its own
assertion (a thread's exception otherwise only reaches stderr).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from processor.service.loop.runner import Processor
from tests.service.conftest import wait_until


def until(
    done: Callable[[], bool], errors: list[BaseException], what: str, timeout_s: float = 30
) -> None:
    """Wait for ``done``; a loop error or ``timeout_s`` fails the test naming ``what``
    (a bound the tests' in-memory holds, 60 s, never reach)."""

    def ok() -> bool:
        assert not errors, errors
        return done()

    wait_until(ok, what, timeout_s, poll_s=0.01)


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
