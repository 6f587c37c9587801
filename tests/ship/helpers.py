"""Pure-test helpers: a shipper over a MemorySink and a registry in a tmp dir."""

from __future__ import annotations

import random
from pathlib import Path

from processor.core.events import Event
from processor.ship.follow import Limits, Shipper
from processor.ship.registry import Registry
from processor.ship.sender import MemorySink
from processor.workload import generate_session


def events(n: int, seed: int = 1) -> list[Event]:
    return generate_session(random.Random(seed), n)


class Harness:
    def __init__(self, root: Path, state: Path, **limits: float) -> None:
        self.root = root
        self.state = state
        self.sink = MemorySink()
        self.lines: list[str] = []
        self.limits = Limits(rescan_s=0.0, commit_interval_s=0.0, **limits)  # type: ignore[arg-type]
        self.shipper = self._new()

    def _new(self) -> Shipper:
        return Shipper(
            self.root,
            self.sink,
            Registry(self.state / "ship.sqlite3"),
            limits=self.limits,
            say=self.lines.append,
        )

    def drain(self) -> None:
        """Turn until nothing is left, acknowledging as the broker would."""
        self.shipper.scan()
        for _ in range(10_000):
            before = len(self.sink.sent)
            busy = self.shipper.turn()
            self.sink.poll(0)
            if not busy or (self.sink.hold and len(self.sink.sent) == before):
                break
        self.sink.poll(0)
        self.shipper.turn()

    def restart(self, *, lose_inflight: bool = True, floor: dict[str, int] | None = None) -> None:
        """The process was killed (kill -9): in-flight records are lost to us."""
        if lose_inflight:
            self.sink.drop_unacked()
        self.shipper.registry.close()
        self.shipper = self._new()
        if floor is not None:
            self.shipper.floor = floor

    def sent(self, sid: str) -> list[Event]:
        return [e for s, e in self.sink.sent if s == sid]

    def seqs(self, sid: str) -> list[int]:
        return [e.seq for e in self.sent(sid)]
