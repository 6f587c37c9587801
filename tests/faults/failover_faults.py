"""The faults of the failover scenario (issue 37) and how each is done.

- ``kill-new-id`` / ``kill-same-id``: the victim SIGKILLs itself at its next
  transaction once armed (fault point ``before-send-offsets``: a kill -9 that
  always finds a transaction open) and is replaced under a new instance id,
  or started again under its own;
- ``pause``: the victim is SIGSTOPped past its session timeout, then SIGCONTed
  (its transaction is open when it stops: one is open nearly all the time);
- ``kill-group-coordinator`` / ``kill-txn-coordinator``: the broker that
  leads the group's ``__consumer_offsets`` partition, or the
  ``__transaction_state`` partition of a member's transactional id, is
  SIGKILLed once every partition is in sync again (a single fault:
  :func:`wait_replicated`) and started again after :data:`DOWN_S`.  Kafka places both by
  ``abs(String.hashCode(key)) % partitions`` of the topic (the group's id,
  the transactional id); the group's is checked against the coordinator
  ``describe_consumer_groups`` names;
- ``rollout`` / ``rollout-older``: every member SIGTERMed and started again
  under its own id, one after the other, each waiting for the previous one's
  ``/readyz`` (a StatefulSet rollout); ``rollout-older`` runs the middle one
  from the commit before HEAD (``git archive``, ``PYTHONPATH``; same venv).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException

from processor.kafka import clients
from processor.kafka.coordinators import GROUP_STATE_TOPIC, TXN_STATE_TOPIC, coordinator_partition
from tests.faults.conftest import METRICS_URL, REPO, FaultStack, Member, wait_until

#: seconds a killed broker stays down: past the controller's
#: ``broker.session.timeout.ms`` (9 s), so its leaderships move
DOWN_S = 10.0
#: seconds a broker fault waits for the cluster to be fully in sync (then it
#: goes on, its note naming the partitions still behind)
REPLICATED_WITHIN_S = 30.0
#: seconds a rollout waits after its last member is ready before its window closes
ROLLOUT_TAIL_S = 5.0
#: the commit the older member of a mixed rollout runs, and the checkout it is in
OLDER_REV = os.environ.get("PROCESSOR_FAILOVER_OLDER", "HEAD~1")
GIT_DIR = os.environ.get("PROCESSOR_FAILOVER_GIT", str(REPO))
#: every member serves /readyz (a rollout waits for it)
METRICS = ("--metrics-port", "0")


@dataclass
class Fault:
    label: str
    kind: str
    victim: str = ""
    replacement: str = ""
    armed: float = 0.0  # the fault was set off (a victim dies at its next transaction)
    at: float = 0.0  # it took effect (victim dead or stopped, broker killed, rollout began)
    done: float = 0.0  # its own action ended (broker back, rollout's last member ready)
    note: str = ""  # which broker, which commit

    def window(self, window_s: float, lead_s: float) -> tuple[float, float]:
        """Acknowledged between these: the events it may delay.  From ``lead_s``
        before it was armed (the open transaction's events) to ``window_s``
        after it took effect, or a rollout's tail after its last member is ready."""
        tail = self.done + ROLLOUT_TAIL_S if self.kind.startswith("rollout") else 0.0
        return self.armed - lead_s, max(self.at + window_s, tail)


def _leader(stack: FaultStack, topic: str, key: str) -> int:
    md = clients.admin(stack.config).list_topics(topic, timeout=10)
    parts = md.topics[topic].partitions
    return int(parts[coordinator_partition(key, len(parts))].leader)


def under_replicated(stack: FaultStack) -> list[str]:
    """Partitions (``topic[n]``) whose in-sync replicas are fewer than their
    replicas, internal topics included."""
    md = clients.admin(stack.config).list_topics(timeout=10)
    return [
        f"{name}[{n}]"
        for name, topic in md.topics.items()
        for n, part in topic.partitions.items()
        if len(part.isrs) < len(part.replicas)
    ]


def wait_replicated(stack: FaultStack, timeout_s: float = REPLICATED_WITHIN_S) -> str:
    """Until every partition is fully in sync again; what to add to a fault's note.

    A broker fault is a single fault only on a cluster that has recovered from
    the last one: a broker restarted 20 s before may still be out of some ISRs,
    and killing another then leaves those partitions below
    ``min.insync.replicas`` (no transaction commits on them) until one is back.
    """
    t0 = time.monotonic()
    behind: list[str] = []
    while time.monotonic() - t0 < timeout_s:
        try:
            behind = under_replicated(stack)
        except KafkaException:
            behind = ["(metadata unanswered)"]
        if not behind:
            waited = time.monotonic() - t0
            return f", in sync {waited:.1f} s before" if waited >= 0.5 else ""
        time.sleep(0.5)
    return f", {len(behind)} partitions under-replicated at the kill ({', '.join(behind[:4])})"


def group_coordinator(stack: FaultStack) -> int:
    """The group coordinator's broker: the leader of the group's
    ``__consumer_offsets`` partition, checked against the coordinator
    ``describe_consumer_groups`` names when it answers."""
    group = stack.config.group_id
    derived = _leader(stack, GROUP_STATE_TOPIC, group)
    for _ in range(3):
        try:
            admin = clients.admin(stack.config)
            desc = admin.describe_consumer_groups([group], request_timeout=10)
            node = int(desc[group].result(timeout=15).coordinator.id)
        except (KafkaException, TimeoutError):
            continue
        assert node == derived, f"coordinator {node}, __consumer_offsets leader {derived}"
        break
    return derived


def txn_coordinator(stack: FaultStack, instance_id: str) -> int:
    """The transaction coordinator's broker of a member's transactional id."""
    txn_id = clients.transactional_id(stack.config, instance_id)
    return _leader(stack, TXN_STATE_TOPIC, txn_id)


def readyz(member: Member) -> int:
    """The member's /readyz status (0: not serving yet)."""
    try:
        urls = METRICS_URL.findall(member.log.read_text(errors="replace"))
    except OSError:
        return 0
    if not urls:
        return 0
    try:
        with urllib.request.urlopen(urls[-1].removesuffix("/metrics") + "/readyz", timeout=2) as r:
            return int(r.status)
    except OSError:
        return 0


def older_tree(workdir: Path) -> tuple[Path, str] | None:
    """The commit before HEAD, unpacked (None: no git, no such commit)."""
    try:
        rev = subprocess.run(
            ["git", "-C", GIT_DIR, "rev-parse", "--short", "--verify", OLDER_REV],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dest = Path(tempfile.mkdtemp(prefix="older-", dir=workdir))
        archive = subprocess.run(
            ["git", "-C", GIT_DIR, "archive", rev], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return dest, rev


def _dead(member: Member) -> bool:
    return not member.alive()


def _report(member: Member) -> str:
    return f"{member.probe()}\n{member.tail()}"


def _ready(member: Member) -> bool:
    return readyz(member) == 200


class Faults:
    """Does each fault to the stack; ``members`` is the live set it keeps."""

    def __init__(
        self,
        stack: FaultStack,
        env: dict[str, str],
        members: set[str],
        session_timeout_ms: int | None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.stack, self.env, self.members = stack, env, members
        #: None: the member's default (``clients.SESSION_TIMEOUT_MS``)
        self.session_timeout_ms = session_timeout_ms
        self.session_timeout_s = (session_timeout_ms or clients.SESSION_TIMEOUT_MS) / 1000
        self.args = (*METRICS, *args)

    def spawn(self, name: str, env: dict[str, str] | None = None) -> Member:
        # the service's own transaction timeout (0: derived), not the suite's 10 s
        return self.stack.spawn(
            name,
            *self.args,
            env={**self.env, **(env or {})},
            transaction_timeout_ms=0,
            session_timeout_ms=self.session_timeout_ms,
        )

    def do(self, fault: Fault) -> None:
        """Set ``fault`` off; returns once its own action is over (sets its times)."""
        getattr(self, fault.kind.replace("-", "_"))(fault)
        fault.done = fault.done or fault.at

    def _kill(self, fault: Fault) -> None:
        fault.armed = time.monotonic()
        (self.stack.workdir / f"arm-{fault.victim}").touch()
        victim = self.stack.members[fault.victim]
        wait_until(functools.partial(_dead, victim), 30, f"{fault.victim} to die")
        fault.at = time.monotonic()
        assert victim.proc.returncode == -signal.SIGKILL, victim.tail()
        self.spawn(fault.replacement)
        self.members.discard(fault.victim)
        self.members.add(fault.replacement)

    kill_new_id = kill_same_id = _kill

    def pause(self, fault: Fault) -> None:
        victim = self.stack.members[fault.victim]
        fault.armed = fault.at = time.monotonic()
        victim.signal(signal.SIGSTOP)
        time.sleep(self.session_timeout_s + 2)  # past it: the group drops the member
        victim.signal(signal.SIGCONT)
        fault.done = time.monotonic()

    def _kill_broker(self, fault: Fault, node: int) -> None:
        fault.note = f"broker {node}{wait_replicated(self.stack)}"
        fault.armed = fault.at = time.monotonic()
        self.stack.cluster.kill(node)
        time.sleep(DOWN_S)
        self.stack.cluster.restart(node)
        fault.done = time.monotonic()

    def kill_group_coordinator(self, fault: Fault) -> None:
        self._kill_broker(fault, group_coordinator(self.stack))

    def kill_txn_coordinator(self, fault: Fault) -> None:
        # a member whose transaction coordinator is not the group's, if there is one
        group = group_coordinator(self.stack)
        nodes = {m: txn_coordinator(self.stack, m) for m in sorted(self.members)}
        victim = next((m for m, n in nodes.items() if n != group), min(nodes))
        self._kill_broker(fault, nodes[victim])
        fault.note += f" ({victim}'s)"

    def rollout(self, fault: Fault, older: tuple[Path, str] | None = None) -> None:
        fault.armed = fault.at = time.monotonic()
        order = sorted(self.members)
        steps = []
        for i, name in enumerate(order):
            member = self.stack.members[name]
            t0 = time.monotonic()
            member.signal(signal.SIGTERM)
            wait_until(functools.partial(_dead, member), 60, f"{name} to stop (SIGTERM)")
            assert member.proc.returncode == 0, f"{name} exit {member.proc.returncode}"
            t1 = time.monotonic()
            env, on = None, ""
            if older is not None and i == len(order) // 2:
                env, on = {"PYTHONPATH": str(older[0])}, f" on {older[1]}"
            new = self.spawn(name, env)
            wait_until(
                functools.partial(_ready, new),
                120,
                f"{name} ready again",
                functools.partial(_report, new),
            )
            steps.append(f"{name}{on} {t1 - t0:.1f}+{time.monotonic() - t1:.1f}s")
        fault.done = time.monotonic()
        fault.note = "stop+ready: " + ", ".join(steps)

    def rollout_older(self, fault: Fault) -> None:
        older = older_tree(self.stack.workdir)
        self.rollout(fault, older)
        if older is None:
            fault.note += f" (no {OLDER_REV}: every member on this checkout)"
