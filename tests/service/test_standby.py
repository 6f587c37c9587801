"""Warm standby copies of the partitions a member does not own (standby.py, issue 37).

Pure: the schedule and the hand-over, with a recording fill in place of the
store's background fill (whose slices test_background_fill.py covers).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from processor.service.partitions.standby import Standby


class _Fill:
    def __init__(self) -> None:
        self.jobs: dict[int, Any] = {}
        self.calls: list[tuple[str, Any]] = []
        self.fail = False

    def start(self, reader: Any, partitions: list[int]) -> None:
        if self.fail:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "gone"))
        self.calls.append(("start", list(partitions)))
        self.jobs = dict.fromkeys(partitions)

    def step(self) -> dict[int, Any]:
        self.calls.append(("step", sorted(self.jobs)))
        done, self.jobs = self.jobs, {}
        return dict.fromkeys(done)

    def cancel(self, partitions: Any) -> None:
        for p in partitions:
            self.jobs.pop(p, None)
        self.calls.append(("cancel", list(partitions)))

    def close(self) -> None:
        self.jobs = {}
        self.calls.append(("close", None))


def _standby(fill: _Fill, now: list[float], owned: set[int]) -> Standby:
    return Standby(
        fill,  # type: ignore[arg-type]
        every_s=5.0,
        unowned=lambda: [p for p in range(4) if p not in owned],
        verifier=lambda: object(),  # type: ignore[arg-type,return-value]
        clock=lambda: now[0],
    )


def test_the_unowned_partitions_are_caught_up_every_interval_in_slices() -> None:
    fill, now = _Fill(), [100.0]
    standby = _standby(fill, now, owned={1})
    standby.step(behind=False)
    assert fill.calls == [("start", [0, 2, 3])]
    standby.step(behind=False)  # a slice of the open catch-up
    assert fill.calls[-1] == ("step", [0, 2, 3])
    standby.step(behind=False)  # done, not due again yet
    now[0] += 5.0
    standby.step(behind=False)
    assert fill.calls[-1] == ("start", [0, 2, 3]) and standby.rounds == 2


def test_no_catch_up_begins_while_the_loop_is_behind() -> None:
    fill, now = _Fill(), [100.0]
    standby = _standby(fill, now, owned=set())
    standby.step(behind=True)
    assert fill.calls == []
    standby.step(behind=False)
    assert fill.calls == [("start", [0, 1, 2, 3])]


def test_an_assignment_takes_its_partitions_from_the_standby_fill() -> None:
    fill, now = _Fill(), [100.0]
    standby = _standby(fill, now, owned=set())
    standby.step(behind=False)
    standby.cancel([2])
    assert fill.calls[-1] == ("cancel", [2]) and 2 not in fill.jobs


def test_a_failing_standby_fill_is_dropped_and_tried_later_never_raised() -> None:
    fill, now = _Fill(), [100.0]
    standby = _standby(fill, now, owned=set())
    fill.fail = True
    standby.step(behind=False)  # logged, not raised
    assert fill.calls == [("close", None)]
    fill.fail = False
    standby.step(behind=False)
    assert fill.calls == [("close", None)]  # not before the interval
    now[0] += 5.0
    standby.step(behind=False)
    assert fill.calls[-1] == ("start", [0, 1, 2, 3])
