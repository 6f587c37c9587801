"""Records of the parted checkpoint (format 2): keys, parts, the typed head.

A checkpoint is a small :data:`CHECKPOINT_HEAD` under the session id key
plus immutable or versioned :data:`CHECKPOINT_PART` records under
:func:`part_key`; ``schemas/checkpoint_head.avsc`` and
``schemas/checkpoint_part.avsc`` document every field for other languages.
The head is handled as its Avro datum (a dict): the engine builds it, the
restore reads it, nothing in between needs another shape.
"""

from __future__ import annotations

from typing import Any

from processor.codec.avro_fast import PART_LAYOUT, part_body
from processor.codec.framed import Codec
from processor.codec.names import CHECKPOINT_HEAD, CHECKPOINT_PART, CodecError
from processor.codec.payload import decode_json_payload, encode_json_payload

#: First byte of a part key: never the first byte of a UTF-8 string, so a part
#: key can never be a session id (a head key).
PART_MARK = b"\xff"


def part_key(session_id: str, name: str) -> bytes:
    """``0xFF + session + 0x00 + name``; a name never holds 0x00, so it is unique."""
    return PART_MARK + session_id.encode() + b"\x00" + name.encode()


def split_part_key(key: bytes) -> tuple[str, str] | None:
    """``(session, name)`` of a part key, None when ``key`` is not one."""
    if not key.startswith(PART_MARK):
        return None
    sid, sep, name = key[1:].rpartition(b"\x00")
    if not sep:
        return None
    try:
        return sid.decode(), name.decode()
    except UnicodeDecodeError:
        return None


def encode_part(codec: Codec, name: str, version: int, value: Any) -> bytes:
    encoding, payload = encode_json_payload(value, threshold=codec.compress_threshold)
    if codec.fast_layout(CHECKPOINT_PART, PART_LAYOUT):  # a record per node event
        return part_body(name, version, encoding, payload, codec.header(CHECKPOINT_PART))
    return codec.encode_record(
        CHECKPOINT_PART, {"name": name, "version": version, "encoding": encoding, "value": payload}
    )


def decode_part(codec: Codec, data: bytes) -> tuple[str, int, Any]:
    """``(name, version, JSON value)`` of a part record (raises CodecError)."""
    rec = codec.decode_record(data, CHECKPOINT_PART)[1]
    return rec["name"], rec["version"], decode_json_payload(rec["encoding"], rec["value"])


def encode_head(codec: Codec, datum: dict[str, Any]) -> bytes:
    return codec.encode_record(CHECKPOINT_HEAD, datum)


def decode_checkpoint_record(codec: Codec, data: bytes) -> tuple[str, dict[str, Any]]:
    """``(record type, datum)`` of a value under a session key (v1 or v2 head)."""
    name, rec = codec.decode_record(data)
    if name not in (CHECKPOINT_HEAD, "processor.v1.Checkpoint"):
        raise CodecError(f"expected a checkpoint record, got {name}")
    return name, rec
