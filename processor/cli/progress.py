"""A one-line progress display for long commands (replay, ingest).

On a terminal it redraws one line on stderr: events done (and of how many),
sessions, the event rate and an ETA.  When stderr is not a terminal (logs,
CI, pipes) it writes nothing at all: the commands end with a one-line summary
anyway, and a redrawn line would only fill a log with carriage returns.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self, TextIO

__all__ = ["FileProgress", "Progress", "format_eta"]


def format_eta(seconds: float) -> str:
    """``0:07``, ``12:30``, ``2:05:00``."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Events, sessions, rate and ETA on one redrawn terminal line."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval_s: float = 0.2,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.started = clock()
        self.events = 0
        self.sessions: int | None = None
        self.total_events: int | None = None
        self.fraction: float | None = None
        self._drawn_at: float | None = None
        self._width = 0

    def update(
        self,
        *,
        events: int,
        sessions: int | None = None,
        total_events: int | None = None,
        fraction: float | None = None,
    ) -> None:
        """Set the absolute counts; redraw at most every ``min_interval_s``.

        ``fraction`` (0..1) decides the ETA when the total is not counted in
        events (ingest knows bytes up front, not events).
        """
        self.events = events
        if sessions is not None:
            self.sessions = sessions
        if total_events is not None:
            self.total_events = total_events
        if fraction is not None:
            self.fraction = min(max(fraction, 0.0), 1.0)
        now = self.clock()
        if self._drawn_at is None or now - self._drawn_at >= self.min_interval_s:
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        elapsed = (self.clock() if now is None else now) - self.started
        rate = self.events / elapsed if elapsed > 0 else 0.0
        done = self._fraction()
        parts = [
            f"{self.events:,}"
            + (f"/{self.total_events:,}" if self.total_events else "")
            + " events"
            + (f" ({done:.0%})" if done is not None else "")
        ]
        if self.sessions is not None:
            parts.append(f"{self.sessions:,} session{'' if self.sessions == 1 else 's'}")
        parts.append(f"{rate:,.0f} ev/s")
        if done is not None and 0 < done < 1 and elapsed > 0:
            parts.append(f"ETA {format_eta(elapsed * (1 - done) / done)}")
        elif done is not None and done >= 1:
            parts.append(f"done in {format_eta(elapsed)}")
        return f"{self.label}: " + " · ".join(parts)

    def _fraction(self) -> float | None:
        if self.fraction is not None:
            return self.fraction
        if self.total_events:
            return min(self.events / self.total_events, 1.0)
        return None

    def _draw(self, now: float) -> None:
        self._drawn_at = now
        if not self.enabled:
            return
        text = self.line(now)
        pad = " " * max(0, self._width - len(text))  # erase the rest of a longer line
        self._width = len(text)
        self.stream.write(f"\r{text}{pad}")
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (nothing when disabled)."""
        if self.enabled:
            self._draw(self.clock())
            self.stream.write("\n")
            self.stream.flush()
        self.enabled = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class FileProgress:
    """Progress over files of known sizes (ingest): bytes give the fraction.

    The event count of a file is known only once it is read, so the ETA uses
    the bytes of the finished files plus the produced share of the current one.
    """

    def __init__(self, progress: Progress, total_bytes: int) -> None:
        self.progress = progress
        self.total_bytes = max(total_bytes, 1)
        self._bytes_done = 0
        self._file_bytes = 0
        self._file_events = 0
        self._file_done = 0
        self._events = 0
        self._sessions = 0

    def begin(self, size: int) -> None:
        """A file of ``size`` bytes is next."""
        self._file_bytes, self._file_events, self._file_done = size, 0, 0

    def expect(self, events: int) -> None:
        """The current file, once read, holds ``events`` events."""
        self._file_events = events
        self._show()

    def event(self) -> None:
        self._events += 1
        self._file_done += 1
        self._show()

    def end(self, sessions: int) -> None:
        """The current file is finished (ingested or refused); ``sessions`` so far."""
        self._bytes_done += self._file_bytes
        self._file_bytes = self._file_events = self._file_done = 0
        self._sessions = sessions
        self._show()

    def _show(self) -> None:
        share = self._file_done / self._file_events if self._file_events else 0.0
        fraction = (self._bytes_done + self._file_bytes * share) / self.total_bytes
        self.progress.update(events=self._events, sessions=self._sessions, fraction=fraction)
