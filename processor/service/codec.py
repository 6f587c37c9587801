"""Avro codec of the service layer: events, views, checkpoints, dead letters.

The Avro schemas in ``schemas/*.avsc`` (namespace ``processor.v1``) are the
contract for other languages.  Each schema file is parsed once, lazily, into a
process-wide :class:`SchemaStore`; every record is written with fastavro's
schemaless writer and *framed* so a reader knows the writer's schema.

Framing
-------
``single-object`` (default)
    Avro single-object encoding: ``C3 01`` + the 8-byte little-endian
    CRC-64-AVRO fingerprint of the writer schema's parsing canonical form +
    the schemaless body.  The fingerprint is looked up among every ``.avsc``
    of the schema folder, current and ``history/``; the body is then read with
    the *current* schema of that record type (Avro schema resolution, so old
    records stay readable after a compatible change).  When the writer is the
    current schema no resolution happens.
``confluent``
    Confluent wire format: ``00`` + 4-byte big-endian schema id + the body.
    Ids come from a :class:`SchemaIdResolver` (a registry client; the
    subject passed is the record's full name, i.e. RecordNameStrategy — a
    client wanting TopicNameStrategy maps it).  :class:`InMemorySchemaRegistry`
    is the test implementation.  Decoding always accepts both framings (the
    first byte tells them apart), so a topic can migrate between them.

Any malformed input — bad marker, unknown fingerprint or id, truncated body,
trailing bytes, non-JSON ``data`` — raises :class:`CodecError` and nothing
else, so the runner can dead-letter the record and keep the partition flowing.

Events (``SessionEvent``)
-------------------------
The camelCase JSON envelope maps field by field; ``data`` travels as JSON
text.  Optional keys map to ``null`` when absent.  A present value that does
not fit the typed branch of its union — a malformed op, an explicit JSON
``null``, a string other than ``"append"``, a non-boolean ``ignorable`` — is
carried verbatim as ``OpaqueJson`` (its JSON text), so
``decode_event(encode_event(s, e)).envelope == e`` for every JSON envelope with
the known keys, and the processor rejects a bad envelope with exactly the error
it would give on the JSON.  The typed branches are therefore trustworthy for
other-language readers: the string branch is always ``"append"``, ``ReplaceOp``
is always ``{op: "replace", startSeq, endSeq}`` with non-negative integers,
and the array branch is a list of integers (distinctness and bounds are the
planner's S-3 checks).  ``ignorable`` also has an ``OpaqueJson`` branch
(beyond ``[null, boolean]``) because an explicit ``"ignorable": null`` is an
E-2 error that must not turn into "absent".

What cannot be carried raises :class:`CodecError` at encode time: unknown
envelope keys (E-1), missing ``type``/``seq``/``time``/``data``, a non-string
``type``, a ``seq``/``time`` that is not an integer within Avro ``long``, and
(unless ``trusted=True``) ``data`` that is not plain JSON (NaN, Infinity,
non-string keys).  Producers that ingest foreign logs should run
:func:`processor.core.events.parse_event` first and report such lines
themselves.

:class:`DecodedEvent` is what decoding returns: the session id, the envelope
dict (``data`` decoded with orjson; feed it to ``parse_event(...,
trusted_json=True)`` or call :meth:`DecodedEvent.to_event`), the original
``data`` JSON text (lossless, e.g. for digests over the writer's bytes) and
the optional ``producer`` (schema v2; ``None`` when written with v1).

Views and checkpoints
---------------------
View values and checkpoint payloads are JSON (orjson).  A payload larger than
``compress_threshold`` bytes (default 1 KiB) is zstd-compressed (level 3) when
that makes it smaller; the ``ViewEncoding`` field says which (``JSON`` or
``ZSTD_JSON``).  Compressor objects are reused per thread (zstandard objects
must not be shared by concurrent threads).

Views that outgrow one record (``max.message.bytes``): the *encoded* payload is
cut into ``N`` chunks of at most ``max_part_bytes`` (default 512 KiB,
:func:`split_view`).  Part 0 is keyed ``<session>/<view>`` — the same key as
an unsplit view, so the latest head is what compaction keeps — and carries
``parts=N``; part ``i >= 1`` is keyed ``<session>/<view>#<i>``.  Every part
repeats ``asOfSeq``, ``stateVersion``, ``encoding`` and ``parts``.  Writers
produce all parts of one version in the same transaction (parts first, head
last, all to one partition chosen per session — e.g. the session's events
partition — so one consumer sees them together; readers must not assume the
views topic is partitioned by key hash).
Readers reassemble when all ``N`` parts with equal ``asOfSeq`` are seen
(:class:`ViewAssembler`, :func:`join_view_parts`): concatenate the chunks in
part order, then decode per ``encoding``.  Parts with an older ``asOfSeq`` than
the newest seen are stale and ignored.  When a view shrinks from ``N`` to
``M < N`` parts, the writer tombstones the keys ``#M .. #N-1``
(:func:`stale_part_keys`); a tombstone on the head key removes the view (and
the writer tombstones its part keys too).  Keys are for compaction only; the
record fields are authoritative.

Schema folder
-------------
The repository's ``schemas/`` next to the ``processor`` package (source
checkouts), falling back to ``processor/schemas/`` (package data of an
installed wheel: setup.py copies ``schemas/*.avsc`` and ``schemas/history/*.avsc``
there when building).
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal, Protocol, cast

import fastavro
import orjson
import zstandard
from fastavro.schema import fingerprint as _fingerprint_hex
from fastavro.schema import to_parsing_canonical_form

from processor.core.events import Event, parse_event
from processor.core.frozen import json_problem

__all__ = [
    "CHECKPOINT",
    "COMPRESS_THRESHOLD",
    "CONFLUENT_MAGIC",
    "CORE_STATE_VERSION",
    "DEAD_LETTER",
    "MAX_VIEW_PART_BYTES",
    "SESSION_EVENT",
    "SINGLE_OBJECT_MARKER",
    "VIEW",
    "Anchor",
    "Checkpoint",
    "Codec",
    "CodecError",
    "DeadLetter",
    "DecodedEvent",
    "Framing",
    "InMemorySchemaRegistry",
    "SchemaIdResolver",
    "SchemaInfo",
    "SchemaStore",
    "View",
    "ViewAssembler",
    "ViewEncoding",
    "decode_checkpoint",
    "decode_dead_letter",
    "decode_event",
    "decode_events_batch",
    "decode_json_payload",
    "decode_view",
    "default_codec",
    "encode_checkpoint",
    "encode_dead_letter",
    "encode_event",
    "encode_json_payload",
    "encode_parsed_event",
    "encode_view",
    "find_schema_dir",
    "join_view_parts",
    "schema_fingerprint",
    "session_key",
    "split_view",
    "stale_part_keys",
    "view_key",
]

NAMESPACE: Final = "processor.v1"
SESSION_EVENT: Final = "processor.v1.SessionEvent"
VIEW: Final = "processor.v1.View"
CHECKPOINT: Final = "processor.v1.Checkpoint"
DEAD_LETTER: Final = "processor.v1.DeadLetter"
_REPLACE_OP: Final = "processor.v1.ReplaceOp"
_OPAQUE: Final = "processor.v1.OpaqueJson"

SINGLE_OBJECT_MARKER: Final = b"\xc3\x01"
CONFLUENT_MAGIC: Final = b"\x00"
_SO_HEADER_LEN: Final = 10
_CF_HEADER_LEN: Final = 5

#: ``stateVersion`` of the core views (messages, transcript, surface, status).
CORE_STATE_VERSION: Final = -1
#: JSON payloads larger than this many bytes are zstd-compressed.
COMPRESS_THRESHOLD: Final = 1024
ZSTD_LEVEL: Final = 3
#: Default largest view chunk (value bytes) per record; Kafka's default
#: ``max.message.bytes`` is ~1 MiB including batch overhead.
MAX_VIEW_PART_BYTES: Final = 512 * 1024

_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1

_ENVELOPE_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"}
)

Framing = Literal["single-object", "confluent"]
ViewEncoding = Literal["JSON", "ZSTD_JSON"]
_ENCODINGS: Final = ("JSON", "ZSTD_JSON")


class CodecError(ValueError):
    """Bytes that are not a valid framed record, or a value Avro cannot carry."""


# --------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------


def schema_fingerprint(schema: Mapping[str, Any] | str) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint (little-endian) of a schema."""
    canonical = to_parsing_canonical_form(_parse(schema))
    # fastavro's hex already spells the little-endian bytes (as Java does).
    return bytes.fromhex(_fingerprint_hex(canonical, "CRC-64-AVRO"))


def _load_json(schema: Mapping[str, Any] | str) -> dict[str, Any]:
    if isinstance(schema, str):
        loaded = json.loads(schema)
        if not isinstance(loaded, dict):
            raise CodecError("a record schema must be a JSON object")
        return loaded
    return dict(schema)


def _parse(schema: Mapping[str, Any] | str) -> Any:
    return fastavro.parse_schema(_load_json(schema), {})


@dataclass(frozen=True, slots=True, eq=False)
class SchemaInfo:
    """One schema file: its full name, fingerprint and parsed form."""

    name: str
    fingerprint: bytes
    canonical: str
    schema: dict[str, Any]
    parsed: Any
    current: bool
    path: Path | None = None


@dataclass(frozen=True, slots=True, eq=False)
class _Plan:
    """How to read a body: writer schema, and reader schema when they differ."""

    name: str
    writer: Any
    reader: Any


def find_schema_dir() -> Path:
    """The schema folder: the checkout's ``schemas/``, else the wheel's copy.

    A source checkout reads the repository's ``schemas/`` (the contract other
    languages read too, so there is one copy to edit).  An installed wheel has
    no repository: the build copies the same files into ``processor/schemas/``
    (see setup.py), which is found through the package itself.
    """
    package = Path(__file__).resolve().parent.parent
    candidates = (package.parent / "schemas", package / "schemas")
    for candidate in candidates:
        if (candidate / "session_event.avsc").is_file():
            return candidate
    raise CodecError(
        "Avro schemas not found; looked in " + ", ".join(str(c) for c in candidates)
        + " (a wheel built without setup.py's data step?)"
    )


class SchemaStore:
    """Every known schema, indexed by fingerprint; current ones also by name."""

    _default: SchemaStore | None = None
    _default_lock = threading.Lock()

    def __init__(self) -> None:
        self._by_fp: dict[bytes, SchemaInfo] = {}
        self._current: dict[str, SchemaInfo] = {}
        self._plans: dict[bytes, _Plan] = {}

    @classmethod
    def from_directory(cls, path: Path | str) -> SchemaStore:
        """Load ``path/*.avsc`` as current and ``path/history/*.avsc`` as old."""
        root = Path(path)
        store = cls()
        files = sorted(root.glob("*.avsc"))
        if not files:
            raise CodecError(f"no .avsc files in {root}")
        for file in files:
            store.add(file.read_text("utf-8"), current=True, path=file)
        for file in sorted((root / "history").glob("*.avsc")):
            store.add(file.read_text("utf-8"), current=False, path=file)
        return store

    @classmethod
    def default(cls) -> SchemaStore:
        """The process-wide store of :func:`find_schema_dir` (loaded once)."""
        store = cls._default
        if store is None:
            with cls._default_lock:
                store = cls._default
                if store is None:
                    store = cls._default = cls.from_directory(find_schema_dir())
        return store

    def add(
        self, schema: Mapping[str, Any] | str, *, current: bool, path: Path | None = None
    ) -> SchemaInfo:
        raw = _load_json(schema)
        try:
            parsed = fastavro.parse_schema(raw, {})
        except Exception as exc:
            raise CodecError(f"invalid Avro schema {path or ''}: {exc}") from exc
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            raise CodecError(f"schema {path or ''} is not a record schema")
        canonical = to_parsing_canonical_form(parsed)
        fp = bytes.fromhex(_fingerprint_hex(canonical, "CRC-64-AVRO"))
        info = SchemaInfo(str(parsed["name"]), fp, canonical, raw, parsed, current, path)
        if current:
            old = self._current.get(info.name)
            if old is not None and old.fingerprint != fp:
                raise CodecError(
                    f"two current schemas for {info.name}: {old.path} and {path}"
                )
            self._current[info.name] = info
            self._plans.clear()
        if fp not in self._by_fp or current:
            self._by_fp[fp] = info
        return info

    def current(self, name: str) -> SchemaInfo:
        info = self._current.get(name)
        if info is None:
            raise CodecError(f"no current schema for record type {name}")
        return info

    def get(self, fp: bytes) -> SchemaInfo | None:
        return self._by_fp.get(fp)

    def __iter__(self) -> Iterator[SchemaInfo]:
        return iter(list(self._by_fp.values()))

    def __len__(self) -> int:
        return len(self._by_fp)

    def plan(self, fp: bytes) -> _Plan:
        """Writer/reader pair for a writer fingerprint (cached)."""
        plan = self._plans.get(fp)
        if plan is not None:
            return plan
        info = self._by_fp.get(fp)
        if info is None:
            known = ", ".join(sorted(f"{i.name}@{f.hex()}" for f, i in self._by_fp.items()))
            raise CodecError(f"unknown writer schema fingerprint {fp.hex()} (known: {known})")
        plan = self.plan_for(info.name, info.parsed, fp)
        self._plans[fp] = plan
        return plan

    def plan_for(self, name: str, writer: Any, fp: bytes) -> _Plan:
        reader = self.current(name)
        return _Plan(name, writer, None if reader.fingerprint == fp else reader.parsed)


# --------------------------------------------------------------------------
# Confluent schema ids
# --------------------------------------------------------------------------


class SchemaIdResolver(Protocol):
    """A schema registry client, as far as the codec needs one.

    ``subject`` is the record's full name (``processor.v1.SessionEvent``).
    ``schema_for_id`` returns the writer schema as JSON text or a dict, and
    raises ``KeyError`` (or any error) for an unknown id.  Both are called
    once per id / record type per :class:`Codec` (results are cached).
    """

    def id_for_schema(self, subject: str, schema: Mapping[str, Any]) -> int: ...

    def schema_for_id(self, schema_id: int) -> str | Mapping[str, Any]: ...


class InMemorySchemaRegistry:
    """A process-local :class:`SchemaIdResolver` (tests, demos).

    Like a registry, one id per distinct schema (by parsing canonical form),
    shared across subjects; ids count up from ``first_id``.
    """

    def __init__(self, first_id: int = 1) -> None:
        self._next = first_id
        self._by_canonical: dict[str, int] = {}
        self._by_id: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}

    def id_for_schema(self, subject: str, schema: Mapping[str, Any]) -> int:
        text = json.dumps(schema)
        canonical = to_parsing_canonical_form(_parse(text))
        schema_id = self._by_canonical.get(canonical)
        if schema_id is None:
            schema_id = self._next
            self._next += 1
            self._by_canonical[canonical] = schema_id
            self._by_id[schema_id] = text
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def schema_for_id(self, schema_id: int) -> str:
        return self._by_id[schema_id]


# --------------------------------------------------------------------------
# JSON payloads (views, checkpoints)
# --------------------------------------------------------------------------

_zstd_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c: zstandard.ZstdCompressor | None = getattr(_zstd_local, "c", None)
    if c is None:
        c = _zstd_local.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_zstd_local, "d", None)
    if d is None:
        d = _zstd_local.d = zstandard.ZstdDecompressor()
    return d


def _dumps(value: Any, what: str) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise CodecError(f"{what} is not JSON-serialisable: {exc}") from exc


def _compress_maybe(raw: bytes, threshold: int) -> tuple[ViewEncoding, bytes]:
    if len(raw) > threshold:
        packed = _compressor().compress(raw)
        if len(packed) < len(raw):
            return "ZSTD_JSON", packed
    return "JSON", raw


def _unpack(encoding: str, payload: bytes) -> bytes:
    if encoding == "JSON":
        return payload
    if encoding != "ZSTD_JSON":
        raise CodecError(f"unknown payload encoding {encoding!r}")
    dctx = _decompressor()
    try:
        return dctx.decompress(payload)
    except zstandard.ZstdError:
        pass  # e.g. a frame without content size from another writer
    try:
        return dctx.decompressobj().decompress(payload)
    except zstandard.ZstdError as exc:
        raise CodecError(f"corrupt zstd payload: {exc}") from exc


def encode_json_payload(
    value: Any, *, threshold: int = COMPRESS_THRESHOLD
) -> tuple[ViewEncoding, bytes]:
    """orjson bytes of ``value``, zstd-compressed when above ``threshold``."""
    return _compress_maybe(_dumps(value, "payload"), threshold)


def decode_json_payload(encoding: str, payload: bytes) -> Any:
    """Inverse of :func:`encode_json_payload`."""
    try:
        return orjson.loads(_unpack(encoding, payload))
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"payload is not valid JSON: {exc}") from exc


# --------------------------------------------------------------------------
# Record types
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodedEvent:
    """A decoded ``SessionEvent``.

    ``envelope`` is the camelCase JSON envelope (plain dicts/lists, ``data``
    decoded by orjson); ``data_text`` is the exact ``data`` JSON text the
    writer produced; ``producer`` is the v2 field (``None`` for v1 records).
    """

    session_id: str
    envelope: dict[str, Any]
    data_text: str
    producer: str | None = None

    @property
    def seq(self) -> int:
        return cast(int, self.envelope["seq"])

    def to_event(self) -> Event:
        """Validate into a core :class:`Event` (raises ``SessionError``)."""
        return parse_event(self.envelope, trusted_json=True)


@dataclass(frozen=True, slots=True)
class View:
    """One ``View`` record (or one part of a split view).

    ``value`` holds the encoded payload bytes (per ``encoding``); build from a
    JSON value with :meth:`of`, read it back with :meth:`json_value`.
    """

    session_id: str
    view: str
    as_of_seq: int
    state_version: int
    encoding: ViewEncoding
    value: bytes
    part: int = 0
    parts: int = 1

    @classmethod
    def of(
        cls,
        session_id: str,
        view: str,
        as_of_seq: int,
        state_version: int,
        value: Any,
        *,
        threshold: int = COMPRESS_THRESHOLD,
    ) -> View:
        encoding, payload = encode_json_payload(value, threshold=threshold)
        return cls(session_id, view, as_of_seq, state_version, encoding, payload)

    @property
    def key(self) -> bytes:
        """The record key: ``<session>/<view>``, or ``...#<part>`` for part >= 1."""
        return view_key(self.session_id, self.view, self.part)

    def json_value(self) -> Any:
        """The decoded view value (only for a whole view: ``parts == 1``)."""
        if self.parts != 1:
            raise CodecError(
                f"view {self.session_id}/{self.view} is part {self.part} of {self.parts}; "
                "reassemble it first (join_view_parts / ViewAssembler)"
            )
        return decode_json_payload(self.encoding, self.value)


@dataclass(frozen=True, slots=True)
class Anchor:
    """Events-topic position and digest of a checkpoint's last folded event."""

    partition: int
    offset: int
    seq: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Per-session state: projection ``rows`` ``{key: {ver, seq, val}}`` and the
    core ``surface`` state (both JSON values), the watermark and its anchor."""

    session_id: str
    last_seq: int
    anchor: Anchor
    rows: Mapping[str, Any]
    surface: Any
    core_version: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A refused record with its origin, the refusing rule, and its raw bytes."""

    session_id: str | None
    topic: str
    partition: int
    offset: int
    seq: int | None
    rule: str
    reason: str
    key: bytes | None
    value: bytes | None
    timestamp: int
    processor: str


def session_key(session_id: str) -> bytes:
    """Record key of events and checkpoints: the UTF-8 session id."""
    return session_id.encode()


def view_key(session_id: str, view: str, part: int = 0) -> bytes:
    """``<session>/<view>`` for a view (head), ``<session>/<view>#<part>`` for parts >= 1."""
    if part == 0:
        return f"{session_id}/{view}".encode()
    return f"{session_id}/{view}#{part}".encode()


def stale_part_keys(session_id: str, view: str, old_parts: int, new_parts: int) -> list[bytes]:
    """Part keys to tombstone when a view goes from ``old_parts`` to ``new_parts``.

    ``new_parts == 0`` means the view disappeared (the head key is included).
    """
    start = max(new_parts, 0)
    return [view_key(session_id, view, i) for i in range(start, old_parts)]


def split_view(view: View, max_part_bytes: int = MAX_VIEW_PART_BYTES) -> list[View]:
    """Cut a whole view into parts of at most ``max_part_bytes`` value bytes."""
    if view.parts != 1:
        raise CodecError("split_view needs a whole view (parts == 1)")
    if max_part_bytes <= 0:
        raise ValueError("max_part_bytes must be positive")
    value = view.value
    if len(value) <= max_part_bytes:
        return [view]
    chunks = [value[i : i + max_part_bytes] for i in range(0, len(value), max_part_bytes)]
    n = len(chunks)
    return [replace(view, value=chunk, part=i, parts=n) for i, chunk in enumerate(chunks)]


def join_view_parts(parts: Iterable[View]) -> View:
    """Reassemble the parts of one split view (any order) into a whole view."""
    items = sorted(parts, key=lambda v: v.part)
    if not items:
        raise CodecError("no view parts to join")
    head = items[0]
    n = head.parts
    same = (head.session_id, head.view, head.as_of_seq, head.state_version, head.encoding, n)
    for item in items:
        if (
            item.session_id, item.view, item.as_of_seq, item.state_version, item.encoding,
            item.parts,
        ) != same:
            raise CodecError(
                f"view parts of {head.session_id}/{head.view} disagree "
                f"(asOfSeq/stateVersion/encoding/parts)"
            )
    if [v.part for v in items] != list(range(n)):
        raise CodecError(
            f"view {head.session_id}/{head.view}@{head.as_of_seq} needs parts 0..{n - 1}, "
            f"got {[v.part for v in items]}"
        )
    if n == 1:
        return head
    return replace(head, value=b"".join(v.value for v in items), part=0, parts=1)


class ViewAssembler:
    """Reader-side reassembly of split views.

    :meth:`add` each decoded ``View`` in consumption order; it returns the
    whole view when one is complete (immediately for unsplit views), else
    ``None``.  Parts older (smaller ``asOfSeq``) than the newest version seen
    for that (session, view) are ignored; a newer version drops the pending
    parts of an older one.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], tuple[int, int, dict[int, View]]] = {}
        self._latest: dict[tuple[str, str], int] = {}

    def add(self, view: View) -> View | None:
        ident = (view.session_id, view.view)
        latest = self._latest.get(ident)
        if latest is not None and view.as_of_seq < latest:
            return None
        self._latest[ident] = view.as_of_seq
        if view.parts == 1:
            self._pending.pop(ident, None)
            return view
        pending = self._pending.get(ident)
        if pending is None or pending[0] != view.as_of_seq or pending[1] != view.parts:
            pending = (view.as_of_seq, view.parts, {})
            self._pending[ident] = pending
        got = pending[2]
        got[view.part] = view
        if len(got) < view.parts:
            return None
        del self._pending[ident]
        return join_view_parts(got.values())

    def forget(self, session_id: str, view: str) -> None:
        """Drop state for a view (after its head tombstone)."""
        self._pending.pop((session_id, view), None)
        self._latest.pop((session_id, view), None)

    @property
    def pending(self) -> int:
        return len(self._pending)


# --------------------------------------------------------------------------
# Event envelope <-> SessionEvent datum
# --------------------------------------------------------------------------


_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def _json_text(value: Any, what: str) -> str:
    return _dumps(value, what).decode()


def _is_long(value: Any) -> bool:
    return type(value) is int and _LONG_MIN <= value <= _LONG_MAX


def _is_seq(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _LONG_MAX


def _surface_op_datum(op: Any) -> Any:
    if op == "append" and isinstance(op, str):
        return ("string", "append")
    if isinstance(op, dict) and len(op) == 3 and op.get("op") == "replace":
        start, end = op.get("startSeq"), op.get("endSeq")
        if _is_seq(start) and _is_seq(end) and isinstance(op["op"], str):
            return (_REPLACE_OP, {"op": "replace", "startSeq": start, "endSeq": end})
    return (_OPAQUE, {"json": _json_text(op, "surfaceOp")})


def _source_seqs_datum(seqs: Any) -> Any:
    if isinstance(seqs, list) and all(_is_long(s) for s in seqs):
        # fastavro's tuple notation wants an exact list (not FrozenList)
        return ("array", seqs if type(seqs) is list else list(seqs))
    return (_OPAQUE, {"json": _json_text(seqs, "sourceEventSeqs")})


def _ignorable_datum(flag: Any) -> Any:
    if flag is True or flag is False:
        return ("boolean", flag)
    return (_OPAQUE, {"json": _json_text(flag, "ignorable")})


def _check_ints(record: str, **fields: int) -> None:
    """Avro ``int`` fields: fastavro would silently write any Python int."""
    for name, value in fields.items():
        if type(value) is not int or not _INT_MIN <= value <= _INT_MAX:
            raise CodecError(f"cannot encode {record}: {name} must be a 32-bit int, got {value!r}")


def _check_plain(value: Any, what: str) -> None:
    problem = json_problem(value, what)
    if problem:
        raise CodecError(f"{problem}; envelope values must be plain JSON")


def _event_datum(
    session_id: str,
    envelope: Mapping[str, Any],
    data_text: str | None,
    producer: str | None,
    trusted: bool,
) -> dict[str, Any]:
    if not isinstance(envelope, Mapping):
        raise CodecError("event envelope must be a JSON object")
    if not isinstance(session_id, str):
        raise CodecError("session id must be a string")
    try:
        etype = envelope["type"]
        seq = envelope["seq"]
        time = envelope["time"]
        data = envelope["data"]
    except KeyError as exc:
        raise CodecError(f"event envelope is missing {exc.args[0]!r}") from None
    n = len(envelope)
    if n > 4 and not _ENVELOPE_KEYS.issuperset(envelope):
        extra = sorted(str(k) for k in envelope if k not in _ENVELOPE_KEYS)
        raise CodecError(f"envelope key(s) {', '.join(extra)} cannot be carried by SessionEvent")
    if not isinstance(etype, str):
        raise CodecError(f"envelope type must be a string, got {type(etype).__name__}")
    if not _is_long(seq):
        raise CodecError(f"envelope seq must be an integer within Avro long, got {seq!r}")
    if not _is_long(time):
        raise CodecError(f"envelope time must be an integer within Avro long, got {time!r}")
    if data_text is None:
        raw = _dumps(data, "data")
        # orjson writes NaN/Infinity as null: a lossy round trip is the cheap
        # tell-tale, json_problem then says what is wrong (tuples are fine).
        if not trusted and _loads(raw) != data:
            _check_plain(data, "data")
        data_text = raw.decode()
    elif not trusted:
        try:
            _loads(data_text)
        except _JSONDecodeError as exc:
            raise CodecError(f"data_text is not valid JSON: {exc}") from exc
    op = seqs = flag = None
    if n > 4:
        if not trusted:
            for key in ("surfaceOp", "sourceEventSeqs", "ignorable"):
                if key in envelope:
                    _check_plain(envelope[key], key)
        if "surfaceOp" in envelope:
            op = _surface_op_datum(envelope["surfaceOp"])
        if "sourceEventSeqs" in envelope:
            seqs = _source_seqs_datum(envelope["sourceEventSeqs"])
        if "ignorable" in envelope:
            flag = _ignorable_datum(envelope["ignorable"])
    return {
        "sessionId": session_id,
        "type": etype,
        "seq": seq,
        "time": time,
        "data": data_text,
        "surfaceOp": op,
        "sourceEventSeqs": seqs,
        "ignorable": flag,
        "producer": producer,
    }


def _opaque(value: dict[str, Any]) -> Any:
    try:
        return _loads(value["json"])
    except _JSONDecodeError as exc:
        raise CodecError(f"OpaqueJson is not valid JSON: {exc}") from exc


def _event_from_record(rec: dict[str, Any]) -> DecodedEvent:
    data_text = rec["data"]
    try:
        data = _loads(data_text)
    except _JSONDecodeError as exc:
        raise CodecError(f"SessionEvent.data is not valid JSON: {exc}") from exc
    envelope: dict[str, Any] = {
        "type": rec["type"],
        "seq": rec["seq"],
        "time": rec["time"],
        "data": data,
    }
    op = rec["surfaceOp"]
    if op is not None:
        envelope["surfaceOp"] = _opaque(op) if type(op) is dict and "json" in op else op
    seqs = rec["sourceEventSeqs"]
    if seqs is not None:
        envelope["sourceEventSeqs"] = _opaque(seqs) if type(seqs) is dict else seqs
    flag = rec["ignorable"]
    if flag is not None:
        envelope["ignorable"] = _opaque(flag) if type(flag) is dict else flag
    return DecodedEvent(rec["sessionId"], envelope, data_text, rec.get("producer"))


# --------------------------------------------------------------------------
# Codec
# --------------------------------------------------------------------------

_writer = fastavro.schemaless_writer
_reader = fastavro.schemaless_reader


class Codec:
    """Encode/decode the four record types with one framing.

    ``framing`` picks how records are *written* (``"single-object"`` or
    ``"confluent"``, the latter needs ``resolver``); reading accepts both.
    Instances are cheap after the first use of the shared
    :class:`SchemaStore`, and safe to share between threads (caches are
    idempotent dict writes).
    """

    def __init__(
        self,
        framing: Framing = "single-object",
        *,
        store: SchemaStore | None = None,
        resolver: SchemaIdResolver | None = None,
        compress_threshold: int = COMPRESS_THRESHOLD,
    ) -> None:
        if framing not in ("single-object", "confluent"):
            raise ValueError(f"unknown framing {framing!r} (single-object | confluent)")
        if framing == "confluent" and resolver is None:
            raise ValueError("confluent framing needs a SchemaIdResolver")
        self.framing: Framing = framing
        self.store = store if store is not None else SchemaStore.default()
        self.resolver = resolver
        self.compress_threshold = compress_threshold
        self._headers: dict[str, bytes] = {}
        self._id_plans: dict[int, _Plan] = {}
        self._event_writer = self.store.current(SESSION_EVENT).parsed

    # -- framing ------------------------------------------------------------

    def header(self, name: str) -> bytes:
        """The frame prefix this codec writes for record type ``name``."""
        head = self._headers.get(name)
        if head is None:
            info = self.store.current(name)
            if self.framing == "single-object":
                head = SINGLE_OBJECT_MARKER + info.fingerprint
            else:
                assert self.resolver is not None
                try:
                    schema_id = self.resolver.id_for_schema(name, info.schema)
                except Exception as exc:
                    raise CodecError(f"schema registry refused {name}: {exc}") from exc
                head = CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")
            self._headers[name] = head
        return head

    def _id_plan(self, schema_id: int) -> _Plan:
        plan = self._id_plans.get(schema_id)
        if plan is None:
            if self.resolver is None:
                raise CodecError(
                    f"Confluent-framed record (schema id {schema_id}) but no schema "
                    "registry is configured"
                )
            try:
                writer = _parse(self.resolver.schema_for_id(schema_id))
            except Exception as exc:
                raise CodecError(f"unknown schema id {schema_id}: {exc}") from exc
            fp = bytes.fromhex(
                _fingerprint_hex(to_parsing_canonical_form(writer), "CRC-64-AVRO")
            )
            if self.store.get(fp) is not None:
                plan = self.store.plan(fp)
            else:
                plan = self.store.plan_for(str(writer["name"]), writer, fp)
            self._id_plans[schema_id] = plan
        return plan

    def _plan(self, data: bytes) -> tuple[_Plan, int]:
        if data[:2] == SINGLE_OBJECT_MARKER:
            if len(data) < _SO_HEADER_LEN:
                raise CodecError(f"truncated single-object header ({len(data)} bytes)")
            return self.store.plan(data[2:_SO_HEADER_LEN]), _SO_HEADER_LEN
        if data[:1] == CONFLUENT_MAGIC:
            if len(data) < _CF_HEADER_LEN:
                raise CodecError(f"truncated Confluent header ({len(data)} bytes)")
            return self._id_plan(int.from_bytes(data[1:_CF_HEADER_LEN], "big")), _CF_HEADER_LEN
        raise CodecError(
            f"not a framed Avro record: starts with {bytes(data[:2]).hex() or 'nothing'} "
            "(expected c301 single-object marker or 00 Confluent magic)"
        )

    # -- generic ------------------------------------------------------------

    def encode_record(self, name: str, datum: Mapping[str, Any]) -> bytes:
        """Frame + schemaless body of ``datum`` with the current schema ``name``."""
        head = self.header(name)
        schema = self._event_writer if name == SESSION_EVENT else self.store.current(name).parsed
        buf = io.BytesIO()
        buf.write(head)
        try:
            _writer(buf, schema, datum)
        except Exception as exc:
            raise CodecError(f"cannot encode {name}: {exc}") from exc
        return buf.getvalue()

    def decode_record(self, data: bytes, expected: str | None = None) -> tuple[str, dict[str, Any]]:
        """``(record full name, datum)`` read with the current reader schema."""
        if data is None:
            raise CodecError("record value is null (a tombstone)")
        plan, offset = self._plan(data)
        if expected is not None and plan.name != expected:
            raise CodecError(f"expected a {expected} record, got {plan.name}")
        fo = io.BytesIO(data)
        fo.seek(offset)
        try:
            rec = _reader(fo, plan.writer, plan.reader)
        except Exception as exc:
            raise CodecError(
                f"corrupt or truncated {plan.name} body: {type(exc).__name__}: {exc}"
            ) from exc
        end = fo.tell()
        if end != len(data):
            raise CodecError(f"{len(data) - end} trailing byte(s) after the {plan.name} body")
        if not isinstance(rec, dict):
            raise CodecError(f"{plan.name} body did not decode to a record")
        return plan.name, rec

    # -- events -------------------------------------------------------------

    def encode_event(
        self,
        session_id: str,
        envelope: Mapping[str, Any],
        *,
        data_text: str | None = None,
        producer: str | None = None,
        trusted: bool = False,
    ) -> bytes:
        """Encode a camelCase JSON envelope.

        ``data_text``: the exact JSON text of ``data`` to carry (default:
        orjson of ``envelope["data"]``; the caller vouches they agree).
        ``trusted``: skip the plain-JSON walk (values came from a strict JSON
        decoder or a validated :class:`Event`).
        """
        datum = _event_datum(session_id, envelope, data_text, producer, trusted)
        buf = io.BytesIO()
        buf.write(self._headers.get(SESSION_EVENT) or self.header(SESSION_EVENT))
        try:
            _writer(buf, self._event_writer, datum)
        except Exception as exc:
            raise CodecError(f"cannot encode SessionEvent: {exc}") from exc
        return buf.getvalue()

    def encode_parsed_event(
        self, session_id: str, event: Event, *, producer: str | None = None
    ) -> bytes:
        """Encode a validated core :class:`Event`."""
        return self.encode_event(session_id, event.to_json(), producer=producer, trusted=True)

    def decode_event(self, data: bytes) -> DecodedEvent:
        return _event_from_record(self.decode_record(data, SESSION_EVENT)[1])

    def decode_events_batch(
        self, values: Sequence[bytes | None]
    ) -> list[DecodedEvent | CodecError]:
        """Decode many event values; a bad one yields its :class:`CodecError` in place."""
        out: list[DecodedEvent | CodecError] = []
        append = out.append
        decode_record = self.decode_record
        for value in values:
            try:
                if value is None:
                    raise CodecError("record value is null (tombstone on the events topic)")
                append(_event_from_record(decode_record(value, SESSION_EVENT)[1]))
            except CodecError as exc:
                append(exc)
        return out

    # -- views --------------------------------------------------------------

    def encode_view(self, view: View) -> bytes:
        if view.encoding not in _ENCODINGS:
            raise CodecError(f"unknown view encoding {view.encoding!r}")
        _check_ints(VIEW, stateVersion=view.state_version, part=view.part, parts=view.parts)
        if not 0 <= view.part < view.parts:
            raise CodecError(f"cannot encode {VIEW}: part {view.part} of {view.parts}")
        return self.encode_record(
            VIEW,
            {
                "sessionId": view.session_id,
                "view": view.view,
                "asOfSeq": view.as_of_seq,
                "stateVersion": view.state_version,
                "encoding": view.encoding,
                "value": view.value,
                "part": view.part,
                "parts": view.parts,
            },
        )

    def decode_view(self, data: bytes) -> View:
        rec = self.decode_record(data, VIEW)[1]
        return View(
            rec["sessionId"],
            rec["view"],
            rec["asOfSeq"],
            rec["stateVersion"],
            rec["encoding"],
            rec["value"],
            rec["part"],
            rec["parts"],
        )

    def encode_view_records(
        self,
        session_id: str,
        view: str,
        as_of_seq: int,
        state_version: int,
        value: Any,
        *,
        max_part_bytes: int = MAX_VIEW_PART_BYTES,
    ) -> list[tuple[bytes, bytes]]:
        """``(key, value)`` records for one view version, split when needed
        (parts >= 1 first, head last — produce them in this order)."""
        whole = View.of(
            session_id, view, as_of_seq, state_version, value, threshold=self.compress_threshold
        )
        parts = split_view(whole, max_part_bytes)
        records = [(p.key, self.encode_view(p)) for p in parts]
        return records[1:] + records[:1]

    # -- checkpoints --------------------------------------------------------

    def encode_checkpoint(self, checkpoint: Checkpoint) -> bytes:
        rows = _dumps(checkpoint.rows, "checkpoint rows")
        surface = _dumps(checkpoint.surface, "checkpoint surface")
        encoding: ViewEncoding = "JSON"
        if len(rows) + len(surface) > self.compress_threshold:
            cctx = _compressor()
            packed_rows, packed_surface = cctx.compress(rows), cctx.compress(surface)
            if len(packed_rows) + len(packed_surface) < len(rows) + len(surface):
                encoding, rows, surface = "ZSTD_JSON", packed_rows, packed_surface
        a = checkpoint.anchor
        _check_ints(CHECKPOINT, partition=a.partition, coreVersion=checkpoint.core_version)
        return self.encode_record(
            CHECKPOINT,
            {
                "sessionId": checkpoint.session_id,
                "lastSeq": checkpoint.last_seq,
                "anchor": {
                    "partition": a.partition,
                    "offset": a.offset,
                    "seq": a.seq,
                    "digest": a.digest,
                },
                "encoding": encoding,
                "rows": rows,
                "surface": surface,
                "coreVersion": checkpoint.core_version,
            },
        )

    def decode_checkpoint(self, data: bytes) -> Checkpoint:
        rec = self.decode_record(data, CHECKPOINT)[1]
        a = rec["anchor"]
        rows = decode_json_payload(rec["encoding"], rec["rows"])
        if not isinstance(rows, dict):
            raise CodecError("checkpoint rows must be a JSON object")
        return Checkpoint(
            rec["sessionId"],
            rec["lastSeq"],
            Anchor(a["partition"], a["offset"], a["seq"], a["digest"]),
            rows,
            decode_json_payload(rec["encoding"], rec["surface"]),
            rec["coreVersion"],
        )

    # -- dead letters -------------------------------------------------------

    def encode_dead_letter(self, letter: DeadLetter) -> bytes:
        _check_ints(DEAD_LETTER, partition=letter.partition)
        return self.encode_record(
            DEAD_LETTER,
            {
                "sessionId": letter.session_id,
                "topic": letter.topic,
                "partition": letter.partition,
                "offset": letter.offset,
                "seq": letter.seq,
                "rule": letter.rule,
                "reason": letter.reason,
                "key": None if letter.key is None else bytes(letter.key),
                "value": None if letter.value is None else bytes(letter.value),
                "timestamp": letter.timestamp,
                "processor": letter.processor,
            },
        )

    def decode_dead_letter(self, data: bytes) -> DeadLetter:
        rec = self.decode_record(data, DEAD_LETTER)[1]
        return DeadLetter(
            rec["sessionId"],
            rec["topic"],
            rec["partition"],
            rec["offset"],
            rec["seq"],
            rec["rule"],
            rec["reason"],
            rec["key"],
            rec["value"],
            rec["timestamp"],
            rec["processor"],
        )


# --------------------------------------------------------------------------
# Module-level API on a default single-object codec
# --------------------------------------------------------------------------

_default_codec: Codec | None = None


def default_codec() -> Codec:
    """The shared single-object :class:`Codec` over :meth:`SchemaStore.default`."""
    global _default_codec
    codec = _default_codec
    if codec is None:
        codec = _default_codec = Codec()
    return codec


def encode_event(
    session_id: str,
    envelope: Mapping[str, Any],
    *,
    data_text: str | None = None,
    producer: str | None = None,
    trusted: bool = False,
) -> bytes:
    return default_codec().encode_event(
        session_id, envelope, data_text=data_text, producer=producer, trusted=trusted
    )


def encode_parsed_event(session_id: str, event: Event, *, producer: str | None = None) -> bytes:
    return default_codec().encode_parsed_event(session_id, event, producer=producer)


def decode_event(data: bytes) -> DecodedEvent:
    return default_codec().decode_event(data)


def decode_events_batch(values: Sequence[bytes | None]) -> list[DecodedEvent | CodecError]:
    return default_codec().decode_events_batch(values)


def encode_view(view: View) -> bytes:
    return default_codec().encode_view(view)


def decode_view(data: bytes) -> View:
    return default_codec().decode_view(data)


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    return default_codec().encode_checkpoint(checkpoint)


def decode_checkpoint(data: bytes) -> Checkpoint:
    return default_codec().decode_checkpoint(data)


def encode_dead_letter(letter: DeadLetter) -> bytes:
    return default_codec().encode_dead_letter(letter)


def decode_dead_letter(data: bytes) -> DeadLetter:
    return default_codec().decode_dead_letter(data)
