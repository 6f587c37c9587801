"""``group_protocol = "auto"``: KIP-848 where the broker is ready for it (issue 37).

Under KIP-848 (``group.protocol=consumer``) the broker, not the member,
decides how long a dead member keeps its partitions:
``group.consumer.session.timeout.ms``, 45 s by default with a 45 s minimum.
On a broker left at its defaults KIP-848 would make every failover 45 s long,
so a member started with ``auto`` asks the broker once (DescribeConfigs on
its group) and uses KIP-848 only when the group's session timeout fits the
failover budget (:data:`MAX_SESSION_TIMEOUT_MS`), else the classic protocol,
whose session timeout the member sets itself (``clients.SESSION_TIMEOUT_MS``).
A classic-only ``-X`` setting (``session.timeout.ms``, ...) means classic.
A broker without KIP-848 (before 4.0) has no group configs: classic.  One
log line says which protocol and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

from processor.config import ServiceConfig
from processor.kafka.clients import CLASSIC_ONLY

log = logging.getLogger(__name__)

#: The longest group session timeout KIP-848 is chosen with: a dead member's
#: partitions move after it, and a failover must end within 15 s (issue 37).
MAX_SESSION_TIMEOUT_MS = 10_000
#: The one DescribeConfigs: its request timeout, and how long the start waits.
DESCRIBE_TIMEOUT_S = 5.0

SESSION_KEY = "consumer.session.timeout.ms"
HEARTBEAT_KEY = "consumer.heartbeat.interval.ms"
#: What an operator lowers on the brokers (or per group, ``kafka-configs
#: --entity-type groups``) to get KIP-848
BROKER_HINT = (
    "lower the brokers' group.consumer.session.timeout.ms and "
    "group.consumer.min.session.timeout.ms (e.g. 6000)"
)


@dataclass(frozen=True)
class Choice:
    """The protocol a member runs, and the line that says why."""

    protocol: str  # "classic" or "consumer"
    reason: str
    #: the group's session timeout under KIP-848 (0: unknown or classic)
    session_timeout_ms: int = 0

    def line(self, group: str) -> str:
        return f"group {group!r}: protocol {self.protocol} ({self.reason})"


def choose(group_configs: dict[str, str] | None, error: str | None = None) -> Choice:
    """The protocol for a group whose described configs are ``group_configs``
    (None: not described, ``error`` says why)."""
    if group_configs is None:
        return Choice("classic", f"the group's configs could not be read: {error}")
    raw = group_configs.get(SESSION_KEY)
    if raw is None:
        return Choice("classic", "the broker has no KIP-848 group configs (Kafka < 4.0)")
    try:
        session_ms = int(raw)
    except ValueError:
        return Choice("classic", f"the broker's {SESSION_KEY} is not a number: {raw!r}")
    heartbeat = group_configs.get(HEARTBEAT_KEY, "?")
    if session_ms > MAX_SESSION_TIMEOUT_MS:
        return Choice(
            "classic",
            f"the broker's KIP-848 session timeout is {session_ms} ms, over "
            f"{MAX_SESSION_TIMEOUT_MS} ms: a dead member would keep its partitions that "
            f"long; {BROKER_HINT} to use KIP-848",
        )
    return Choice(
        "consumer",
        f"KIP-848: the broker's session timeout {session_ms} ms, heartbeat {heartbeat} ms",
        session_ms,
    )


def describe_group_configs(admin: Any, group: str, timeout_s: float) -> dict[str, str]:
    """The group's effective configs (raises what the admin client raises)."""
    resource = ConfigResource(ResourceType.GROUP, group)
    futures = admin.describe_configs([resource], request_timeout=timeout_s)
    try:
        entries = next(iter(futures.values())).result(timeout=timeout_s + 1)
    finally:
        admin.poll(0)  # serves its queued log lines
    return {name: entry.value for name, entry in entries.items()}


def resolve(config: ServiceConfig, admin: Any) -> Choice:
    """The protocol a member of ``config`` runs; logs the line once.

    ``admin``: an admin client (``clients.admin``), asked at most once, for
    at most :data:`DESCRIBE_TIMEOUT_S`; any failure falls back to classic."""
    if config.group_protocol != "auto":
        return Choice(config.group_protocol, "set", 0)
    tuned = [key for key in CLASSIC_ONLY if key in config.kafka]
    if tuned:  # an operator's classic tuning, which librdkafka refuses under KIP-848
        choice = Choice("classic", f"-X {', '.join(tuned)} set: a classic protocol setting")
        log.info("%s", choice.line(config.group_id))
        return choice
    try:
        described = describe_group_configs(admin, config.group_id, DESCRIBE_TIMEOUT_S)
    except Exception as exc:  # any failure: classic, with the line
        choice = choose(None, f"{type(exc).__name__}: {exc}")
    else:
        choice = choose(described)
    log.info("%s", choice.line(config.group_id))
    return choice
