"""The exact ACLs each role needs (README "Security"; the secured-broker tests grant these).

Roles:

- ``processor`` — ``processor run``: reads events and control, restores from
  and writes checkpoints, writes views and dead letters, commits the group's
  offsets in its transactions (transactional ids ``<group>-<instance>``);
- ``writer`` — agents and ``processor ingest``: writes events only;
- ``reader`` — dashboards, ``processor views`` / ``dlq``: reads views and DLQ;
- ``operator`` — ``processor redrive``: writes control commands (and reads
  the views to find a quarantine's seq).

Nothing more: READ and WRITE imply DESCRIBE, no role needs a cluster ACL
(idempotent producers need only WRITE on a topic since Kafka 3.0), and topics
are created by an administrator.  The secured-broker tests run each role
with exactly these and prove that each one is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.config import ServiceConfig

Role = Literal["processor", "writer", "reader", "operator"]
ROLES: tuple[Role, ...] = ("processor", "writer", "reader", "operator")


@dataclass(frozen=True)
class Acl:
    resource: Literal["Topic", "Group", "TransactionalId"]
    name: str
    operation: Literal["READ", "WRITE"]
    prefixed: bool = False

    def __str__(self) -> str:
        pattern = "prefixed" if self.prefixed else "literal"
        return f"{self.operation} on {self.resource} {self.name!r} ({pattern})"


def _topic(name: str, *ops: Literal["READ", "WRITE"]) -> list[Acl]:
    return [Acl("Topic", name, op) for op in ops]


def required_acls(role: Role, config: ServiceConfig) -> list[Acl]:
    t = config.topics
    if role == "processor":
        return [
            *_topic(t.events, "READ"),
            *_topic(t.control, "READ"),
            *_topic(t.checkpoints, "READ", "WRITE"),
            *_topic(t.views, "WRITE"),
            *_topic(t.dlq, "WRITE"),
            Acl("Group", config.group_id, "READ"),
            Acl("TransactionalId", f"{config.group_id}-", "WRITE", prefixed=True),
        ]
    if role == "writer":
        return _topic(t.events, "WRITE")
    if role == "reader":
        return [
            *_topic(t.views, "READ"),
            *_topic(t.dlq, "READ"),
            Acl("Group", f"{config.group_id}-", "READ", prefixed=True),
        ]
    return [
        *_topic(t.control, "WRITE"),
        *_topic(t.views, "READ"),
        Acl("Group", f"{config.group_id}-", "READ", prefixed=True),
    ]


def kafka_acls_commands(role: Role, principal: str, config: ServiceConfig) -> list[str]:
    """``kafka-acls.sh`` lines granting ``role`` to ``principal`` (e.g. ``User:proc``)."""
    out = []
    for acl in required_acls(role, config):
        flag = {"Topic": "--topic", "Group": "--group", "TransactionalId": "--transactional-id"}[
            acl.resource
        ]
        pattern = " --resource-pattern-type prefixed" if acl.prefixed else ""
        out.append(
            f"kafka-acls.sh --bootstrap-server <admin> --add --allow-principal "
            f"{principal} --operation {acl.operation.title()} {flag} {acl.name}{pattern}"
        )
    return out
