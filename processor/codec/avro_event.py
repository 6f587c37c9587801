"""``SessionEvent`` bodies read without fastavro (issue 15).

Every consumed event is decoded once, and figure 1's ceiling does the same
decode: ``fastavro.schemaless_reader`` costs a ``BytesIO``, a schema walk and
a per-field dispatch per call, about half of ``Codec.decode_event``.  The
``SessionEvent`` layout is flat (strings, longs and four small unions), so
its binary form is read here with a few slices.

Only the exact layout :data:`EVENT_CANONICAL` is read (the codec compares a
writer schema's Parsing Canonical Form once), and only bodies that are
plainly well formed: a truncated or overlong body, a varint past 64 bits, a
non-canonical union branch or boolean byte, a negative length or block
count, invalid UTF-8 or trailing bytes give ``None``, and the codec reads
that body with fastavro, so what fastavro accepts or refuses (and its error
text) stays the reference.  ``tests/service/test_avro_event.py`` compares
both readers on arbitrary and corrupted bodies.
"""

from __future__ import annotations

from typing import Any, Final

#: the fields of a ``SessionEvent`` in schema order: sessionId, type, seq, time,
#: data, surfaceOp, sourceEventSeqs, ignorable, producer (a native tuple when
#: compiled: read straight into the envelope, no dict in between)
EventFields = tuple[str, str, int, int, str, Any, Any, Any, str | None]

#: Parsing Canonical Form of the writer schema this module reads
#: (schemas/session_event.avsc, version 2).
EVENT_CANONICAL: Final = (
    '{"name":"processor.v1.SessionEvent","type":"record","fields":['
    '{"name":"sessionId","type":"string"},{"name":"type","type":"string"},'
    '{"name":"seq","type":"long"},{"name":"time","type":"long"},'
    '{"name":"data","type":"string"},'
    '{"name":"surfaceOp","type":["null","string",'
    '{"name":"processor.v1.ReplaceOp","type":"record","fields":['
    '{"name":"op","type":"string"},{"name":"startSeq","type":"long"},'
    '{"name":"endSeq","type":"long"}]},'
    '{"name":"processor.v1.OpaqueJson","type":"record","fields":['
    '{"name":"json","type":"string"}]}]},'
    '{"name":"sourceEventSeqs","type":["null",{"type":"array","items":"long"},'
    '"processor.v1.OpaqueJson"]},'
    '{"name":"ignorable","type":["null","boolean","processor.v1.OpaqueJson"]},'
    '{"name":"producer","type":["null","string"]}]}'
)


# A body this reader leaves to fastavro raises IndexError, as a body cut short
# does: one signal, caught in one place, and no exception class of our own that
# could escape (tests/test_errors.py: every class of ours is a ProcessorError).


def _long(b: bytes, i: int) -> tuple[int, int]:
    """Zigzag varint at ``i``: (value, next position)."""
    x = b[i]
    if x < 0x80:
        return (x >> 1) ^ -(x & 1), i + 1
    z = x & 0x7F
    shift = 7
    i += 1
    while True:
        x = b[i]
        i += 1
        if shift == 63 and x > 1:
            raise IndexError  # past 64 bits: fastavro's C reader would wrap
        z |= (x & 0x7F) << shift
        if x < 0x80:
            return (z >> 1) ^ -(z & 1), i
        shift += 7
        if shift > 63:
            raise IndexError


def _str(b: bytes, i: int) -> tuple[str, int]:
    n, i = _long(b, i)
    end = i + n
    if n < 0 or end > len(b):
        raise IndexError
    return b[i:end].decode("utf-8"), end


def _branch(b: bytes, i: int, branches: int) -> int:
    """A union's branch index, written as one byte by every Avro writer we know."""
    x = b[i]
    if x & 1 or x >= 2 * branches:
        raise IndexError
    return x >> 1


def _opaque(b: bytes, i: int) -> tuple[dict[str, Any], int]:
    text, i = _str(b, i)
    return {"json": text}, i


def _read_fields(b: bytes, i: int) -> EventFields:
    session_id, i = _str(b, i)
    etype, i = _str(b, i)
    seq, i = _long(b, i)
    time, i = _long(b, i)
    data, i = _str(b, i)
    op: Any = None
    branch = _branch(b, i, 4)
    i += 1
    if branch == 1:
        op, i = _str(b, i)
    elif branch == 2:
        name, i = _str(b, i)
        start, i = _long(b, i)
        end, i = _long(b, i)
        op = {"op": name, "startSeq": start, "endSeq": end}
    elif branch == 3:
        op, i = _opaque(b, i)
    seqs: Any = None
    branch = _branch(b, i, 3)
    i += 1
    if branch == 1:
        items: list[int] = []
        while True:
            count, i = _long(b, i)
            if count == 0:
                break
            if count < 0:
                raise IndexError  # a block with its byte size: fastavro's case
            for _ in range(count):
                item, i = _long(b, i)
                items.append(item)
        seqs = items
    elif branch == 2:
        seqs, i = _opaque(b, i)
    flag: Any = None
    branch = _branch(b, i, 3)
    i += 1
    if branch == 1:
        x = b[i]
        i += 1
        if x > 1:
            raise IndexError
        flag = x == 1
    elif branch == 2:
        flag, i = _opaque(b, i)
    producer: str | None = None
    branch = _branch(b, i, 2)
    i += 1
    if branch == 1:
        producer, i = _str(b, i)
    if i != len(b):
        raise IndexError
    return session_id, etype, seq, time, data, op, seqs, flag, producer


def read_event(data: bytes, offset: int) -> dict[str, Any] | None:
    """The datum fastavro would read from the ``SessionEvent`` body at ``offset``
    (the whole rest of ``data``), or None: let fastavro read it."""
    fields = read_event_fields(data, offset)
    if fields is None:
        return None
    sid, etype, seq, time, text, op, seqs, flag, producer = fields
    return {
        "sessionId": sid,
        "type": etype,
        "seq": seq,
        "time": time,
        "data": text,
        "surfaceOp": op,
        "sourceEventSeqs": seqs,
        "ignorable": flag,
        "producer": producer,
    }


def read_event_fields(data: bytes, offset: int) -> EventFields | None:
    """:func:`read_event`'s datum as its fields in schema order, or None (fastavro's
    case): the codec builds the envelope from them without a dict per event in
    between (its nine look-ups were ~2.5k instructions of ~17k per decode,
    figure 1)."""
    if type(data) is not bytes:
        return None
    try:
        return _read_fields(data, offset)
    except (IndexError, UnicodeDecodeError):
        return None
