"""Check at start that the processor's principal holds the ACLs it needs.

Some missing permissions surface late or never as errors: a consumer
assigned a topic it may not READ idles silently (librdkafka retries), a
missing READ on the checkpoints only shows once a restore has something to
read.  Asking the broker for the principal's authorized operations on every
topic and on the group (KIP-430) names each missing ACL in one line before
the processor joins the group.  Brokers without an authorizer report no
operations; nothing is checked then.
"""

from __future__ import annotations

import contextlib

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from processor.config import ServiceConfig
from processor.service import clients
from processor.service.acls import Acl, required_acls
from processor.service.kafka_errors import ClientProblems, KafkaFatal, error_of, one_line
from processor.service.metrics import Metrics
from processor.service.retry import retry


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


def require_permissions(config: ServiceConfig, problems: ClientProblems, metrics: Metrics) -> None:
    """Raise :class:`KafkaFatal` naming every missing ACL (before joining the group)."""
    missing = missing_or_fatal(config, problems)
    if missing:
        metrics.health.fatal = "; ".join(missing)
        raise KafkaFatal(metrics.health.fatal)
