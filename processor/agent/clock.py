"""Time and ids for the step loop: deterministic by default, real on request.

A log written twice from the same script must be byte-identical (tests, the
demo, the example log), so the loop's default clock and message ids are
logical; production passes :func:`wall_clock` and its own id factory.
"""

from __future__ import annotations

import time as _time


class LogicalClock:
    """Deterministic epoch-ms clock: ``start``, then +1 ms per reading."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self._now = start - 1

    def __call__(self) -> int:
        self._now += 1
        return self._now


def wall_clock() -> int:
    """The real time in epoch ms (pass as ``clock=`` in production)."""
    return _time.time_ns() // 1_000_000


class IdSequence:
    """Default message ids: ``<kind>-<base>-<n>`` (see the module docstring)."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._n = 0

    def __call__(self, kind: str) -> str:
        self._n += 1
        return f"{kind}-{self._base}-{self._n}"
