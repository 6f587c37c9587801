"""Another application's consumers in the processor's group (group_watch.py).

Pure: the classifier and the watch's reports, with an injected description.
The real-broker case (a cooperative-sticky consumer of another application
joining the group and taking partitions) is in test_group_watch_kafka.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from processor.kafka.owners import member_client_id
from processor.service.ops.group_watch import NAMED_AT_MOST, GroupWatch, Member, foreign_members
from processor.telemetry.metrics import Metrics


def test_members_of_the_processor_are_not_foreign_whatever_they_advertise() -> None:
    members = [
        (member_client_id("m0", None), (0, 1)),
        (member_client_id("m1", "http://10.0.0.2:8080"), (2,)),
    ]
    assert foreign_members("g", members) == (0, None)


def test_a_foreign_member_holding_partitions_is_named_with_them() -> None:
    count, line = foreign_members("g", [("processor-m0", (0,)), ("etl-7", (1, 2))])
    assert count == 1
    assert line is not None and "\n" not in line
    assert "group 'g' has 1 member(s) of another application" in line
    assert "etl-7 holds events partitions [1, 2]" in line
    assert "not folded" in line


def test_a_foreign_member_holding_nothing_moves_nothing_and_is_not_reported() -> None:
    assert foreign_members("g", [("processor-m0", (0, 1, 2)), ("etl-7", ())]) == (0, None)


def test_the_line_names_a_bounded_number_of_members() -> None:
    many = [(f"app-{i}", (i,)) for i in range(NAMED_AT_MOST + 3)]
    count, line = foreign_members("g", many)
    assert count == NAMED_AT_MOST + 3
    assert line is not None
    assert line.count(" holds events partitions ") == NAMED_AT_MOST
    assert "and 3 more" in line
    assert foreign_members("g", [("", (4,))])[1] is not None  # no client.id at all


class _Group:
    def __init__(self) -> None:
        self.members: Sequence[Member] = [("processor-m0", (0, 1))]
        self.fail: Exception | None = None

    def describe(self) -> Sequence[Member]:
        if self.fail is not None:
            raise self.fail
        return self.members


def test_readyz_names_foreign_members_while_they_hold_partitions() -> None:
    metrics = Metrics()
    metrics.health.ready = True
    group = _Group()

    def report(count: int, line: str | None) -> None:
        metrics.foreign_members.set(count)
        metrics.health.foreign = line

    watch = GroupWatch("g", group.describe, report)
    watch.check()
    assert metrics.health.readiness() == (200, b"ready\n")
    group.members = [("processor-m0", (0,)), ("etl-7", (1,))]
    watch.check()
    status, body = metrics.health.readiness()
    assert status == 503 and body.startswith(b"not ready: group 'g' has 1 member(s)"), body
    assert metrics.registry.get_sample_value("processor_group_foreign_members") == 1
    # a failed description changes nothing (the broker watch reports brokers)
    group.fail = RuntimeError("coordinator not available")
    watch.check()
    assert metrics.health.readiness()[0] == 503
    group.fail = None
    group.members = [("processor-m0", (0, 1))]
    watch.check()
    assert metrics.health.readiness() == (200, b"ready\n")
    assert metrics.registry.get_sample_value("processor_group_foreign_members") == 0


def test_the_watch_thread_describes_every_interval_and_stops() -> None:
    group = _Group()
    seen: list[int] = []
    watch = GroupWatch("g", group.describe, lambda count, _: seen.append(count), every_s=0.01)
    watch.start()
    try:
        time.sleep(0.2)
    finally:
        watch.stop()
    assert seen and set(seen) == {0}
    after = len(seen)
    time.sleep(0.05)
    assert len(seen) == after  # stopped


def test_the_watch_describes_nothing_while_no_broker_answers() -> None:
    """A description during an outage cannot be answered, creates a client, and a
    coordinator request failing as its connection drops aborts librdkafka."""
    group = _Group()
    seen: list[int] = []
    down = [True]
    watch = GroupWatch(
        "g",
        group.describe,
        lambda count, _: seen.append(count),
        every_s=0.01,
        paused=lambda: down[0],
    )
    watch.start()
    try:
        time.sleep(0.1)
        assert seen == []
        down[0] = False
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watch.stop()
    assert seen


def test_the_watch_is_quiet_for_a_while_after_a_broker_fault() -> None:
    """An admin request to a group coordinator whose broker goes away mid-request
    can abort librdkafka (issue 37): no description soon after a transport error."""
    from processor.kafka.client_errors import ClientProblems
    from processor.service.ops.group_watch import QUIET_AFTER_TROUBLE_S, in_trouble

    problems = ClientProblems()
    now = time.monotonic()
    assert not in_trouble(problems, now)
    problems.broker_trouble_at = now - 1
    assert in_trouble(problems, now)
    assert not in_trouble(problems, now + QUIET_AFTER_TROUBLE_S)
    problems.brokers_down_at = now
    assert in_trouble(problems, now + QUIET_AFTER_TROUBLE_S)
