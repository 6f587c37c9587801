"""Reading the service's output back: views, dead letters, and ``fold`` parity.

Subscribers read with ``read_committed``, so they only ever see whole
batches of the processor (a session's views, checkpoint and offsets commit in
one transaction).  Split views are reassembled (``ViewAssembler``), a
tombstone on a view's head key removes the view, and the paged transcript is
stitched back together so a session's views can be compared with
``processor fold`` (:func:`session_fold_equivalent` vs
:func:`offline_equivalent`).

Readers never hide history: when a (session, view) arrives with a lower
``asOfSeq`` than one already read, the later record wins (it is what the
topic says now, and what compaction will keep) and the regression is
surfaced — logged, counted in :class:`ViewRegression` records, flagged on the
:class:`ViewUpdate` a follower yields — instead of being dropped in silence.
A regression means a processor published from a stale state; hiding it
would show ``status: ok`` while the session is stuck.

Materializing reads every partition from the beginning to its end as it was
when the read started; following first takes such a snapshot and then tails
from exactly where the snapshot ended, so a follower sees every later commit
once and misses none.  Readers never assume the views topic is partitioned by
key hash (the processor writes a session's views to its *events* partition).

The dead-letter readers decode ``DeadLetter`` records; :func:`dead_letter_json`
shows the refused record's value as the decoded event envelope when it is a
readable ``SessionEvent``, else as base64 — the bytes are kept verbatim in the
DLQ precisely so an operator can see what was sent.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
)

from processor.client.topic_reader import (
    _partitions as _partitions,
)
from processor.client.topic_reader import (
    _resume_offsets,
    _snapshot,
    _tail,
    read_committed_records,
)
from processor.client.unit_gate import UnitGate, key_session
from processor.client.view_assembly import DECODED_CACHE_BYTES, PartedViews
from processor.codec import (
    Codec,
    CodecError,
    DeadLetter,
    View,
    ViewAssembler,
    default_codec,
)
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.protocol import (
    CORE_STATE_VERSION,
    CORE_VIEWS,
    VIEW_HEAD,
    is_internal_view,
    is_transcript_page,
    transcript_page,
)

__all__ = [
    "CORE_VIEWS",
    "SessionViews",
    "ViewRecord",
    "ViewRegression",
    "ViewUpdate",
    "ViewsSnapshot",
    "assemble_transcript",
    "dead_letter_json",
    "follow_dead_letters",
    "follow_views",
    "materialize_views",
    "offline_equivalent",
    "read_committed_records",
    "read_dead_letters",
    "read_views",
    "session_fold_equivalent",
    "view_update_json",
]

log = logging.getLogger(__name__)

#: Views every session has besides its domain projection units.


@dataclass(frozen=True, slots=True)
class ViewRecord:
    """One materialized view of one session (``value`` is decoded JSON)."""

    name: str
    as_of_seq: int
    state_version: int
    value: Any


SessionViews = dict[str, ViewRecord]


@dataclass(frozen=True, slots=True)
class ViewUpdate:
    """A committed change of one view; ``record`` is None when it was removed.

    ``regressed_from``: the higher ``asOfSeq`` this view had before, when this
    record went backwards (see the module docstring); None otherwise.
    """

    session_id: str
    view: str
    record: ViewRecord | None
    regressed_from: int | None = None


@dataclass(frozen=True, slots=True)
class ViewRegression:
    """A view record whose ``asOfSeq`` is lower than one read before it."""

    session_id: str
    view: str
    as_of_seq: int
    previous: int
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class ViewsSnapshot:
    views: dict[str, SessionViews]
    regressions: list[ViewRegression]
    #: decoded values the reader dropped at its cache bound (decoded again when needed)
    cache_evictions: int = 0


class _Materializer:
    """Views of all (filtered) sessions, fed records in partition order.

    Session and view come from the decoded record (authoritative: ids may
    contain ``/``); a tombstone has only its key, so keys seen are
    remembered to know what a tombstone removes.  Tombstones of part keys
    (a shrunk split view) need no action.  Records of the parted format
    (``~h`` heads and what they name) are assembled by
    :class:`~processor.client.view_assembly.PartedViews` into the core
    views; a head that names a record not held yet is skipped, so every
    snapshot is consistent.
    """

    def __init__(
        self,
        codec: Codec,
        session: str | None,
        view: str | None,
        cache_bytes: int = DECODED_CACHE_BYTES,
    ) -> None:
        self.codec = codec
        self.session = session
        self.view = view
        self.views: dict[str, SessionViews] = {}
        self.assembler = ViewAssembler()
        self.parted = PartedViews(cache_bytes)
        self._assembled: set[str] = set()  # sessions whose core views are parted
        self._heads: dict[bytes, tuple[str, str]] = {}
        # highest asOfSeq read per (session, view), to see a record go backwards
        self._seen: dict[tuple[str, str], int] = {}
        self._regressed: dict[tuple[str, str], int] = {}
        self.regressions: list[ViewRegression] = []
        self.gate = UnitGate()  # unit records wait for their session's next head
        self.unreadable = 0  # values that do not decode (skipped, logged)

    def apply(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> ViewUpdate | None:
        """:meth:`apply_all`'s last update (a parted head may yield several)."""
        updates = self.apply_all(key, value, partition, offset)
        return updates[-1] if updates else None

    def apply_all(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> list[ViewUpdate]:
        """Take one record; the view updates it completes, in order."""
        if value is None:
            return self._tombstone(key) if key is not None else []
        try:
            part = self.codec.decode_view(value)
        except CodecError as exc:  # skipped and reported (docs/views-format.md, section 2)
            self.unreadable += 1
            log.warning(
                "views record %s@%s (key %r) is unreadable: %s", partition, offset, key, exc
            )
            return []
        if self.session is not None and part.session_id != self.session:
            return []
        if is_internal_view(part.view):
            out: list[ViewUpdate] = []
            if part.view == VIEW_HEAD:  # what the head's transaction wrote before it
                out = self._released(self.gate.release(part.session_id), partition, offset)
            views = self.parted.put(key, part)
            if views is not None:
                out += self._assembled_updates(part, views, partition, offset)
            return out
        if key is not None and self.gate.hold(part.session_id, key, part):
            return []
        return self._unit(key, part, partition, offset)

    def _released(
        self, held: list[tuple[bytes, View | None]], partition: int | None, offset: int | None
    ) -> list[ViewUpdate]:
        out: list[ViewUpdate] = []
        for key, part in held:
            out += (
                self._unit_tombstone(key)
                if part is None
                else self._unit(key, part, partition, offset)
            )
        return out

    def _unit(
        self, key: bytes | None, part: View, partition: int | None, offset: int | None
    ) -> list[ViewUpdate]:
        """A unit view record (or a format-1 core view), applied now."""
        if self.view is not None and part.view != self.view:
            return []
        if part.part == 0 and key is not None:
            self._heads[key] = (part.session_id, part.view)
        ident = (part.session_id, part.view)
        self._check_regression(ident, part.as_of_seq, partition, offset)
        whole: View | None = self.assembler.add(part)
        if whole is None:
            return []  # waiting for the other parts of a split view
        record = ViewRecord(whole.view, whole.as_of_seq, whole.state_version, whole.json_value())
        self.views.setdefault(whole.session_id, {})[whole.view] = record
        return [ViewUpdate(whole.session_id, whole.view, record, self._regressed.pop(ident, None))]

    def _tombstone(self, key: bytes) -> list[ViewUpdate]:
        parted = self.parted.remove(key)
        if parted is not None:
            sid, name = parted
            if name != VIEW_HEAD:
                return []
            # the session is rebuilt from zero: its assembled views go
            out = self._released(self.gate.reset(sid), None, None)
            self._assembled.discard(sid)
            self._seen.pop(parted, None)
            views = self.views.get(sid, {})
            gone = [n for n in views if n in CORE_VIEWS or is_transcript_page(n)]
            for name in gone:
                del views[name]
            return out + [ViewUpdate(sid, n, None) for n in gone if self.view in (None, n)]
        ident = self._heads.get(key)
        owner = ident[0] if ident is not None else key_session(key)
        if owner is not None and self.gate.hold(owner, key, None):
            return []
        return self._unit_tombstone(key)

    def _unit_tombstone(self, key: bytes) -> list[ViewUpdate]:
        ident = self._heads.pop(key, None)
        if ident is None:
            return []
        sid, name = ident
        if sid in self._assembled and (name in CORE_VIEWS or is_transcript_page(name)):
            return []  # a format-1 record the parted format took over
        self.assembler.forget(sid, name)
        self._seen.pop(ident, None)  # a removed view may start again lower
        existed = self.views.get(sid, {}).pop(name, None) is not None
        return [ViewUpdate(sid, name, None)] if existed else []

    def _check_regression(
        self, ident: tuple[str, str], as_of: int, partition: int | None, offset: int | None
    ) -> int | None:
        seen = self._seen.get(ident)
        self._seen[ident] = as_of
        if seen is None or as_of >= seen:
            return None
        # the latest record wins: let the assembler take the lower version
        self.assembler.forget(*ident)
        self._regressed[ident] = seen
        self.regressions.append(ViewRegression(*ident, as_of, seen, partition, offset))
        log.warning(
            "view %s/%s went back from asOfSeq %d to %d (%s@%s): a processor "
            "published from a stale state",
            *ident,
            seen,
            as_of,
            partition,
            offset,
        )
        return seen

    def _assembled_updates(
        self, head: View, views: dict[str, Any], partition: int | None, offset: int | None
    ) -> list[ViewUpdate]:
        sid = head.session_id
        regressed = self._check_regression((sid, VIEW_HEAD), head.as_of_seq, partition, offset)
        self._regressed.pop((sid, VIEW_HEAD), None)
        self._assembled.add(sid)
        current = self.views.setdefault(sid, {})
        out = []
        for name, value in views.items():
            if self.view is not None and name != self.view:
                continue
            old = current.get(name)
            if old is not None and old.value == value and regressed is None:
                continue
            record = ViewRecord(name, head.as_of_seq, CORE_STATE_VERSION, value)
            current[name] = record
            out.append(ViewUpdate(sid, name, record, regressed if name == "status" else None))
        return out


# --------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------


def materialize_views(
    config: ServiceConfig,
    *,
    session: str | None = None,
    view: str | None = None,
    timeout: float = 60.0,
    codec: Codec | None = None,
    cache_bytes: int = DECODED_CACHE_BYTES,
) -> dict[str, SessionViews]:
    """Every committed view, by session and view name, as of now.

    ``session`` / ``view`` keep only those (the whole topic is still read:
    the views of a session live in its events partition, which a reader
    cannot compute without knowing the producers' partitioner).
    ``cache_bytes`` bounds the decoded parted records kept besides the views
    (:class:`~processor.client.view_assembly.DecodedCache`).
    """
    return read_views(
        config, session=session, view=view, timeout=timeout, codec=codec, cache_bytes=cache_bytes
    ).views


def read_views(
    config: ServiceConfig,
    *,
    session: str | None = None,
    view: str | None = None,
    timeout: float = 60.0,
    codec: Codec | None = None,
    cache_bytes: int = DECODED_CACHE_BYTES,
) -> ViewsSnapshot:
    """:func:`materialize_views` plus every ``asOfSeq`` regression met on the way."""
    state = _Materializer(codec or default_codec(), session, view, cache_bytes)
    for m in read_committed_records(
        config, config.topics.views, timeout=timeout, purpose="views-reader"
    ):
        state.apply(m.key(), m.value(), m.partition(), m.offset())
    return ViewsSnapshot(state.views, state.regressions, state.parted.cache.evictions)


def follow_views(
    config: ServiceConfig,
    *,
    session: str | None = None,
    view: str | None = None,
    snapshot: bool = True,
    stop_after_s: float | None = None,
    timeout: float = 60.0,
    codec: Codec | None = None,
    cache_bytes: int = DECODED_CACHE_BYTES,
) -> Iterator[ViewUpdate]:
    """Yield view updates as they commit (until ``stop_after_s`` or forever).

    ``snapshot``: first yield the current value of every view (one update
    each, sessions and views sorted), then the changes after it.  Without it,
    only changes committed after the call are yielded.  ``cache_bytes``: as
    for :func:`materialize_views`.
    """
    state = _Materializer(codec or default_codec(), session, view, cache_bytes)
    topic = config.topics.views
    consumer = clients.plain_consumer(config, "views-follow")
    try:
        if snapshot:
            parts, msgs = _snapshot(consumer, topic, timeout)
            for p in parts:
                for m in msgs[p]:
                    state.apply(m.key(), m.value(), p, m.offset())
            # flag a snapshot value only when it is itself the regressed record
            last = {(r.session_id, r.view): r for r in state.regressions}
            regressed = {
                ident: r.previous
                for ident, r in last.items()
                if (rec := state.views.get(ident[0], {}).get(ident[1])) is not None
                and rec.as_of_seq == r.as_of_seq
            }
            for sid in sorted(state.views):
                for name in sorted(state.views[sid]):
                    yield ViewUpdate(sid, name, state.views[sid][name], regressed.get((sid, name)))
            starts = _resume_offsets(parts, msgs)
        else:
            starts = [(p, OFFSET_END) for p in _partitions(consumer, topic, timeout)]
        for m in _tail(consumer, topic, starts, stop_after_s):
            yield from state.apply_all(m.key(), m.value(), m.partition(), m.offset())
    finally:
        consumer.close()


def view_update_json(update: ViewUpdate) -> dict[str, Any]:
    """One ``--follow`` line: the view with its seq, or ``removed: true``."""
    if update.record is None:
        return {"session": update.session_id, "view": update.view, "removed": True}
    r = update.record
    doc = {
        "session": update.session_id,
        "view": update.view,
        "asOfSeq": r.as_of_seq,
        "stateVersion": r.state_version,
        "value": r.value,
    }
    if update.regressed_from is not None:
        doc["regressedFrom"] = update.regressed_from
    return doc


def assemble_transcript(views: SessionViews) -> list[Any]:
    """The transcript entries, stitched from ``transcript.<n>`` pages in index order.

    The index (``{total, pageSize, pages}``) commits in the same transaction
    as the pages it counts, so a missing page or a count mismatch means the
    views topic is damaged (or was read with ``read_uncommitted``).
    """
    index = views.get("transcript")
    if index is None:
        return []
    out: list[Any] = []
    for n in range(index.value["pages"]):
        page = views.get(transcript_page(n))
        if page is None:
            raise ValueError(f"transcript page {n} is missing")
        out.extend(page.value)
    if len(out) != index.value["total"]:
        raise ValueError(
            f"transcript index says {index.value['total']} entries, the pages hold {len(out)}"
        )
    return out


def session_fold_equivalent(views: SessionViews) -> dict[str, Any]:
    """A session's views shaped like ``processor fold`` output (minus ``checkpoint``).

    ``asOfSeq`` is the ``status`` view's ``lastSeq`` (the session's
    watermark), ``projections`` every non-core view; ``status`` is added so
    a quarantined session never compares equal to a healthy fold.
    """
    status = views["status"].value
    return {
        "asOfSeq": status["lastSeq"],
        "surface": views["surface"].value,
        "messages": views["messages"].value,
        "transcript": assemble_transcript(views),
        "projections": {
            name: rec.value
            for name, rec in views.items()
            if name not in CORE_VIEWS and not is_transcript_page(name)
        },
        "status": status["state"],
    }


def offline_equivalent(fold_output: dict[str, Any]) -> dict[str, Any]:
    """What :func:`session_fold_equivalent` must equal for a healthy session."""
    doc = {k: v for k, v in fold_output.items() if k != "checkpoint"}
    doc["status"] = "ok"
    return doc


# --------------------------------------------------------------------------
# Dead letters
# --------------------------------------------------------------------------


def _letters(codec: Codec, msgs: Iterator[Any], session: str | None) -> Iterator[DeadLetter]:
    for m in msgs:
        value = m.value()
        if value is None:
            continue
        try:
            letter = codec.decode_dead_letter(value)
        except CodecError as exc:
            log.warning(
                "dlq record at %s[%s]@%s is unreadable: %s",
                m.topic(),
                m.partition(),
                m.offset(),
                exc,
            )
            continue
        if session is None or letter.session_id == session:
            yield letter


def read_dead_letters(
    config: ServiceConfig,
    *,
    session: str | None = None,
    timeout: float = 60.0,
    codec: Codec | None = None,
) -> list[DeadLetter]:
    """Every committed dead letter (optionally of one session), oldest first."""
    records = read_committed_records(
        config, config.topics.dlq, timeout=timeout, purpose="dlq-reader"
    )
    letters = list(_letters(codec or default_codec(), iter(records), session))
    return sorted(letters, key=lambda d: (d.timestamp, d.partition, d.offset))


def follow_dead_letters(
    config: ServiceConfig,
    *,
    session: str | None = None,
    from_beginning: bool = True,
    stop_after_s: float | None = None,
    timeout: float = 60.0,
    codec: Codec | None = None,
) -> Iterator[DeadLetter]:
    """Yield dead letters as they commit (the existing ones first by default)."""
    topic = config.topics.dlq
    consumer = clients.plain_consumer(config, "dlq-follow")
    try:
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        starts = [(p, start) for p in _partitions(consumer, topic, timeout)]
        yield from _letters(
            codec or default_codec(), _tail(consumer, topic, starts, stop_after_s), session
        )
    finally:
        consumer.close()


def _bytes_json(raw: bytes | None) -> Any:
    """UTF-8 text when it is text, else ``{"base64": ...}``."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


def dead_letter_json(letter: DeadLetter, codec: Codec | None = None) -> dict[str, Any]:
    """A dead letter as JSON; the refused value as an event envelope when decodable."""
    codec = codec or default_codec()
    doc: dict[str, Any] = {
        "sessionId": letter.session_id,
        "rule": letter.rule,
        "reason": letter.reason,
        "seq": letter.seq,
        "topic": letter.topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "timestamp": letter.timestamp,
        "processor": letter.processor,
        "key": _bytes_json(letter.key),
    }
    if letter.value is None:
        doc["value"] = None
        return doc
    try:
        decoded = codec.decode_event(letter.value)
        doc["event"] = decoded.envelope
        if decoded.producer is not None:
            doc["producer"] = decoded.producer
    except CodecError as exc:
        doc["valueBase64"] = base64.b64encode(letter.value).decode()
        doc["valueError"] = str(exc)
    return doc


#: the public name of a session's views materializer (the inspector's, the query cache's)
Materializer = _Materializer
