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

Parted format (format 2, issue 12)
----------------------------------
The core views and the checkpoints are written in parts so a batch writes
what changed: on the views topic, ``View`` records whose names start with
``~`` (``processor.protocol``; assembled by
``processor.client.view_assembly``); on the checkpoints topic a typed
``CheckpointHead`` under the session id plus ``CheckpointPart`` records
under :func:`part_key` (``0xFF`` + session + ``0x00`` + name; assembled by
``processor.engine.checkpoints.latest_checkpoints``).  A format-1
``Checkpoint`` record still decodes and restores.

Schema folder
-------------
The repository's ``schemas/`` next to the ``processor`` package (source
checkouts), falling back to ``processor/schemas/`` (package data of an
installed wheel: setup.py copies ``schemas/*.avsc`` and ``schemas/history/*.avsc``
there when building).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from processor.codec.avro_fast import part_body, view_body
from processor.codec.decoded import DecodedEvent
from processor.codec.envelope import shared_string
from processor.codec.framed import (
    Codec,
)
from processor.codec.names import (
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
from processor.codec.parted import (
    decode_checkpoint_record,
    decode_part,
    encode_head,
    encode_part,
    part_key,
    split_part_key,
)
from processor.codec.payload import (
    decode_json_payload,
    encode_json_payload,
)
from processor.codec.schemas import (
    InMemorySchemaRegistry,
    SchemaIdResolver,
    SchemaInfo,
    SchemaStore,
    find_schema_dir,
    schema_fingerprint,
)
from processor.codec.typed_records import (
    Anchor,
    Checkpoint,
    DeadLetter,
    View,
    ViewAssembler,
    join_view_parts,
    session_key,
    split_view,
    stale_part_keys,
    view_key,
)
from processor.core.events import Event
from processor.protocol import CORE_STATE_VERSION

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
    "decode_checkpoint_record",
    "decode_dead_letter",
    "decode_event",
    "decode_events_batch",
    "decode_json_payload",
    "decode_part",
    "decode_view",
    "default_codec",
    "encode_checkpoint",
    "encode_dead_letter",
    "encode_event",
    "encode_head",
    "encode_json_payload",
    "encode_parsed_event",
    "encode_part",
    "encode_view",
    "find_schema_dir",
    "join_view_parts",
    "part_body",
    "part_key",
    "schema_fingerprint",
    "session_key",
    "shared_string",
    "split_part_key",
    "split_view",
    "stale_part_keys",
    "view_body",
    "view_key",
]


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
