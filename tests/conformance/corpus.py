"""The views conformance corpus: building a case from a log, and checking one.

A case (``clients/conformance/views/README.md``) is the records of a views
topic as a subscriber receives them, with the views the reader must show
after each head.  :func:`build_case` runs the Python reader over a log to
write the expectations; :func:`check_case` runs it again over a case file
and reports every difference (the corpus test, and any reader's model).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from processor.client.views_reader import SessionViews, _Materializer
from processor.codec import Codec, CodecError, default_codec
from processor.codec.schemas import InMemorySchemaRegistry
from processor.protocol import VIEW_HEAD

CORPUS_VERSION = 1


@dataclass(frozen=True, slots=True)
class Rec:
    """One record of the views topic."""

    partition: int
    offset: int
    key: bytes
    value: bytes | None


def number(records: Iterable[tuple[int, bytes | None, bytes | None]]) -> list[Rec]:
    """``(partition, key, value)`` in write order -> records with their offsets."""
    offsets: dict[int, int] = {}
    out = []
    for partition, key, value in records:
        assert key is not None
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        out.append(Rec(partition, offset, key, value))
    return out


def compact(records: Sequence[Rec], before: dict[int, int]) -> list[Rec]:
    """The log after the cleaner ran on offsets below ``before[partition]``.

    In the cleaned range only the last record of each key in that range
    survives (the cleaner never looks past it: the active segment is not
    cleaned) and tombstones are gone (their retention passed); the rest of
    the log is untouched.  Offsets keep their gaps.
    """
    last: dict[tuple[int, bytes], int] = {}
    for r in records:
        if r.offset < before.get(r.partition, 0):
            last[(r.partition, r.key)] = r.offset
    kept = []
    for r in records:
        ident = (r.partition, r.key)
        cleaned = r.offset < before.get(r.partition, 0)
        if not cleaned or (last[ident] == r.offset and r.value is not None):
            kept.append(r)
    return kept


def views_json(views: SessionViews) -> dict[str, Any]:
    return {
        name: {"asOfSeq": r.as_of_seq, "stateVersion": r.state_version, "value": r.value}
        for name, r in sorted(views.items())
    }


def _plain(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


class Reader:
    """The Python reader fed one record at a time, saying what a case expects."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.m = _Materializer(codec, None, None)

    def feed(self, r: Rec) -> dict[str, Any] | None:
        """Apply ``r``; the ``expect`` step it calls for, if any."""
        sid: str | None = None
        head = False
        if r.value is not None:
            try:
                view = self.codec.decode_view(r.value)
            except CodecError:
                view = None
            if view is not None:
                sid, head = view.session_id, view.view == VIEW_HEAD
        parts = self.m.parted.sessions.get(sid) if sid is not None else None
        skipped = parts.skipped if parts is not None else 0
        self.m.apply_all(r.key, r.value, r.partition, r.offset)
        if sid is None:
            return None
        if not head and (sid in self.m.gate.gated or view is None or view.view.startswith("~")):
            return None
        parts = self.m.parted.sessions.get(sid)
        assembled = not head or parts is None or parts.skipped == skipped
        return {
            "session": sid,
            "assembled": assembled,
            "views": _plain(views_json(self.m.views.get(sid, {}))),
            "ungated": not head,
        }

    def final(self) -> dict[str, Any]:
        final: dict[str, Any] = _plain(
            {sid: views_json(v) for sid, v in sorted(self.m.views.items()) if v}
        )
        return final


def _same_burst(reader: Reader, r: Rec, sid: str) -> bool:
    """Is ``r`` another ungated unit record of session ``sid``?"""
    assert r.value is not None
    try:
        view = reader.codec.decode_view(r.value)
    except CodecError:
        return False
    return view.session_id == sid and not view.view.startswith("~")


def record_json(r: Rec) -> dict[str, Any]:
    return {
        "partition": r.partition,
        "offset": r.offset,
        "key": base64.b64encode(r.key).decode(),
        "value": None if r.value is None else base64.b64encode(r.value).decode(),
        "headers": [],
    }


def covers(records: Sequence[Rec], codec: Codec) -> list[str]:
    """Tags of what the records exercise (computed, so they never lie)."""
    tags: set[str] = set()
    for r in records:
        if r.value is None:
            tags.add("tombstone")
            if r.key.endswith(b"/~h"):
                tags.add("rebuild")
            continue
        tags.add("confluent" if r.value[:1] == b"\x00" else "single-object")
        v = codec.decode_view(r.value)
        if v.parts > 1:
            tags.add("split")
        if v.view in ("messages", "surface", "status", "transcript"):
            tags.add("format-1")
        if v.view.startswith("~m"):
            tags.add("format-2")
        if v.view.startswith("~b"):
            tags.add("format-3")
            if any(len(e) == 3 for e in v.json_value()):
                tags.add("override")
        if v.view == VIEW_HEAD:
            h = v.json_value()
            if "q" in h:
                tags.add("quarantine")
            if "tb" in h:
                tags.add("format-1")
        if not v.view.startswith("~") and v.state_version >= 0:
            tags.add("units")
    return sorted(tags)


def build_case(
    name: str,
    description: str,
    records: Sequence[Rec],
    *,
    codec: Codec | None = None,
    registry: InMemorySchemaRegistry | None = None,
    cuts: dict[int, int] | None = None,
    extra_tags: Sequence[str] = (),
) -> dict[str, Any]:
    """A corpus case: the records, an ``expect`` after each head, the final views."""
    codec = codec or default_codec()
    reader = Reader(codec)
    steps: list[dict[str, Any]] = []
    marked: set[int] = set()
    pending: dict[str, Any] | None = None
    for r in records:
        cut = (cuts or {}).get(r.partition)
        if cut is not None and r.partition not in marked and r.offset >= cut:
            marked.add(r.partition)
            steps.append({"compaction": {"partition": r.partition, "before": cut}})
        if pending is not None and not (
            r.value is not None and _same_burst(reader, r, pending["session"])
        ):
            steps.append({"expect": pending})
        pending = None
        steps.append({"record": record_json(r)})
        expect = reader.feed(r)
        if expect is not None and expect.pop("ungated"):
            pending = expect  # one expect after a run of one session's ungated records
        elif expect is not None:
            steps.append({"expect": expect})
    if pending is not None:
        steps.append({"expect": pending})
    tags = set(covers(records, codec)) | set(extra_tags)
    if cuts:
        tags.add("compaction")
    if any("expect" in s and not s["expect"]["assembled"] for s in steps):
        tags.add("incomplete")
    doc: dict[str, Any] = {
        "corpus": CORPUS_VERSION,
        "case": name,
        "description": description,
        "covers": sorted(tags),
        "framing": "confluent" if registry is not None else "single-object",
    }
    if registry is not None:
        used = {int.from_bytes(r.value[1:5], "big") for r in records if r.value and r.value[0] == 0}
        doc["registry"] = {str(i): orjson.loads(registry.schema_for_id(i)) for i in sorted(used)}
    doc["steps"] = steps
    doc["final"] = reader.final()
    return doc


class _Registry:
    """A resolver answering from a case's ``registry`` member."""

    def __init__(self, schemas: dict[str, Any]) -> None:
        self.schemas = {int(k): v for k, v in schemas.items()}

    def id_for_schema(self, subject: str, schema: Any) -> int:
        raise AssertionError("a corpus reader never writes")

    def schema_for_id(self, schema_id: int) -> Any:
        return self.schemas[schema_id]


def check_case(doc: dict[str, Any]) -> list[str]:
    """Every difference between the Python reader and the case (empty: it passes)."""
    if doc.get("corpus") != CORPUS_VERSION:
        return [f"corpus version {doc.get('corpus')!r}, this checker reads {CORPUS_VERSION}"]
    registry = doc.get("registry")
    codec = (
        Codec("single-object")
        if registry is None
        else Codec("confluent", resolver=_Registry(registry))
    )
    reader = Reader(codec)
    problems: list[str] = []
    last: dict[str, Any] | None = None
    for i, step in enumerate(doc["steps"]):
        if "record" in step:
            rec = step["record"]
            value = rec["value"]
            last = reader.feed(
                Rec(
                    rec["partition"],
                    rec["offset"],
                    base64.b64decode(rec["key"]),
                    None if value is None else base64.b64decode(value),
                )
            )
        elif "expect" in step:
            want = step["expect"]
            sid = want["session"]
            got = _plain(views_json(reader.m.views.get(sid, {})))
            if got != want["views"]:
                names = sorted(
                    n for n in set(got) | set(want["views"]) if got.get(n) != want["views"].get(n)
                )
                problems.append(f"step {i}: session {sid!r} differs in {names}")
            if last is not None and last["assembled"] != want["assembled"]:
                problems.append(
                    f"step {i}: assembled {last['assembled']}, expected {want['assembled']}"
                )
    if reader.final() != doc["final"]:
        problems.append("final views differ")
    return problems
