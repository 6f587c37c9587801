"""Service configuration: defaults < config file < environment < flags.

Every librdkafka setting passes through untouched (``-X key=value`` on the
command line, ``[kafka]`` in the file, ``PROCESSOR_X_<KEY>`` in the
environment), so SASL, TLS and tuning need no code change.  The keys the
processor owns for correctness (transactions, isolation, assignment
strategy) are applied last and cannot be overridden by accident.
"""

from __future__ import annotations

import os
import socket
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from processor.protocol import TOPIC_SUFFIXES

AnchorPolicy = Literal["fail", "rebuild"]
#: The consumer group protocol: ``classic`` (JoinGroup/SyncGroup, the members
#: assign), ``consumer`` (KIP-848: the broker assigns and times sessions out)
#: or ``auto`` (KIP-848 when the broker's group session timeout is short
#: enough, else classic: ``kafka/group_protocol.py``).
GROUP_PROTOCOLS = ("auto", "classic", "consumer")

_ENV_PREFIX = "PROCESSOR_"


@dataclass(frozen=True)
class TopicNames:
    events: str
    views: str
    checkpoints: str
    dlq: str
    #: operator commands (redrive); only operators may write it
    control: str = ""

    @classmethod
    def for_prefix(cls, prefix: str) -> TopicNames:
        return cls(*(f"{prefix}.{suffix}" for suffix in TOPIC_SUFFIXES))


@dataclass(frozen=True)
class ServiceConfig:
    """All settings of the service; see ``processor run --help`` for each."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "processor"
    #: Read events from this topic instead of ``<prefix>.events`` (blue/green replay).
    events_topic: str = ""
    group_id: str = "processor"
    instance_id: str = ""
    static_membership: bool = False
    #: ``auto``, ``classic`` or ``consumer`` (KIP-848; docs/configuration.md "Group
    #: protocol").  ``auto``: KIP-848 where the broker's group session timeout is
    #: at most 10 s, else classic.
    group_protocol: str = "auto"
    #: Not a setting: the KIP-848 group's session timeout the broker described
    #: when ``auto`` chose KIP-848 (0: unknown).
    group_session_timeout_ms: int = 0
    partitions: int = 12
    replication_factor: int = 1
    exactly_once: bool = True
    commit_interval_ms: int = 200
    max_batch_events: int = 20_000
    #: 0: derived from the commit interval and the revoke budget (see below).
    transaction_timeout_ms: int = 0
    revoke_budget_ms: int = 10_000
    #: How long a restore waits for an open transaction on the checkpoints
    #: partition to end; -1: derived from the transaction timeout, 0: never.
    restore_stable_wait_ms: int = -1
    #: Fence a dead member's transactional id when its open transaction holds
    #: up a newly assigned partition (fencing.py), instead of waiting for the
    #: broker to expire it.
    fence_zombies: bool = True
    anchor_policy: AnchorPolicy = "fail"
    max_view_bytes: int = 512 * 1024
    transcript_page_size: int = 256
    duplicate_window: int = 256
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no HTTP endpoint
    #: Serve the inspector page under /inspect/ on the metrics port (off by default).
    inspect: bool = False
    #: Token the inspector's redrive action requires (empty: redrive disabled).
    inspect_token: str = ""
    #: Serve queries by session (GET /sessions/...) on the metrics port (queries.py).
    queries: bool = False
    #: URL other members redirect queries to (default: the bound metrics port).
    query_advertise: str = ""
    #: Live bytes of the query cache file (query_cache.py); past it a partition is given up.
    query_cache_bytes: int = 1024 * 1024 * 1024
    #: Directory of the query cache file (default: the system's temp dir).
    query_cache_dir: str = ""
    schema_registry: str = ""
    #: Directory of the local state store (SQLite, a cache of the checkpoints
    #: of the owned partitions), under which ``<group_id>/<instance>.sqlite``;
    #: "none" or "": no file, every assignment reads its checkpoints from the topic.
    #: Default ``$PROCESSOR_STATE_DIR`` or ``./state`` (also for configs built in code).
    state_dir: str = field(default_factory=lambda: os.environ.get("PROCESSOR_STATE_DIR", "state"))
    #: Session state held in memory (estimated bytes); least recently used
    #: idle sessions beyond it are evicted and reloaded on their next event.
    state_budget_bytes: int = 128 * 1024 * 1024
    #: Sessions with no event for this long are evicted (0: only the budget evicts).
    idle_evict_s: int = 600
    #: Commits whose checkpoint records may wait for the local store's writer
    #: thread; when full the loop waits (never drops them).
    store_write_queue: int = 64
    #: Live bytes of the local store (its file, or memory under ``state_dir =
    #: "none"``); past it the copies of partitions the member does not own are
    #: dropped, least recently written first; the owned ones alone past it are
    #: reported on ``/readyz`` (checkpoint_store.py ``keep_under_budget``).
    store_bytes: int = 16 * 1024 * 1024 * 1024
    #: Seconds an assigned partition with lag may keep its position before the
    #: progress watchdog seeks it again (0: derived, see ``effective_stall_s``).
    stall_s: int = 0
    #: Seeks the watchdog tries on a stalled partition before ``/readyz`` names it.
    stall_reseeks: int = 2
    #: Seconds a restore's Kafka calls retry a broker fault before the restore is
    #: put off (partitions kept paused, named on ``/readyz``, tried again after a
    #: back-off); default ``retry.DEFAULT_DEADLINE_S``.
    restore_deadline_s: int = 120
    #: Seconds a partition's local store fill (the background one of an
    #: assignment, and the rewind's after an abort) may go without progress
    #: before it is put off the same way; default ``background_fill.STALL_S``.
    fill_stall_s: int = 120
    #: Seconds between catch-ups of the local store's copies of the partitions this
    #: member does not own (standby.py); 0: none kept warm.
    standby_s: float = 0.0
    #: Seconds between the group watch's descriptions of the group (group_watch.py).
    group_watch_s: float = 30.0
    #: Seconds between probes of the cluster while no broker answers (broker_watch.py).
    broker_probe_s: float = 5.0
    #: Seconds a stopped member (SIGTERM) takes at most to exit (stopping.py).
    stop_bound_s: float = 30.0
    #: librdkafka settings; never in repr (it may hold sasl.password).
    kafka: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(
                f"group_protocol must be one of {', '.join(GROUP_PROTOCOLS)}, "
                f"got {self.group_protocol!r}"
            )
        # 0 would put off every restore at its first retry, every fill at once
        for name in ("restore_deadline_s", "fill_stall_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 s, got {getattr(self, name)}")

    @cached_property  # read per produced record: computed once per (frozen) config
    def topics(self) -> TopicNames:
        names = TopicNames.for_prefix(self.topic_prefix)
        return replace(names, events=self.events_topic) if self.events_topic else names

    @property
    def effective_instance_id(self) -> str:
        return self.instance_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"

    @property
    def effective_transaction_timeout_ms(self) -> int:
        """``transaction.timeout.ms`` of the output producer.

        It bounds how long a zombie (a member killed under an id never reused,
        or paused past its session timeout) can keep a transaction open, which
        is how long a new owner of its partitions waits before it restores and
        how long ``read_committed`` readers of those partitions stall.  A
        legitimate transaction lives one commit interval plus its commit, at
        most the revoke budget during a rebalance; the slack covers a commit
        slowed down by a leader election.  Default: 10 s + 2 x 200 ms + 5 s.
        """
        if self.transaction_timeout_ms > 0:
            return self.transaction_timeout_ms
        return self.revoke_budget_ms + 2 * self.commit_interval_ms + 5_000

    @property
    def effective_stall_s(self) -> float:
        """How long a partition with lag may keep its position (``stall_watch.py``).

        Longer than what legitimately holds a position still: a leader election
        (seconds), an open transaction on the events partition (a
        ``read_committed`` reader waits for it, at most a transaction timeout plus
        the broker's 10 s abort check).  Default: twice this member's transaction
        timeout, at least 60 s.
        """
        if self.stall_s > 0:
            return float(self.stall_s)
        return max(60.0, 2 * self.effective_transaction_timeout_ms / 1000)

    @property
    def state_path(self) -> Path | None:
        """The store's file (None: an in-memory store, ``state_dir = "none"``)."""
        if self.state_dir.strip().lower() in ("", "none"):
            return None
        return Path(self.state_dir) / self.group_id / f"{self.store_name}.sqlite"

    @property
    def store_name(self) -> str:
        """The store file's name: the instance id when set, else one per host."""
        return self.instance_id or socket.gethostname()

    def with_overrides(self, **values: Any) -> ServiceConfig:
        clean = {k: v for k, v in values.items() if v is not None}
        return replace(self, **clean)

    # -------------------------------------------------------------- clients

    def common(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.kafka)
        return conf


def _coerce(name: str, raw: Any) -> Any:
    kinds = {f.name: f.type for f in fields(ServiceConfig)}
    kind = str(kinds[name])
    if isinstance(raw, str):
        if "int" in kind:
            return int(raw)
        if "float" in kind:
            return float(raw)
        if "bool" in kind:
            return raw.strip().lower() in ("1", "true", "yes", "on")
    return raw


def parse_kafka_overrides(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["key=value", ...]`` from ``-X`` flags."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-X expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


#: librdkafka keys that hold secrets: read them from a file or the environment,
#: never from the command line (``/proc/<pid>/cmdline`` is world-readable).
SECRET_KEYS = frozenset(
    {
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.pem",
        "sasl.oauthbearer.config",
    }
)


def read_secret_file(path: str | Path) -> dict[str, str]:
    """librdkafka settings from a secret file: ``key=value`` lines, ``#`` comments.

    The file should be readable by the processor's user only (mode 0600).
    """
    out: dict[str, str] = {}
    text = Path(path).read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def secrets_on_command_line(settings: Mapping[str, str]) -> list[str]:
    """Secret keys among ``-X`` settings (the caller warns: they leak via cmdline)."""
    return sorted(k for k in settings if k in SECRET_KEYS)


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    secret_file: str | Path | None = None,
    **flags: Any,
) -> ServiceConfig:
    """Build the config from an optional TOML file, the environment and flags.

    File layout: top-level keys named like the :class:`ServiceConfig` fields
    (``topic_prefix = "prod"``) and a ``[kafka]`` table of librdkafka settings.
    Environment: ``PROCESSOR_<FIELD>`` (e.g. ``PROCESSOR_GROUP_ID``),
    ``PROCESSOR_X_<KEY>`` for librdkafka keys (dots as underscores), and
    ``KAFKA_BOOTSTRAP_SERVERS``.  ``PROCESSOR_CONFIG`` names the file.
    ``secret_file`` (or ``PROCESSOR_KAFKA_SECRET_FILE``): librdkafka settings
    such as ``sasl.password`` from a ``key=value`` file, applied over the
    environment and the config file.
    """
    env = os.environ if env is None else env
    names = {f.name for f in fields(ServiceConfig)} - {"kafka"}
    values: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    path = path or env.get(f"{_ENV_PREFIX}CONFIG")
    if path:
        doc = tomllib.loads(Path(path).read_text())
        for key, value in doc.items():
            if key == "kafka":
                kafka.update({str(k): str(v) for k, v in value.items()})
            elif key in names:
                values[key] = value
            else:
                raise ValueError(f"{path}: unknown setting {key!r}")
    if env.get("KAFKA_BOOTSTRAP_SERVERS"):
        values["bootstrap_servers"] = env["KAFKA_BOOTSTRAP_SERVERS"]
    for key, value in env.items():
        if not key.startswith(_ENV_PREFIX) or key in (
            f"{_ENV_PREFIX}CONFIG",
            f"{_ENV_PREFIX}KAFKA_SECRET_FILE",
        ):
            continue
        rest = key[len(_ENV_PREFIX) :]
        if rest.startswith("X_"):
            kafka[rest[2:].lower().replace("_", ".")] = value
        elif rest.lower() in names:
            values[rest.lower()] = _coerce(rest.lower(), value)
    secret_file = secret_file or env.get(f"{_ENV_PREFIX}KAFKA_SECRET_FILE")
    if secret_file:
        kafka.update(read_secret_file(secret_file))
    extra_kafka = flags.pop("kafka", None) or {}
    for key, value in flags.items():
        if value is not None:
            if key not in names:
                raise ValueError(f"unknown setting {key!r}")
            values[key] = value
    kafka.update(extra_kafka)
    return ServiceConfig(**{k: _coerce(k, v) for k, v in values.items()}, kafka=kafka)
