"""Reading the views topic back: materialize, follow, and compare with ``fold``.

Subscribers read with ``read_committed``, so they only ever see whole
batches of the processor.  Split views are reassembled (``ViewAssembler``),
tombstones remove a view, and the paged transcript is stitched back
together so a session's views can be compared with ``processor fold``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from processor.service import clients
from processor.service.codec import View, ViewAssembler, default_codec
from processor.service.config import ServiceConfig
from processor.service.restore import read_partitions


@dataclass(frozen=True, slots=True)
class ViewRecord:
    """One materialized view of one session."""

    name: str
    as_of_seq: int
    state_version: int
    value: Any


SessionViews = dict[str, ViewRecord]


def _parse_key(key: bytes) -> tuple[str, str, int]:
    text = key.decode("utf-8", "replace")
    sid, _, rest = text.partition("/")
    name, _, part = rest.partition("#")
    return sid, name, int(part) if part else 0


def _apply(views: dict[str, SessionViews], assembler: ViewAssembler, key: bytes | None,
           value: bytes | None, session: str | None, view: str | None) -> ViewRecord | None:
    codec = default_codec()
    if key is None:
        return None
    sid, name, part = _parse_key(key)
    if (session is not None and sid != session) or (view is not None and name != view):
        return None
    if value is None:
        if part == 0:
            views.get(sid, {}).pop(name, None)
            assembler.forget(sid, name)
        return None
    whole: View | None = assembler.add(codec.decode_view(value))
    if whole is None:
        return None
    record = ViewRecord(whole.view, whole.as_of_seq, whole.state_version, whole.json_value())
    views.setdefault(whole.session_id, {})[whole.view] = record
    return record


def materialize_views(config: ServiceConfig, *, session: str | None = None,
                      view: str | None = None, timeout: float = 60.0,
                      ) -> dict[str, SessionViews]:
    """Every committed view, by session and view name, as of now."""
    consumer = clients.plain_consumer(config, "views-reader")
    try:
        meta = consumer.list_topics(config.topics.views, timeout=timeout)
        parts = sorted(meta.topics[config.topics.views].partitions)
        msgs = read_partitions(consumer, config.topics.views,
                               {p: OFFSET_BEGINNING for p in parts}, timeout=timeout)
    finally:
        consumer.close()
    views: dict[str, SessionViews] = {}
    assembler = ViewAssembler()
    for p in parts:
        for m in msgs[p]:
            _apply(views, assembler, m.key(), m.value(), session, view)
    return views


def follow_views(config: ServiceConfig, *, session: str | None = None,
                 view: str | None = None, from_beginning: bool = True,
                 stop_after_s: float | None = None) -> Iterator[tuple[str, ViewRecord]]:
    """Yield ``(session id, view)`` as views commit (runs until stopped)."""
    consumer = clients.plain_consumer(config, "views-follow")
    views: dict[str, SessionViews] = {}
    assembler = ViewAssembler()
    deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
    try:
        meta = consumer.list_topics(config.topics.views, timeout=30)
        start = OFFSET_BEGINNING if from_beginning else -1  # OFFSET_END
        consumer.assign([TopicPartition(config.topics.views, p, start)
                         for p in meta.topics[config.topics.views].partitions])
        while deadline is None or time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"views: {err}")
                    continue
                record = _apply(views, assembler, m.key(), m.value(), session, view)
                if record is not None:
                    key = m.key() or b""
                    yield _parse_key(key)[0], record
    finally:
        consumer.close()


def assemble_transcript(views: SessionViews) -> list[Any]:
    """The transcript entries, stitched from ``transcript.<n>`` pages."""
    index = views.get("transcript")
    if index is None:
        return []
    out: list[Any] = []
    for n in range(index.value["pages"]):
        page = views.get(f"transcript.{n}")
        if page is None:
            raise ValueError(f"transcript page {n} is missing")
        out.extend(page.value)
    return out


CORE_VIEWS = ("messages", "surface", "transcript", "status")


def session_fold_equivalent(views: SessionViews) -> dict[str, Any]:
    """A session's views shaped like ``processor fold`` output (minus ``checkpoint``)."""
    status = views["status"].value
    return {
        "asOfSeq": status["lastSeq"],
        "surface": views["surface"].value,
        "messages": views["messages"].value,
        "transcript": assemble_transcript(views),
        "projections": {name: rec.value for name, rec in views.items()
                        if name not in CORE_VIEWS and not name.startswith("transcript.")},
        "status": status["state"],
    }


def offline_equivalent(fold_output: dict[str, Any]) -> dict[str, Any]:
    """What :func:`session_fold_equivalent` must equal for a healthy session."""
    doc = {k: v for k, v in fold_output.items() if k != "checkpoint"}
    doc["status"] = "ok"
    return doc
