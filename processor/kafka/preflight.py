"""Check at start that the processor's principal holds the ACLs it needs,
and that the topics are laid out as the service relies on.

Some missing permissions surface late or never as errors: a consumer
assigned a topic it may not READ idles silently (librdkafka retries), a
missing READ on the checkpoints only shows once a restore has something to
read.  Asking the broker for the principal's authorized operations on every
topic and on the group (KIP-430) names each missing ACL in one line before
the processor joins the group.  Brokers without an authorizer report no
operations; nothing is checked then.

The layout (:func:`layout_problems`) is what ``processor topics verify``
checks, as far as it breaks the service: a views, checkpoints, dead-letter
or control topic with another partition count than events breaks the
co-partitioning (transactions aborting on a partition that does not exist,
restores put off for ever, or commands refused), a checkpoints or views
topic that is not compacted loses what a restore or a reader needs once
retention runs, and a compacted events topic keeps only each session's
last event.  None of these showed at start: the process ran, ``/readyz``
turned green, and the damage came later.  Each now ends the start with one
line, as a missing ACL does.
"""

from __future__ import annotations

import contextlib
import logging

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.acls import Acl, required_acls
from processor.kafka.client_errors import ClientProblems, KafkaFatal, error_of, one_line
from processor.kafka.retry import observing, retry
from processor.kafka.topic_admin import topic_specs
from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


def missing_permissions(
    admin: AdminClient, config: ServiceConfig, timeout: float = 15.0
) -> list[str]:
    """Missing ACLs of the ``processor`` role (TransactionalId is checked by init)."""
    wanted = [a for a in required_acls("processor", config) if a.resource != "TransactionalId"]
    topics = sorted({a.name for a in wanted if a.resource == "Topic"})
    granted: dict[tuple[str, str], set[str] | None] = {}
    problems: list[str] = []
    futures = admin.describe_topics(
        TopicCollection(topics), request_timeout=timeout, include_authorized_operations=True
    )
    for name, future in futures.items():
        try:
            ops = future.result().authorized_operations
            granted[("Topic", name)] = None if not ops else {op.name for op in ops}
        except KafkaException as exc:
            err = error_of(exc)
            if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                granted[("Topic", name)] = set()
            elif err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                problems.append(f"topic {name!r} does not exist (run `processor topics create`)")
                granted[("Topic", name)] = None
            else:
                raise
    groups = [a.name for a in wanted if a.resource == "Group"]
    for name, future in admin.describe_consumer_groups(
        groups, include_authorized_operations=True, request_timeout=timeout
    ).items():
        try:
            ops = future.result().authorized_operations
            granted[("Group", name)] = None if not ops else {op.name for op in ops}
        except KafkaException as exc:
            err = error_of(exc)
            if err is None or err.code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise
            granted[("Group", name)] = set()
    missing: list[Acl] = []
    for acl in wanted:
        have = granted.get((acl.resource, acl.name))
        if have is not None and acl.operation not in have and "ALL" not in have:
            missing.append(acl)
    if missing:
        problems.insert(
            0,
            "not authorized: missing ACL(s) "
            + ", ".join(map(str, missing))
            + " (see README, Security)",
        )
    return problems


def _checked(admin: AdminClient, config: ServiceConfig, problems: ClientProblems) -> list[str]:
    """One attempt; a failed handshake (error_cb) ends the retries at once."""
    with contextlib.suppress(KafkaException):
        admin.poll(0)
    problems.raise_if_fatal()
    return missing_permissions(admin, config)


def missing_or_fatal(config: ServiceConfig, problems: ClientProblems) -> list[str]:
    """:func:`missing_permissions` with its own admin client; a failure is KafkaFatal."""
    admin = clients.admin(config, problems)
    try:
        # a cluster just started answers COORDINATOR_LOAD_IN_PROGRESS for a while:
        # transient errors are retried (bounded), denials and the rest are not
        return retry(lambda: _checked(admin, config, problems), "permission check", deadline_s=60)
    except KafkaException as exc:
        with contextlib.suppress(KafkaException):
            admin.poll(0)
        problems.raise_if_fatal()
        raise KafkaFatal(f"cannot check permissions: {one_line(exc)}") from None


#: what breaks when a topic's cleanup.policy is not the one ``topic_specs``
#: gives it (the policies themselves come from there, as for ``topics create``)
_WHY_POLICY = {
    "events": "compaction keeps only each session's last event",
    "views": "retention deletes view parts that are written once",
    "checkpoints": "retention deletes the checkpoints of idle sessions",
}


def layout_problems(admin: AdminClient, config: ServiceConfig, timeout: float = 15.0) -> list[str]:
    """What in the topic layout breaks the service (empty: nothing).

    Partition counts come from the metadata (DESCRIBE, implied by the
    processor's ACLs); cleanup policies need DESCRIBE_CONFIGS, which the
    processor role does not have to hold: when the broker refuses them, that
    part is skipped with a warning (``processor topics verify`` checks it with
    an administrator's rights).  A missing topic is the permission check's.
    """
    t = config.topics
    meta = admin.list_topics(timeout=timeout).topics
    events = meta.get(t.events)
    if events is None or events.error is not None or not events.partitions:
        return []
    n = len(events.partitions)
    problems: list[str] = []
    for name in (t.views, t.checkpoints, t.dlq, t.control):
        other = meta.get(name)
        if other is None or other.error is not None or not other.partitions:
            continue
        if len(other.partitions) != n:
            problems.append(
                f"topic {name!r} has {len(other.partitions)} partitions, {t.events!r} has "
                f"{n}: they must be co-partitioned (a session's views, checkpoints, dead "
                "letters and commands use its events partition's number)"
            )
    wanted = {spec.name: spec.configs["cleanup.policy"] for spec in topic_specs(config)}
    names = {kind: getattr(t, kind) for kind in _WHY_POLICY}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names.values()]
    try:
        configs = {
            r.name: {k: v.value for k, v in f.result().items()}
            for r, f in admin.describe_configs(resources, request_timeout=timeout).items()
        }
    except KafkaException as exc:
        log.warning(
            "cleanup policies of the topics not checked (%s); `processor topics verify` "
            "checks them with an administrator's rights",
            one_line(exc),
        )
        return problems
    for kind, why in _WHY_POLICY.items():
        policy = wanted[names[kind]]
        have = configs.get(names[kind], {}).get("cleanup.policy")
        if have is not None and have != policy:
            problems.append(
                f"topic {names[kind]!r} has cleanup.policy={have}, expected {policy}: {why} "
                "(see `processor topics verify`)"
            )
    retention = configs.get(t.events, {}).get("retention.ms")
    if retention is not None and retention != "-1":
        # not fatal: the anchor check fails loudly once retention reaches a
        # checkpoint's anchor; but a replay from offset zero misses what is gone
        log.warning(
            "topic %r has retention.ms=%s: the events log should be kept forever (-1); "
            "restores and replays need it",
            t.events,
            retention,
        )
    return problems


def layout_or_fatal(config: ServiceConfig, problems: ClientProblems) -> list[str]:
    """:func:`layout_problems` with its own admin client; a failure is KafkaFatal."""
    admin = clients.admin(config, problems)
    try:
        return retry(lambda: layout_problems(admin, config), "topic layout check", deadline_s=60)
    except KafkaException as exc:
        problems.raise_if_fatal()
        raise KafkaFatal(f"cannot check the topic layout: {one_line(exc)}") from None


def require_permissions(config: ServiceConfig, problems: ClientProblems, metrics: Metrics) -> None:
    """Raise :class:`KafkaFatal` naming every missing ACL, or else every problem
    of the topic layout (before joining the group).

    Its retries are observed: a broker that does not answer (a wrong bootstrap
    address, the cluster down) is named on ``/readyz`` while they last (up to a
    minute), not hidden behind ``not ready: restoring``."""
    with observing(metrics.retries):
        missing = missing_or_fatal(config, problems) or layout_or_fatal(config, problems)
    if missing:
        metrics.health.fatal = "; ".join(missing)
        raise KafkaFatal(metrics.health.fatal)
