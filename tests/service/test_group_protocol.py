"""The group protocol setting (issue 37, item 3): ``classic`` or ``consumer``
(KIP-848; ``auto``, the default, picks one: test_group_protocol_auto.py);
librdkafka takes the settings each one needs and refuses the classic-only
ones under KIP-848 in one line.

Pure: the settings, and librdkafka's own check of them when a consumer is
made (it connects to nothing before it subscribes).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException

from processor.config import ServiceConfig
from processor.kafka import clients

BASE = ServiceConfig(bootstrap_servers="127.0.0.1:1", state_dir="none")


def test_kip848_drops_the_classic_only_settings_and_librdkafka_takes_it() -> None:
    config = BASE.with_overrides(group_protocol="consumer", static_membership=True)
    conf = clients.group_settings(config, "m1")
    assert conf["group.protocol"] == "consumer"
    assert not set(clients.CLASSIC_ONLY) & set(conf)
    assert conf["group.instance.id"] == "m1"
    assert clients.session_timeout_s(config) == 0.0  # the broker's, unknown here
    Consumer(conf).close()


def test_a_classic_only_override_under_kip848_is_refused_in_one_line() -> None:
    config = BASE.with_overrides(group_protocol="consumer", kafka={"session.timeout.ms": "6000"})
    conf = clients.group_settings(config, "m1")
    assert conf["session.timeout.ms"] == "6000"  # kept: never dropped silently
    with pytest.raises(KafkaException, match="session.timeout.ms"):
        Consumer(conf)


def test_an_unknown_group_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="group_protocol"):
        BASE.with_overrides(group_protocol="cooperative")
