"""The group consumer's failure detection defaults (issue 37, item 3). Pure."""

from __future__ import annotations

from processor.config import ServiceConfig
from processor.kafka import clients

BASE = ServiceConfig(bootstrap_servers="127.0.0.1:1", state_dir="none")


def test_classic_members_time_out_after_the_brokers_minimum_session() -> None:
    conf = clients.group_settings(BASE, "m1")
    assert conf["session.timeout.ms"] == clients.SESSION_TIMEOUT_MS == 6_000
    assert conf["heartbeat.interval.ms"] == clients.HEARTBEAT_INTERVAL_MS
    assert conf["heartbeat.interval.ms"] * 3 <= conf["session.timeout.ms"]
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert clients.session_timeout_s(BASE) == 6.0
    override = BASE.with_overrides(kafka={"session.timeout.ms": "60000"})
    assert clients.session_timeout_s(override) == 60.0
