"""``/readyz`` names every current cause, the most severe first, and a bounded number.

One cause used to hide the others: a restore's call being retried hid the
partitions put off before it (and the reverse), so an operator saw one
problem while there were two.  The first line stays ``not ready: <first
cause>`` (what probes and alerts match).  Pure: a Health with injected
reports, no loop and no broker.
"""

from __future__ import annotations

from processor.telemetry.health import MAX_CAUSES, Health


def _health() -> Health:
    health = Health()
    health.ready = True
    health.tick()
    return health


def test_every_cause_is_named_most_severe_first() -> None:
    health = _health()
    health.stalled = "partition 2 stalled at offset 7 for 125s"
    health.fill_problems = (
        "restore of cp[0] put off: watermarks of cp[0]: _TRANSPORT: down for 120 s; "
        "retrying in 5 s (put off 1 times)",
        "fill of cp[1] stalled: no progress for 120 s; retrying in 10 s (put off 2 times)",
    )
    health.retrying = lambda: (12.0, "watermarks of cp[3]: _TRANSPORT: down (attempt 6)")
    health.waiting = lambda: [(3.0, "the group's committed offsets of ev[4] to pass")]
    health.set_degraded("transactions failing: 5 in a row")
    status, body = health.readiness()
    assert status == 503
    assert body.decode().splitlines() == [
        "not ready: transactions failing: 5 in a row",
        "also: waiting 12s for the broker: watermarks of cp[3]: _TRANSPORT: down (attempt 6)",
        "also: waiting 3s for the group's committed offsets of ev[4] to pass",
        "also: restore of cp[0] put off: watermarks of cp[0]: _TRANSPORT: down for 120 s; "
        "retrying in 5 s (put off 1 times)",
        "also: fill of cp[1] stalled: no progress for 120 s; retrying in 10 s (put off 2 times)",
        "also: partition 2 stalled at offset 7 for 125s",
    ]
    # one cause: the body is the one line it always was
    health.set_degraded(None)
    health.retrying = lambda: None
    health.waiting = lambda: []
    health.fill_problems = ()
    assert health.readiness() == (503, b"not ready: partition 2 stalled at offset 7 for 125s\n")
    health.stalled = None
    assert health.readiness() == (200, b"ready\n")


def test_the_body_names_at_most_max_causes_and_counts_the_rest() -> None:
    health = _health()
    health.fill_problems = tuple(f"fill of cp[{p}] stalled" for p in range(MAX_CAUSES + 5))
    status, body = health.readiness()
    lines = body.decode().splitlines()
    assert status == 503
    assert lines[0] == "not ready: fill of cp[0] stalled"
    assert lines[1:MAX_CAUSES] == [f"also: fill of cp[{p}] stalled" for p in range(1, MAX_CAUSES)]
    assert lines[MAX_CAUSES:] == ["and 5 more causes"]
    assert health.fill_problem == "fill of cp[0] stalled"


def test_a_short_retry_is_not_a_cause_but_a_wait_is_from_its_start() -> None:
    """A call retried for less than RETRY_REPORT_S is a leader moving (not named);
    a wait that blocks the loop (committed offsets behind the checkpoints) is."""
    health = _health()
    health.retrying = lambda: (1.0, "watermarks of cp[3]: _TRANSPORT: down (attempt 1)")
    assert health.readiness() == (200, b"ready\n")
    health.waiting = lambda: [(0.0, "the group's committed offsets of ev[4] to pass")]
    assert health.readiness() == (
        503,
        b"not ready: waiting 0s for the group's committed offsets of ev[4] to pass\n",
    )
