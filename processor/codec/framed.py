"""The :class:`Codec`: framing plus encode/decode of every record type."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import fastavro
from fastavro.schema import fingerprint as _fingerprint_hex
from fastavro.schema import to_parsing_canonical_form

from processor.codec.avro_compiled import Unsupported, Writer, compile_writer
from processor.codec.avro_event import EVENT_CANONICAL, read_event_fields
from processor.codec.avro_fast import VIEW_LAYOUT, layout_matches, view_body
from processor.codec.decoded import DecodedEvent
from processor.codec.envelope import (
    _check_ints,
    _event_datum,
    _event_from_record,
    event_from_fields,
)
from processor.codec.names import (
    _CF_HEADER_LEN,
    _ENCODINGS,
    _SO_HEADER_LEN,
    CHECKPOINT,
    COMPRESS_THRESHOLD,
    CONFLUENT_MAGIC,
    DEAD_LETTER,
    MAX_VIEW_PART_BYTES,
    SESSION_EVENT,
    SINGLE_OBJECT_MARKER,
    VIEW,
    CodecError,
    Framing,
    ViewEncoding,
)
from processor.codec.payload import (
    _compressor,
    _dumps,
    decode_json_payload,
)
from processor.codec.schemas import (
    SchemaIdResolver,
    SchemaStore,
    _parse,
    _Plan,
)
from processor.codec.typed_records import (
    Anchor,
    Checkpoint,
    DeadLetter,
    View,
    split_view,
)
from processor.core.errors import Unavailable, library_text, raised_from
from processor.core.events import Event

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
        # Final: the caches below are keyed by record name only, so what they
        # derive from (the schema set, the registry, the framing) must not be
        # swapped under them; a store never replaces a current schema (add refuses)
        self.framing: Final[Framing] = framing
        self.store: Final[SchemaStore] = store if store is not None else SchemaStore.default()
        self.resolver: Final[SchemaIdResolver | None] = resolver
        self.compress_threshold = compress_threshold
        self._headers: dict[str, bytes] = {}
        self._id_plans: dict[int, _Plan] = {}
        self._event_writer = self.store.current(SESSION_EVENT).parsed
        self._layouts: dict[str, bool] = {}
        #: record name -> its compiled writer (avro_compiled.py), None: fastavro's
        self._compiled: dict[str, Writer | Literal[False] | None] = {}
        #: event read plans avro_event.py reads (True) or leaves to fastavro
        self._event_plans: dict[_Plan, bool] = {}
        # single-object frame heads (marker + fingerprint) of SessionEvent writers
        # avro_event.py reads: one slice and set lookup per event instead of
        # the plan lookups (bounded by the store's known schemas)
        self._fast_event_heads: set[bytes] = set()

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
                    raise raised_from(
                        CodecError(f"schema registry refused {name}: {library_text(exc)}"), exc
                    ) from exc
                head = CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")
                # the id names the schema just registered: records of it (the other
                # writers' of this version) are read without asking the registry,
                # whose outage after the start would make each a CODEC dead letter
                # and quarantine its session (a transient fault marked as bad input)
                self._id_plans.setdefault(schema_id, self.store.plan(info.fingerprint))
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
            except Unavailable:
                # the registry is out, the record not bad: a CODEC dead letter would
                # quarantine its session for a transient fault (kafka/schema_registry.py)
                raise
            except Exception as exc:
                raise raised_from(
                    CodecError(f"unknown schema id {schema_id}: {library_text(exc)}"), exc
                ) from exc
            fp = bytes.fromhex(_fingerprint_hex(to_parsing_canonical_form(writer), "CRC-64-AVRO"))
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

    def fast_layout(self, name: str, layout: Sequence[tuple[str, str]]) -> bool:
        """Does the current schema ``name`` have ``layout`` (avro_fast.py may encode it)?"""
        ok = self._layouts.get(name)
        if ok is None:
            ok = self._layouts[name] = layout_matches(self.store.current(name).parsed, layout)
        return ok

    # -- generic ------------------------------------------------------------

    def encode_record(self, name: str, datum: Mapping[str, Any]) -> bytes:
        """Frame + schemaless body of ``datum`` with the current schema ``name``."""
        head = self.header(name)
        schema = self._event_writer if name == SESSION_EVENT else self.store.current(name).parsed
        write = self._compiled.get(name, False)
        if write is False:
            write = self._compiled[name] = compile_writer(schema)
        if write is not None:
            try:
                return head + write(datum)
            except Unsupported:
                pass  # fastavro writes it, or says why not
        buf = io.BytesIO()
        buf.write(head)
        try:
            _writer(buf, schema, datum)
        except Exception as exc:
            raise raised_from(
                CodecError(f"cannot encode {name}: {library_text(exc)}"), exc
            ) from exc
        return buf.getvalue()

    def decode_record(
        self, data: bytes | None, expected: str | None = None
    ) -> tuple[str, dict[str, Any]]:
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
            raise raised_from(
                CodecError(f"corrupt or truncated {plan.name} body: {library_text(exc)}"),
                exc,
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
            raise raised_from(
                CodecError(f"cannot encode SessionEvent: {library_text(exc)}"), exc
            ) from exc
        return buf.getvalue()

    def encode_parsed_event(
        self, session_id: str, event: Event, *, producer: str | None = None
    ) -> bytes:
        """Encode a validated core :class:`Event`."""
        return self.encode_event(session_id, event.to_json(), producer=producer, trusted=True)

    def decode_event(self, data: bytes | None) -> DecodedEvent:
        if data is not None:
            head = data[:_SO_HEADER_LEN]
            if head in self._fast_event_heads:
                fast, offset = True, _SO_HEADER_LEN
            else:
                plan, offset = self._plan(data)
                known = self._event_plans.get(plan)
                if known is None:
                    known = self._event_plans[plan] = (
                        plan.name == SESSION_EVENT
                        and plan.reader is None
                        and to_parsing_canonical_form(plan.writer) == EVENT_CANONICAL
                    )
                fast = known
                if fast and offset == _SO_HEADER_LEN and head[:2] == SINGLE_OBJECT_MARKER:
                    self._fast_event_heads.add(head)
            if fast:
                fields = read_event_fields(data, offset)
                if fields is not None:
                    sid, etype, seq, time, text, op, seqs, flag, producer = fields
                    return event_from_fields(sid, etype, seq, time, text, op, seqs, flag, producer)
        return _event_from_record(self.decode_record(data, SESSION_EVENT)[1])

    def decode_events_batch(
        self, values: Sequence[bytes | None]
    ) -> list[DecodedEvent | CodecError]:
        """Decode many event values; a bad one yields its :class:`CodecError` in place."""
        out: list[DecodedEvent | CodecError] = []
        append = out.append
        decode_event = self.decode_event
        for value in values:
            try:
                if value is None:
                    raise CodecError("record value is null (tombstone on the events topic)")
                append(decode_event(value))
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
        if self.fast_layout(VIEW, VIEW_LAYOUT):  # one per message in the parted format
            return view_body(
                view.session_id,
                view.view,
                view.as_of_seq,
                view.state_version,
                view.encoding,
                view.value,
                view.part,
                view.parts,
                self.header(VIEW),
            )
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

    def encode_whole_view(
        self,
        session_id: str,
        view: str,
        as_of_seq: int,
        state_version: int,
        encoding: ViewEncoding,
        value: bytes,
    ) -> bytes:
        """:meth:`encode_view` of the one-part ``View`` of these fields, without
        building the record (several per changed session and batch: the engine's
        output calls this per view record; view_body refuses the int fields with
        ``_check_ints``'s texts)."""
        if encoding in _ENCODINGS and self.fast_layout(VIEW, VIEW_LAYOUT):
            return view_body(
                session_id, view, as_of_seq, state_version, encoding, value, 0, 1, self.header(VIEW)
            )
        return self.encode_view(View(session_id, view, as_of_seq, state_version, encoding, value))

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
