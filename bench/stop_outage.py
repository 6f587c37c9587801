"""A member whose broker goes away: CPU, clients and raw log lines over the outage, then SIGTERM.

    python -m bench.stop_outage [OUTAGE_S] [busy]    # default 60; busy: a writer
                                                     # feeds it until the broker goes

Starts its own broker (never the shared one), a ``processor run`` member on
it, writes two sessions, stops the broker, samples the member every 15 s
(CPU seconds since the outage began, librdkafka instances alive), then
prints ``processor_kafka_clients_created_total``, sends SIGTERM and prints
how long the member took to exit and with which status (docs/stopping.md).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from processor.children import popen_tied
from processor.client.session_writer import SessionWriter
from processor.config import ServiceConfig
from processor.devbroker import LocalBroker
from processor.examples.make_example import scripted_sessions
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics

REPO = Path(__file__).parents[1]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rdkafka_instances(pid: int) -> int:
    """librdkafka instances alive: one ``rdk:main`` thread each."""
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            count += (task / "comm").read_text().strip() == "rdk:main"
    return count


def _feed(config: ServiceConfig) -> None:
    """New sessions until the broker is gone (the writer then fails)."""
    with SessionWriter(config) as writer:
        for n in itertools.count():
            for _, events in scripted_sessions(1):
                for event in events:
                    try:
                        writer.append_event(f"busy{n}", event)
                    except Exception:  # the broker went: done
                        return
            time.sleep(0.05)


def main(outage_s: float, busy: bool = False) -> None:
    broker = LocalBroker()
    boot = broker.start()
    config = ServiceConfig(
        bootstrap_servers=boot, topic_prefix="so", group_id="so-g", partitions=2, state_dir="none"
    )
    create_topics(clients.admin(config), config)
    port = 20000 + os.getpid() % 20000
    err = Path(tempfile.mkstemp(prefix="stop-outage-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "processor", "run", "-b", boot, "--topic-prefix", "so"]
    cmd += ["--group-id", "so-g", "--instance-id", "a", "--metrics-port", str(port)]
    env = {**os.environ, "PROCESSOR_STATE_DIR": "none", "PYTHONPATH": str(REPO)}
    with err.open("wb") as sink:
        member = popen_tied(cmd, env=env, stderr=sink, cwd=REPO)
    with SessionWriter(config) as writer:
        for sid, events in scripted_sessions(2):
            for event in events:
                writer.append_event(sid, event)
        writer.flush()
    time.sleep(15)
    if busy:  # a transaction in flight when the broker goes
        threading.Thread(target=_feed, args=(config,), daemon=True).start()
        time.sleep(5)
    broker.stop()
    t0, cpu0 = time.monotonic(), cpu_s(member.pid)
    while time.monotonic() - t0 < outage_s:
        time.sleep(min(15.0, outage_s))
        print(
            f"outage {time.monotonic() - t0:4.0f} s: cpu {cpu_s(member.pid) - cpu0:.2f} s, "
            f"librdkafka instances {rdkafka_instances(member.pid)}",
            flush=True,
        )
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    print(
        "\n".join(re.findall(r"^processor_kafka_clients_created_total.*$", metrics.decode(), re.M))
    )
    t1 = time.monotonic()
    member.send_signal(signal.SIGTERM)
    code = member.wait(120)
    raw = sum(1 for line in err.read_text().splitlines() if re.match(r"^%\d\|", line))
    print(f"exit {code} {time.monotonic() - t1:.1f} s after SIGTERM; raw librdkafka lines: {raw}")
    print(f"member log: {err}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0, "busy" in sys.argv[2:])
