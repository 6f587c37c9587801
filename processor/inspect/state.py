"""What the inspector knows: every session's views and dead letters, followed live.

One thread owns one ``read_committed`` consumer.  It reads the views and
dead-letter topics from the beginning, record by record (the page says
"loading" until every partition reached its end once), and goes on tailing.
View records are assembled by the views reader's own materializer (split
parts, tombstones), so the inspector sees exactly what ``processor views``
sees; the thread only adds what a page needs on top:

- a :class:`Summary` per session (status, ``asOfSeq``, last activity = the
  commit time of its newest view record, size = its views' payload bytes
  (zstd above 1 KiB, as on the topic), messages,
  turns and tool calls, dead letters, partition) — the list is paged, searched
  and sorted over these small records, so 100,000 sessions cost one sort of
  100,000 tuples per request, never a table of 100,000 rows in the browser;
- each session's dead letters, at most :data:`MAX_LETTERS_PER_SESSION` kept
  (the count stays exact and the page says how many were dropped);
- change notices for server-sent events: a subscriber holds the ids changed
  since its last read, bounded (past :data:`MAX_PENDING` it is told to resync).

Views are kept as their wire payload (zstd-compressed above 1 KiB, parts
joined) and decoded only when a session page asks, so the memory of the
inspector follows the size of the compacted views topic, not of the
decoded JSON.

The views partition of a session is its events partition (the processor
writes a session's views to the partition it consumed them from), which
is where :mod:`.history` reads its events back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processor.client.views_reader import (
    Materializer,
    SessionViews,
    ViewRecord,
    ViewUpdate,
)
from processor.codec import (
    CodecError,
    DeadLetter,
    View,
    ViewAssembler,
    decode_json_payload,
)
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.reads import records, topic_partitions
from processor.kafka.schema_registry import codec_for

log = logging.getLogger(__name__)

MAX_LETTERS_PER_SESSION = 200
MAX_OFFSETS_PER_SESSION = 100_000
MAX_PENDING = 1_000
MAX_PAGE = 500
SORT_KEYS = (
    "id",
    "status",
    "asOfSeq",
    "lastActivity",
    "bytes",
    "messages",
    "turns",
    "toolCalls",
    "deadLetters",
)


@dataclass(slots=True)
class Summary:
    """One row of the sessions list."""

    id: str
    status: str = "none"  # "ok" | "quarantined" | "none" (dead letters but no views)
    reason: str = ""
    as_of_seq: int = -1
    last_activity: int = 0  # ms since the epoch (Kafka timestamp of the newest view record)
    bytes: int = 0
    messages: int = 0
    turns: int = 0
    tool_calls: int = 0
    dead_letters: int = 0
    partition: int = -1
    sizes: dict[str, int] = field(default_factory=dict)  # view -> payload bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "reason": self.reason,
            "asOfSeq": self.as_of_seq,
            "lastActivity": self.last_activity,
            "bytes": self.bytes,
            "messages": self.messages,
            "turns": self.turns,
            "toolCalls": self.tool_calls,
            "deadLetters": self.dead_letters,
            "partition": self.partition,
        }

    def sort_key(self, key: str) -> Any:
        if key == "id":
            return self.id
        if key == "status":
            return (self.status, self.id)
        return (getattr(self, _ATTR[key]), self.id)


_ATTR = {
    "asOfSeq": "as_of_seq",
    "lastActivity": "last_activity",
    "bytes": "bytes",
    "messages": "messages",
    "turns": "turns",
    "toolCalls": "tool_calls",
    "deadLetters": "dead_letters",
}


@dataclass(slots=True)
class Letters:
    """A session's dead letters: the newest few, how many there were, and where
    the refused records sit (what time travel must leave out), bounded too."""

    total: int = 0
    kept: deque[DeadLetter] = field(default_factory=lambda: deque(maxlen=MAX_LETTERS_PER_SESSION))
    offsets: set[tuple[str, int, int]] = field(default_factory=set)  # (topic, partition, offset)
    offsets_complete: bool = True

    def add(self, letter: DeadLetter) -> None:
        self.total += 1
        self.kept.append(letter)
        if len(self.offsets) < MAX_OFFSETS_PER_SESSION:
            self.offsets.add((letter.topic, letter.partition, letter.offset))
        else:
            self.offsets_complete = False


@dataclass(frozen=True, slots=True)
class Refused:
    """Where a session's refused records sit; ``complete`` False past the bound."""

    offsets: frozenset[tuple[str, int, int]]
    complete: bool


@dataclass(frozen=True, slots=True)
class _Packed:
    """A view value as on the wire (zstd above 1 KiB): what 100,000 sessions cost."""

    encoding: str
    payload: bytes


def _unpack(rec: ViewRecord) -> ViewRecord:
    if not isinstance(rec.value, _Packed):
        return rec
    value = decode_json_payload(rec.value.encoding, rec.value.payload)
    return ViewRecord(rec.name, rec.as_of_seq, rec.state_version, value)


def _fatal_or_logged(m: Any, err: KafkaError) -> None:
    if err.fatal():
        raise RuntimeError(f"{m.topic()}: {err}")
    log.warning("inspector: %s: %s", m.topic(), err)


class _Capturing(ViewAssembler):
    """The views reader's assembler, remembering the last whole view it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.last: View | None = None

    def add(self, view: View) -> View | None:
        self.last = super().add(view)
        return self.last


class Subscriber:
    """Ids changed since the last :meth:`take`; ``session`` filters to one id.

    ``wake`` is called (from the consumer thread) when something arrives;
    the server passes a thread-safe notifier of its event loop.  A new
    subscriber starts with ``resync`` set: a page reads its first state
    before its stream is registered, and whatever changed in between (the
    whole load, on a slow box) would otherwise never be announced to it.
    """

    def __init__(self, session: str | None, wake: Callable[[], None]) -> None:
        self.session = session
        self.wake = wake
        self.pending: set[str] = set()
        self.resync = True

    def take(self) -> tuple[list[str], bool]:
        ids, resync = sorted(self.pending), self.resync
        self.pending = set()
        self.resync = False
        return ids, resync


@dataclass(frozen=True, slots=True)
class Page:
    total: int  # sessions matching the filter
    rows: list[dict[str, Any]]


class InspectorState:
    """Views and dead letters of every session; see the module docstring."""

    def __init__(self, config: ServiceConfig, *, poll_timeout: float = 0.2) -> None:
        self.config = config
        self.codec = codec_for(config)
        self.poll_timeout = poll_timeout
        self._lock = threading.Lock()
        self._mat, self._assembler = self._materializer()
        self._summaries: dict[str, Summary] = {}
        self._letters: dict[str, Letters] = {}
        self._subscribers: list[Subscriber] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.loaded = threading.Event()
        self.error: str | None = None
        self.records = 0

    def _materializer(self) -> tuple[Materializer, _Capturing]:
        mat = Materializer(self.codec, None, None)
        mat.assembler = _Capturing()
        return mat, mat.assembler

    # ------------------------------------------------------------ lifecycle

    def start(self) -> InspectorState:
        self._thread = threading.Thread(target=self._run, name="inspector-state", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                self._follow()
                return
            except Exception as exc:  # shown on the page and /api/health, retried with backoff
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("inspector: %s (retrying in %.1fs)", self.error, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
                self._reset()

    def _reset(self) -> None:
        """Start over after an error: what was read may be incomplete."""
        self.loaded.clear()
        with self._lock:
            self._mat, self._assembler = self._materializer()
            self._summaries.clear()
            self._letters.clear()

    def _follow(self) -> None:
        """Read both topics from the beginning, streaming (never the whole topic in
        memory at once); ``loaded`` once every partition reached its end, then tail."""
        topics = self.config.topics
        consumer = clients.plain_consumer(self.config, "inspector")
        try:
            starts = [
                TopicPartition(t, p, OFFSET_BEGINNING)
                for t in (topics.views, topics.dlq)
                for p in topic_partitions(consumer, t, 60.0)
            ]
            loading = {(tp.topic, tp.partition) for tp in starts}
            consumer.assign(starts)
            self.error = None
            self._consume(consumer, loading)
        finally:
            consumer.close()

    def _consume(self, consumer: Consumer, loading: set[tuple[str, int]]) -> None:
        views_topic = self.config.topics.views
        while not self._stop.is_set():
            msgs = consumer.consume(500, timeout=self.poll_timeout)
            views: list[Any] = []
            letters: list[Any] = []
            on_end = lambda m: loading.discard((m.topic(), m.partition()))  # noqa: E731
            for m in records(msgs, on_end=on_end, on_error=_fatal_or_logged):
                (views if m.topic() == views_topic else letters).append(m)
            changed: set[str] = set()
            self._views(views, changed)
            self._dead_letters(letters, changed)
            if not loading and not self.loaded.is_set():
                self.loaded.set()
                self._notify(changed, resync=True)
            elif changed and self.loaded.is_set():
                self._notify(changed)

    # ------------------------------------------------------------ folding records in

    def _views(self, msgs: Iterable[Any], changed: set[str]) -> None:
        with self._lock:
            for m in msgs:
                self.records += 1
                self._assembler.last = None  # assembled (parted) views are not packed
                try:
                    updates = self._mat.apply_all(m.key(), m.value())
                except CodecError as exc:
                    log.warning(
                        "inspector: view record %s[%s]@%s unreadable: %s",
                        m.topic(),
                        m.partition(),
                        m.offset(),
                        exc,
                    )
                    continue
                for update in updates:  # none: a part still waiting for the others
                    sid = update.session_id
                    summary = self._summary(sid)
                    summary.partition = m.partition()
                    ts = m.timestamp()[1]
                    if ts > summary.last_activity:
                        summary.last_activity = ts
                    self._pack(summary, update)
                    value = update.record.value if update.record is not None else None
                    self._refresh(summary, update.view, value)
                    changed.add(sid)

    def _pack(self, summary: Summary, update: ViewUpdate) -> None:
        """Keep the view as its wire payload (decoded again only when asked for) and
        count its payload bytes in the session's size."""
        summary.bytes -= summary.sizes.pop(update.view, 0)
        whole = self._assembler.last
        if (
            update.record is None
            or whole is None
            or whole.view != update.view
            or whole.session_id != update.session_id
        ):
            return
        r = update.record
        self._mat.views[update.session_id][update.view] = ViewRecord(
            r.name, r.as_of_seq, r.state_version, _Packed(whole.encoding, whole.value)
        )
        summary.sizes[update.view] = len(whole.value)
        summary.bytes += len(whole.value)

    def _summary(self, sid: str) -> Summary:
        s = self._summaries.get(sid)
        if s is None:
            s = self._summaries[sid] = Summary(sid)
        return s

    @staticmethod
    def _refresh(s: Summary, view: str, value: Any) -> None:
        """Update the summary fields a view feeds (``value`` None: the view is gone)."""
        if view == "status":
            doc = value if isinstance(value, dict) else {}
            s.status = str(doc.get("state", "none"))
            s.as_of_seq = int(doc.get("lastSeq", -1))
            q = doc.get("quarantine")
            s.reason = f"{q.get('rule')}: {q.get('reason')}" if isinstance(q, dict) else ""
        elif view == "messages":
            s.messages = len(value) if isinstance(value, list) else 0
        elif view == "sessionStats":
            doc = value if isinstance(value, dict) else {}
            s.turns = int(doc.get("turns", 0))
            s.tool_calls = int(doc.get("toolCalls", 0))

    def _dead_letters(self, msgs: Iterable[Any], changed: set[str]) -> None:
        with self._lock:
            for m in msgs:
                self.records += 1
                if m.value() is None:
                    continue
                try:
                    letter = self.codec.decode_dead_letter(m.value())
                except CodecError as exc:
                    log.warning(
                        "inspector: dlq record %s[%s]@%s unreadable: %s",
                        m.topic(),
                        m.partition(),
                        m.offset(),
                        exc,
                    )
                    continue
                sid = letter.session_id or ""
                box = self._letters.setdefault(sid, Letters())
                box.add(letter)
                summary = self._summary(sid)
                summary.dead_letters = box.total
                if summary.partition < 0:
                    summary.partition = letter.partition
                ts = m.timestamp()[1]
                if ts > summary.last_activity:
                    summary.last_activity = ts
                changed.add(sid)

    # ------------------------------------------------------------ notices

    def subscribe(self, session: str | None, wake: Callable[[], None]) -> Subscriber:
        sub = Subscriber(session, wake)
        with self._lock:
            self._subscribers.append(sub)
        sub.wake()  # its first notice: the resync it starts with
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def take(self, sub: Subscriber) -> tuple[list[str], bool]:
        with self._lock:
            return sub.take()

    def _notify(self, changed: set[str], resync: bool = False) -> None:
        with self._lock:
            woken = []
            for sub in self._subscribers:
                mine = changed if sub.session is None else changed & {sub.session}
                if not mine and not resync:
                    continue
                if resync or len(sub.pending) + len(mine) > MAX_PENDING:
                    sub.resync = True
                    sub.pending.clear()
                else:
                    sub.pending.update(mine)
                woken.append(sub)
        for sub in woken:
            sub.wake()

    # ------------------------------------------------------------ queries

    def page(
        self,
        *,
        query: str = "",
        status: str = "",
        sort: str = "lastActivity",
        descending: bool = True,
        offset: int = 0,
        limit: int = 50,
    ) -> Page:
        """Sessions matching ``query`` (substring of the id) and ``status``, sorted, paged."""
        if sort not in SORT_KEYS:
            raise ValueError(f"unknown sort key {sort!r}; one of {', '.join(SORT_KEYS)}")
        limit = max(1, min(limit, MAX_PAGE))
        offset = max(0, offset)
        needle = query.casefold()
        with self._lock:
            rows = [
                s
                for s in self._summaries.values()
                if (not needle or needle in s.id.casefold()) and (not status or s.status == status)
            ]
            rows.sort(key=lambda s: s.sort_key(sort), reverse=descending)
            return Page(len(rows), [s.to_json() for s in rows[offset : offset + limit]])

    def counts(self) -> dict[str, int]:
        with self._lock:
            quarantined = sum(1 for s in self._summaries.values() if s.status == "quarantined")
            return {
                "sessions": len(self._summaries),
                "quarantined": quarantined,
                "records": self.records,
            }

    def session(self, sid: str) -> tuple[Summary, SessionViews, list[DeadLetter], int] | None:
        """A session's summary, views, kept dead letters and their total (or None)."""
        with self._lock:
            s = self._summaries.get(sid)
            if s is None:
                return None
            box = self._letters.get(sid) or Letters()
            copy = Summary(**{f: getattr(s, f) for f in Summary.__slots__ if f != "sizes"})
            packed = dict(self._mat.views.get(sid, {}))
            letters = list(box.kept)
        views = {name: _unpack(rec) for name, rec in packed.items()}
        return copy, views, letters, box.total

    def refused(self, sid: str) -> Refused:
        """Every refused record of ``sid`` the DLQ holds (up to the bound)."""
        with self._lock:
            box = self._letters.get(sid) or Letters()
            return Refused(frozenset(box.offsets), box.offsets_complete)

    def wait_loaded(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.loaded.wait(0.1):
            if time.monotonic() > deadline:
                return False
        return True
