"""Issue 39: a member whose brokers are gone for a while, then SIGTERM.

Its own :class:`LocalBroker` (the shared one is never stopped): a member
runs on it, folds a few sessions, the broker stops; over the outage the
member creates no new clients (``processor_kafka_clients_created_total``),
prints no raw librdkafka line (``%3|...``) and costs little CPU; SIGTERM
then ends it within its stop bound, exit 4 and one line saying nothing of
the open batch was committed.  The watches run every second (not every 30
and 5 s), so a short outage holds as many of their ticks as a long one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.children import popen_tied
from processor.client.session_writer import SessionWriter
from processor.config import ServiceConfig
from processor.devbroker import LocalBroker
from processor.examples.make_example import scripted_sessions
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from tests.kafka_fixtures import unique_prefix
from tests.local_http import free_port, get

pytestmark = pytest.mark.kafka
REPO = Path(__file__).parents[2]
OUTAGE_S = 25.0  # the watches tick every second: 25 ticks each
STOP_BOUND_S = 20.0
CREATED = re.compile(r'^processor_kafka_clients_created_total\{kind="(\w+)"\} (\S+)$', re.M)


@pytest.fixture
def own_broker() -> Iterator[LocalBroker]:
    broker = LocalBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _clients(port: int) -> int:
    status, text = get(port, "/metrics")
    assert status == 200
    return int(sum(float(n) for _, n in CREATED.findall(text)))


def _wait_committed(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        status, text = get(port, "/metrics")
        m = re.search(r"^processor_transactions_total (\S+)$", text, re.M)
        if status == 200 and m and float(m.group(1)) >= 1:
            return
        time.sleep(0.5)
    raise AssertionError(f"nothing committed; the member's log:\n{log.read_text()[-3000:]}")


def test_issue39_stop_after_an_outage_is_bounded(own_broker: LocalBroker, tmp_path: Path) -> None:
    prefix = unique_prefix("stop")
    config = ServiceConfig(
        bootstrap_servers=own_broker.bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-g",
        partitions=2,
        state_dir="none",
    )
    create_topics(clients.admin(config), config)
    port = free_port()
    cmd = [sys.executable, "-m", "processor", "run", "-b", config.bootstrap_servers]
    cmd += ["--topic-prefix", prefix, "--group-id", config.group_id, "--instance-id", "a"]
    cmd += ["--metrics-port", str(port), "--commit-interval-ms", "100"]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PROCESSOR_STATE_DIR": "none",
        "PROCESSOR_GROUP_WATCH_S": "1",
        "PROCESSOR_BROKER_PROBE_S": "1",
        "PROCESSOR_STOP_BOUND_S": str(STOP_BOUND_S),
    }
    log = tmp_path / "member.log"
    with log.open("wb") as sink:
        proc = popen_tied(cmd, env=env, stdout=sink, stderr=sink)
    try:
        with SessionWriter(config) as writer:
            for sid, events in scripted_sessions(2):
                for event in events:
                    writer.append_event(sid, event)
            writer.flush()
        _wait_committed(port, proc, log)
        time.sleep(3)  # the group watch has described the group a few times
        before = _clients(port)
        own_broker.stop()
        cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(OUTAGE_S)
        cpu, outage = _cpu_s(proc.pid) - cpu0, time.monotonic() - t0
        made = _clients(port) - before
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(STOP_BOUND_S + 15)  # the bound, and a margin for a loaded box
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    # one group watch admin client for the whole outage, not one per tick
    assert made <= 1, f"{made} clients created during a {outage:.0f} s outage"
    # well under a tenth of a core: the watches wait, they do not spin
    assert cpu < 0.1 * outage, f"{cpu:.1f} s of CPU over a {outage:.0f} s outage"
    raw = [line for line in text.splitlines() if re.match(r"^%\d\|", line)]
    assert not raw, f"raw librdkafka lines on stderr: {raw[:3]}"
    assert code == 4, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert "nothing of the open batch" in last and "no broker answered" in last, last
