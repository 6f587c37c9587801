"""``group_protocol = "auto"`` and KIP-848 static members on the real broker (issue 37).

* auto asks the broker for the group's ``consumer.session.timeout.ms``: a
  group whose timeout is over the budget (set per group here, 50 s, valid on
  any broker) runs classic; where the broker's is short (the dev broker's and
  cluster's 6 s) it runs KIP-848 and knows the timeout.
* a static KIP-848 member whose instance id is still held by a process that
  was killed (-9, its session alive) is refused with UNRELEASED_INSTANCE_ID;
  it used to exit (a fatal consumer error).  Now it is counted, named on
  ``/readyz``, joins again until the broker ends the old session, and folds.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from processor.kafka import clients, group_protocol
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from tests.service.conftest import Stack, wait_until
from tests.service.running import RunningProcessor

pytestmark = pytest.mark.kafka


def _broker_runs_kip848(stack: Stack) -> bool:
    admin = clients.admin(stack.config)
    described = group_protocol.describe_group_configs(admin, stack.config.group_id, 10)
    return group_protocol.choose(described).protocol == "consumer"


def test_auto_runs_classic_for_a_group_whose_session_timeout_is_over_the_budget(
    stack: Stack,
) -> None:
    cfg = stack.config
    admin = clients.admin(cfg)
    entry = ConfigEntry(
        "consumer.session.timeout.ms", "50000", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, cfg.group_id, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)

    def applied() -> bool:  # the broker takes it from the metadata log
        described = group_protocol.describe_group_configs(admin, cfg.group_id, 10)
        return described.get("consumer.session.timeout.ms") == "50000"

    wait_until(applied, "the group config to apply", 30)
    proc = Processor(cfg.with_overrides(group_protocol="auto"), metrics=(metrics := Metrics()))
    assert proc.config.group_protocol == "classic"
    assert b'processor_group_protocol{protocol="classic"} 1.0' in metrics.exposition()


def test_auto_runs_kip848_where_the_brokers_group_session_timeout_is_short(
    stack: Stack,
) -> None:
    if not _broker_runs_kip848(stack):
        pytest.skip("the broker's group.consumer.session.timeout.ms is over 10 s")
    config = stack.config.with_overrides(group_protocol="auto")
    proc = Processor(config, metrics=(metrics := Metrics()))
    assert proc.config.group_protocol == "consumer"
    assert 0 < proc.config.group_session_timeout_ms <= group_protocol.MAX_SESSION_TIMEOUT_MS
    assert b'processor_group_protocol{protocol="consumer"} 1.0' in metrics.exposition()


#: A process holding the group's static instance id (KIP-848) until killed.
_HOLDER = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "group.protocol": "consumer", "group.instance.id": sys.argv[3]})
c.subscribe([sys.argv[4]])
while True:
    c.poll(0.2)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_a_static_member_refused_for_an_unreleased_instance_id_rejoins_once_the_old_session_ends(
    stack: Stack,
) -> None:
    if not _broker_runs_kip848(stack):
        pytest.skip("the broker's group.consumer.session.timeout.ms is over 10 s")
    cfg = stack.config.with_overrides(
        group_protocol="consumer", static_membership=True, instance_id="m-static"
    )
    args = [cfg.bootstrap_servers, cfg.group_id, "m-static", cfg.topics.events]
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *args], stdout=subprocess.PIPE, text=True
    )
    running: RunningProcessor | None = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("assigned")
        metrics = Metrics()
        running = RunningProcessor(Processor(cfg, metrics=metrics))
        wait_until(lambda: metrics.join_refusals._value.get() >= 1, "the join to be refused", 60)
        assert b"UNRELEASED_INSTANCE_ID" in metrics.health.readiness()[1]
        holder.kill()  # -9: its session lives until the broker times it out
        holder.wait(10)
        refused_at = time.monotonic()
        wait_until(lambda: metrics.health.readiness()[0] == 200, "/readyz to turn ready", 90)
        assert time.monotonic() - refused_at < 60
        stack.produce_and_wait_folded(seed=37)
        assert not running.errors, running.errors
    finally:
        holder.kill()
        if running is not None:
            running.stop()
    assert running is not None and not running.errors, running.errors
