"""Avro bodies of the two records the engine writes most, without fastavro.

The parted format writes a record per message and per node event (issue
12): a ``View`` or ``CheckpointPart`` per record, ~10 µs each through
``fastavro.schemaless_writer`` (BytesIO, schema walk, per-field dispatch),
about a tenth of a batch's CPU.  Both schemas are flat (strings, longs,
ints, an enum, bytes), so their binary encoding is a few concatenations.

The layouts are checked against the current schemas once
(:func:`layout_matches`): a schema that changed falls back to fastavro
rather than writing a body its readers would misread, and the tests compare
the bytes with fastavro's for arbitrary values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from processor.codec.names import _ENCODINGS, CodecError

_LONG_MIN: Final = -(1 << 63)
_LONG_MAX: Final = (1 << 63) - 1
_INT_MIN: Final = -(1 << 31)
_INT_MAX: Final = (1 << 31) - 1
_ENUM: Final = {name: bytes([2 * i]) for i, name in enumerate(_ENCODINGS)}  # zigzag(i), i < 64

#: (field name, Avro type) of the layouts encoded here; an enum is "enum:<symbols>".
VIEW_LAYOUT: Final = (
    ("sessionId", "string"),
    ("view", "string"),
    ("asOfSeq", "long"),
    ("stateVersion", "int"),
    ("encoding", "enum:" + ",".join(_ENCODINGS)),
    ("value", "bytes"),
    ("part", "int"),
    ("parts", "int"),
)
PART_LAYOUT: Final = (
    ("name", "string"),
    ("version", "long"),
    ("encoding", "enum:" + ",".join(_ENCODINGS)),
    ("value", "bytes"),
)


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, Mapping) and t.get("type") == "enum":
        return "enum:" + ",".join(t.get("symbols", ()))
    if isinstance(t, Mapping) and isinstance(t.get("type"), str):
        return _type_name(t["type"])
    return repr(t)


def layout_matches(parsed_schema: Mapping[str, Any], layout: Sequence[tuple[str, str]]) -> bool:
    """Does the (fastavro-parsed) record schema have exactly these fields?"""
    fields = parsed_schema.get("fields") or ()
    have = tuple((f.get("name"), _type_name(f.get("type"))) for f in fields)
    return have == tuple(layout)


#: zigzag varints of small values, precomputed (seqs, counts, lengths)
_SMALL: Final = [
    bytes((z,)) if z < 0x80 else bytes(((z & 0x7F) | 0x80, z >> 7))
    for z in ((n << 1) ^ (n >> 63) for n in range(-4096, 4096))
]


def varint(n: int) -> bytes:
    """Avro ``long``/``int``: zigzag, then base-128 little-endian."""
    if -4096 <= n < 4096:
        return _SMALL[n + 4096]
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _long(record: str, name: str, n: int, lo: int = _LONG_MIN, hi: int = _LONG_MAX) -> bytes:
    if type(n) is not int or not lo <= n <= hi:
        kind = "long" if hi == _LONG_MAX else "32-bit int"
        raise CodecError(f"cannot encode {record}: {name} must be a {kind}, got {n!r}")
    return varint(n)


def _bytes(b: bytes) -> bytes:
    return varint(len(b)) + b


def _enum(record: str, encoding: str) -> bytes:
    tag = _ENUM.get(encoding)
    if tag is None:
        raise CodecError(f"cannot encode {record}: unknown encoding {encoding!r}")
    return tag


def view_body(
    session_id: str,
    view: str,
    as_of_seq: int,
    state_version: int,
    encoding: str,
    value: bytes,
    part: int,
    parts: int,
    head: bytes = b"",
) -> bytes:
    """The Avro body of a ``View`` record (:data:`VIEW_LAYOUT`) after ``head`` (the
    frame prefix): one join, so the payload is copied once, not per concatenation."""
    r = "processor.v1.View"
    sid, name = session_id.encode(), view.encode()
    return b"".join(
        (
            head,
            varint(len(sid)),
            sid,
            varint(len(name)),
            name,
            _long(r, "asOfSeq", as_of_seq),
            _long(r, "stateVersion", state_version, _INT_MIN, _INT_MAX),
            _enum(r, encoding),
            varint(len(value)),
            value,
            _long(r, "part", part, _INT_MIN, _INT_MAX),
            _long(r, "parts", parts, _INT_MIN, _INT_MAX),
        )
    )


def part_body(name: str, version: int, encoding: str, value: bytes, head: bytes = b"") -> bytes:
    """The Avro body of a ``CheckpointPart`` record (:data:`PART_LAYOUT`) after ``head``."""
    r = "processor.v1.CheckpointPart"
    key = name.encode()
    return b"".join(
        (
            head,
            varint(len(key)),
            key,
            _long(r, "version", version),
            _enum(r, encoding),
            varint(len(value)),
            value,
        )
    )
