"""A broker outage longer than the put-off bounds, met by a restore and by a fill.

The put-off paths (``rebalance.py``: a restore that cannot read the broker
within ``restore_deadline_s``; ``background_fill.py``: a fill without
progress for ``fill_stall_s``) were proven on the in-memory transport only;
the fault suite's outages (8-19 s) never outlast the 120 s bounds.  Here a
private single broker (never the session's shared one: it is stopped) is
down for longer than both bounds, set to a few seconds, exactly as a
``processor run`` member begins a restore and, later, as another begins its
store fill: the member stops itself at a fault point
(``PROCESSOR_FAULTPOINT_ACTION=stop``), the broker is stopped, the member
resumed.  It must stay up, ``/readyz`` must be 503 naming the put-off,
``processor_restore_waits_total`` must count it, and once the broker is
back the member finishes the restore, turns ready and every session's views
equal the offline fold.  (Repeated put-offs of one outage are the in-memory
tests' part: here each back-off doubling would add its seconds to CI.)
The outage member's session timeout is longer than the outage: with the
default 10 s the group takes the partitions away (on_lost) during any full
outage, and their put-off ends with them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.client.views_reader import read_views, session_fold_equivalent
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.devbroker import LocalBroker
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.testing import faultpoints
from tests.kafka_fixtures import unique_prefix
from tests.local_http import free_port, get
from tests.service.conftest import Stack, as_json, sessions, wait_until

pytestmark = pytest.mark.kafka

#: restore_deadline_s and fill_stall_s of the member that meets the outage
BOUND_S = 3
#: the outage member's session: the outage (a try of the restore, its back-off
#: and the broker's restart) stays within it, so the member keeps its partitions
SESSION_TIMEOUT_MS = 60_000
RESTORE_PUT_OFF = re.compile(r"restore of \S+\[\d+\] put off: ")
FILL_PUT_OFF = re.compile(
    rf"fill of \S+\[\d+\] (stalled: no progress for {BOUND_S} s|put off: read failed)"
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of this module's own, in a kept dir: stopped and started again."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("an external cluster is configured; this test stops its own broker")
    b = LocalBroker()
    b.start(tmp_path_factory.mktemp("outage-broker"))
    try:
        yield b
    finally:
        b.stop()


def _sample(port: int, name: str) -> float:
    """One unlabelled series of ``/metrics`` (0 when absent or not served)."""
    for line in get(port, "/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    """SIGSTOPped (state ``T`` in /proc): the member waits at its fault point."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def _views_equal_offline_fold(stack: Stack) -> bool:
    snap = read_views(stack.config, timeout=30)
    assert not snap.regressions, f"asOfSeq went back: {snap.regressions[:5]}"
    for sid in stack.logs:
        views = snap.views.get(sid)
        if views is None or "status" not in views:
            return False
        if as_json(session_fold_equivalent(views)) != stack.expected(sid):
            return False
    return True


def _fold(stack: Stack, tmp_path: Path, name: str) -> None:
    """A member without faults folds everything written so far, then leaves."""
    member = stack.spawn(name, env={"PROCESSOR_STATE_DIR": "none"}, log=tmp_path / f"{name}.log")
    try:
        wait_until(lambda: _views_equal_offline_fold(stack), f"{name} folded", 120)
    finally:
        _end(member)


def _outage(
    broker: LocalBroker,
    stack: Stack,
    tmp_path: Path,
    name: str,
    point: str,
    reason: re.Pattern[str],
    *,
    hang: bool,
) -> None:
    """``name`` stops itself at ``point``; the broker goes down; ``name`` resumes into
    the outage and must put its partition off, stay up, then finish once the
    broker is back (its tries after the back-off may meet the outage too).

    ``hang``: the broker is SIGSTOPped (it answers nothing, connections stay
    open: every request times out) and resumed, else SIGKILLed (connections
    refused) and started again."""
    port = free_port()
    log = tmp_path / f"{name}.log"
    env = {
        "PROCESSOR_FAULTPOINT": point,
        "PROCESSOR_FAULTPOINT_ACTION": "stop",
        "PROCESSOR_RESTORE_DEADLINE_S": str(BOUND_S),
        "PROCESSOR_FILL_STALL_S": str(BOUND_S),
        # a fresh store: the assignment fills every partition from offset zero
        "PROCESSOR_STATE_DIR": str(tmp_path / name),
    }
    # a session outlasting the outage: with the default 10 s the group would take
    # the partitions away (on_lost) before a second try, and nothing would wait
    session = ("-X", f"session.timeout.ms={SESSION_TIMEOUT_MS}")
    member = stack.spawn(name, "--metrics-port", str(port), *session, env=env, log=log)
    assert broker.workdir is not None and broker.port is not None
    workdir, broker_port = broker.workdir, broker.port
    try:
        wait_until(lambda: _stopped(member) or member.poll() is not None, f"{name} at {point}", 120)
        assert member.poll() is None, _tail(log)
        pid = broker.pid
        assert pid is not None
        if hang:
            os.kill(pid, signal.SIGSTOP)
        else:
            os.kill(pid, signal.SIGKILL)  # an outage, not a shutdown
            broker.stop()
        try:
            member.send_signal(signal.SIGCONT)
            seen: list[str] = []

            def put_off_named() -> bool:
                code, body = get(port, "/readyz")
                if code == 503 and reason.search(body):
                    seen.append(body)
                waits = _sample(port, "processor_restore_waits_total")
                return (bool(seen) and waits >= 1) or member.poll() is not None

            wait_until(put_off_named, f"{name}'s put-off on /readyz and counted", 120)
            assert member.poll() is None, f"{name} exited in the outage:\n{_tail(log)}"
            assert seen, _tail(log)
        finally:
            if hang:
                os.kill(pid, signal.SIGCONT)
            else:
                broker.start(workdir, port=broker_port)
        wait_until(
            lambda: get(port, "/readyz")[0] == 200 or member.poll() is not None,
            f"{name} ready once the broker is back",
            180,
        )
        assert member.poll() is None, f"{name} exited:\n{_tail(log)}"
        wait_until(lambda: _views_equal_offline_fold(stack), f"{name} folded", 120)
        assert get(port, "/readyz")[0] == 200
        assert "restored partition" in log.read_text(errors="replace")
    finally:
        _end(member)


def test_a_member_rides_out_an_outage_past_the_bounds_in_its_restore_and_its_fill(
    broker: LocalBroker, tmp_path: Path
) -> None:
    prefix = unique_prefix("outage")
    config = ServiceConfig(
        bootstrap_servers=broker.bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=1,  # one partition: one restore, one fill
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
    )
    create_topics(clients.admin(config), config)
    stack = Stack(config)
    plan = sessions(4, 45, seed=11)
    thirds = [{sid: evs[i * 15 : (i + 1) * 15] for sid, evs in plan.items()} for i in range(3)]

    def write(part: dict[str, list[Event]]) -> None:
        producer = stack.producer()
        for sid, events in part.items():
            stack.produce(sid, events, producer)
        assert producer.flush(30) == 0

    write(thirds[0])
    _fold(stack, tmp_path, "first")  # checkpoints to restore
    write(thirds[1])
    # the broker gone as the partitions are assigned: the restore is put off
    # (the broker killed and started again)
    _outage(
        broker, stack, tmp_path, "restorer", faultpoints.BEFORE_RESTORE, RESTORE_PUT_OFF, hang=False
    )
    write(thirds[2])
    # the broker gone as the fill of a fresh store begins: the fill is put off
    # (the broker hung and resumed: back at once, no restart to wait for)
    _outage(
        broker, stack, tmp_path, "filler", faultpoints.BEFORE_FILL_READ, FILL_PUT_OFF, hang=True
    )
