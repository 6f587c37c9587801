"""A session's events read back from the events topic, and folds of any prefix.

Time travel is an *offline* fold of the session's own events up to a seq,
through the same core :class:`~processor.core.session.Session` the processor
and ``processor fold`` use — no rule is re-implemented here.  What the
processor refused is known exactly: every refused record is in the DLQ with
its partition and offset, so the fold skips precisely those records (and
control records), drops exact re-sends (seq already folded) and stops at the
chosen seq.  A record the core refuses that is not (yet) in the DLQ is
skipped too and reported, never hidden.

The same fold at the views' own ``asOfSeq`` gives what the views do not
carry: the surface with each node's event type, the committed replacements
(range and shadowed seqs, with the shadowed messages from the log) and the
image-offload overrides.

Reading: a session's events live in one partition of the events topic (the
one its views were written to).  The partition is read from the beginning
once and then only its new records; the few most recently inspected sessions
are cached (:data:`MAX_CACHED_SESSIONS`, at most :data:`MAX_EVENTS` records
each — past that the page says the session is too long to travel).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from processor.client.views_reader import offline_equivalent
from processor.codec import CodecError, DecodedEvent
from processor.config import ServiceConfig
from processor.core.defaults import new_session
from processor.core.errors import SessionError, Unavailable
from processor.core.session import Session, synthetic_header
from processor.kafka import clients
from processor.kafka.reads import read_key_range, watermarks
from processor.kafka.schema_registry import codec_for
from processor.offline import session_output

MAX_CACHED_SESSIONS = 16
MAX_EVENTS = 200_000
MAX_DIFF_ENTRIES = 300
READ_TIMEOUT_S = 60.0


class HistoryError(Unavailable, RuntimeError):
    """The session's events cannot be read or folded (shown on the page)."""


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """One record of the session in the events topic."""

    offset: int
    decoded: DecodedEvent | None  # None: control record or undecodable
    note: str = ""  # why it is not an event


@dataclass(slots=True)
class _Cached:
    partition: int
    next_offset: int = 0
    records: list[LoggedRecord] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Fold:
    """The outcome of folding a session's records up to ``upto``."""

    session: Session
    skipped: list[dict[str, Any]]  # records left out, with why
    last_seq_in_log: int
    envelopes: Mapping[int, dict[str, Any]]  # seq -> the folded event's envelope


class EventHistory:
    """Reads and caches sessions' events; thread-safe."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.codec = codec_for(config)
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._lock = threading.Lock()

    def records(self, sid: str, partition: int) -> list[LoggedRecord]:
        """Every record of ``sid`` in its events partition, oldest first."""
        if partition < 0:
            raise HistoryError(f"session {sid}: its events partition is not known yet")
        with self._lock:
            cached = self._cache.pop(sid, None)
            if cached is None or cached.partition != partition:
                cached = _Cached(partition)
            self._cache[sid] = cached
            while len(self._cache) > MAX_CACHED_SESSIONS:
                self._cache.popitem(last=False)
            self._read_new(sid, cached)
            return list(cached.records)

    def _read_new(self, sid: str, cached: _Cached) -> None:
        topic, partition = self.config.topics.events, cached.partition
        room = MAX_EVENTS - len(cached.records)
        consumer = clients.plain_consumer(self.config, "inspector-history")
        try:
            _low, high = watermarks(consumer, topic, partition, timeout=READ_TIMEOUT_S)
            if high <= cached.next_offset:
                return
            msgs = read_key_range(
                consumer,
                topic,
                partition,
                cached.next_offset,
                high,
                sid.encode(),
                deadline_s=READ_TIMEOUT_S,
                limit=room,
            )
        except KafkaException as exc:
            raise HistoryError(f"reading {topic}[{partition}]: {exc}") from None
        finally:
            consumer.close()
        if len(msgs) > room:
            raise HistoryError(
                f"session {sid} has more than {MAX_EVENTS} records; "
                "too long to fold in the inspector"
            )
        cached.records.extend(self._record(m) for m in msgs)
        cached.next_offset = high

    def _record(self, m: Any) -> LoggedRecord:
        headers = dict(m.headers() or [])
        if m.value() is None:
            what = ", ".join(sorted(headers)) or "no value"
            return LoggedRecord(m.offset(), None, f"control record ({what})")
        try:
            return LoggedRecord(m.offset(), self.codec.decode_event(m.value()))
        except CodecError as exc:
            return LoggedRecord(m.offset(), None, f"undecodable: {exc}")


def fold_records(
    sid: str, records: Sequence[LoggedRecord], dead_offsets: set[int], upto: int | None
) -> Fold:
    """Fold ``sid``'s records (offset order) up to seq ``upto`` (None: all)."""
    session = new_session(synthetic_header(sid))
    skipped: list[dict[str, Any]] = []
    envelopes: dict[int, dict[str, Any]] = {}
    last_in_log = -1
    for rec in records:
        if rec.decoded is None:
            continue  # control records, undecodable bytes (the latter are dead letters)
        seq = rec.decoded.seq
        last_in_log = max(last_in_log, seq)
        if upto is not None and seq > upto:
            continue
        if rec.offset in dead_offsets:
            skipped.append({"offset": rec.offset, "seq": seq, "why": "dead letter"})
            continue
        if seq <= session.last_seq:
            continue  # a re-send of a folded seq: the processor drops it or dead-letters it
        try:
            session.append(rec.decoded.to_event())
        except SessionError as exc:
            skipped.append({"offset": rec.offset, "seq": seq, "why": str(exc)})
            continue
        envelopes[seq] = rec.decoded.envelope
    return Fold(session, skipped, last_in_log, envelopes)


def fold_document(fold: Fold) -> dict[str, Any]:
    """The fold shaped like :func:`~processor.client.views_reader.session_fold_equivalent`."""
    return offline_equivalent(session_output(fold.session))


def _preview(message: Any) -> str:
    if not isinstance(message, Mapping):
        return ""
    parts = []
    for block in message.get("content") or ():
        if isinstance(block, Mapping):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(f"[{block.get('type')}]")
    return " ".join(parts)[:200]


def surface_detail(fold: Fold) -> dict[str, Any]:
    """The surface as the model sees it: nodes in order, replacements, overrides."""
    state = fold.session.surface.state
    replaced_by = {r.seq: r for r in state.replacements}
    nodes = []
    for seq in state.nodes:
        event = state.node_events[seq]
        node: dict[str, Any] = {
            "seq": seq,
            "type": event.type,
            "message": state.message_of(seq),
            "projected": seq in state.overrides,
        }
        r = replaced_by.get(seq)
        if r is not None:
            node["replace"] = r.to_json()
        nodes.append(node)
    replacements = []
    for r in state.replacements:
        shadowed = []
        for s in r.shadowed:
            env = fold.envelopes.get(s)
            msg = None
            if env is not None:
                msg = (
                    env["data"]
                    if env["type"] == "user/message"
                    else (env["data"].get("message") if isinstance(env["data"], dict) else None)
                )
            shadowed.append(
                {
                    "seq": s,
                    "type": env["type"] if env else None,
                    "role": msg.get("role") if isinstance(msg, Mapping) else None,
                    "preview": _preview(msg),
                }
            )
        replacements.append({**r.to_json(), "shadowedMessages": shadowed})
    return {
        "asOfSeq": fold.session.last_seq,
        "replaceGeneration": state.replace_generation,
        "contentGeneration": state.content_generation,
        "nodes": nodes,
        "replacements": replacements,
        "projectedSeqs": sorted(state.overrides),
        "skipped": fold.skipped,
        "lastSeqInLog": fold.last_seq_in_log,
    }


def diff(
    then: Any,
    now: Any,
    path: str = "",
    out: list[dict[str, Any]] | None = None,
    limit: int = MAX_DIFF_ENTRIES,
) -> list[dict[str, Any]]:
    """Paths where ``then`` and ``now`` differ (added / removed / changed), bounded."""
    out = [] if out is None else out
    if len(out) >= limit or then == now:
        return out
    if isinstance(then, Mapping) and isinstance(now, Mapping):
        for k in sorted(set(then) | set(now), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in then:
                out.append({"path": p, "kind": "added", "now": now[k]})
            elif k not in now:
                out.append({"path": p, "kind": "removed", "then": then[k]})
            else:
                diff(then[k], now[k], p, out, limit)
            if len(out) >= limit:
                break
        return out
    if isinstance(then, list) and isinstance(now, list):
        for i in range(max(len(then), len(now))):
            p = f"{path}[{i}]"
            if i >= len(then):
                out.append({"path": p, "kind": "added", "now": now[i]})
            elif i >= len(now):
                out.append({"path": p, "kind": "removed", "then": then[i]})
            else:
                diff(then[i], now[i], p, out, limit)
            if len(out) >= limit:
                break
        return out
    out.append({"path": path or "(root)", "kind": "changed", "then": then, "now": now})
    return out
