"""Avro bodies from a schema compiled once into closures, without fastavro.

``fastavro.schemaless_writer`` re-collects the named types of the schema and
dispatches on each field's type at every call: ~75 µs for a 150-byte
``CheckpointHead``, one per changed session and batch (about 2% of the
service's CPU).  Compiling the parsed schema once into a plan (an
:class:`Op` per type, walked by one function) does that walk once; a head
then takes a few µs.

Only the types these schemas use are compiled (records, arrays, maps,
``[null, T]`` unions, long/int/string/bytes/boolean/enum, named
references); :func:`compile_writer` returns None for anything else.  The
writer raises ``Unsupported`` for a value it would not write exactly as
fastavro does (a missing field, a non-int long, an int out of range, a
value of the wrong type): the caller then runs fastavro, which writes it or
gives its own error, so the bytes and the errors are fastavro's either way.
The tests compare the bytes with fastavro's for arbitrary values.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from processor.codec.avro_fast import _INT_MAX, _INT_MIN, _LONG_MAX, _LONG_MIN, varint
from processor.codec.names import CodecError

Writer = Callable[[Any], bytes]


class Unsupported(CodecError):
    """A value the compiled writer leaves to fastavro (never escapes the codec:
    ``Codec.encode_record`` catches it and runs fastavro)."""


# What an :class:`Op` writes.  A plan of ops walked by one function (compiled:
# native calls and attribute reads) rather than a closure per type: a closure
# call is a Python call, ~0.8k instructions each, ~100 per checkpoint head.
_NULL: Final = 0
_BOOLEAN: Final = 1
_RANGED: Final = 2  # int / long: ``lo <= v <= hi``
_STRING: Final = 3
_BYTES: Final = 4
_RECORD: Final = 5
_ARRAY: Final = 6
_MAP: Final = 7
_ENUM_OP: Final = 8
_UNION: Final = 9
_REF: Final = 10  # a named record by name (a record naming itself)


#: |n| below this is a small (unboxed) int when compiled: compared natively
_SMALL_INT: Final = 1 << 60
_MISSING: Final = object()


class Op:
    """One type of the compiled schema: ``kind`` and what that kind needs."""

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.lo = 0
        self.hi = 0
        self.wide = False  # ``lo``/``hi`` beyond the small ints (a long)
        self.fields: tuple[tuple[str, Op], ...] = ()
        self.item: Op | None = None  # array items, map values, the union's type
        self.symbols: dict[str, bytes] = {}
        self.null_first = True  # union: ``[null, T]`` (else ``[T, null]``)
        self.name = ""
        self.named: dict[str, Op | None] = {}


def _ranged(lo: int, hi: int) -> Op:
    op = Op(_RANGED)
    op.lo, op.hi = lo, hi
    op.wide = not -_SMALL_INT < lo <= hi < _SMALL_INT
    return op


def _leaf(op: Op, out: list[bytes], v: Any) -> None:
    """A primitive or an enum (``op.kind`` < ``_RECORD``, or ``_ENUM_OP``)."""
    kind = op.kind
    if kind == _RANGED:
        if type(v) is not int:
            raise Unsupported
        n: int = v
        if op.wide:  # a long's bounds are not small ints: compare them only when due
            if not -_SMALL_INT < n < _SMALL_INT and not _LONG_MIN <= n <= _LONG_MAX:
                raise Unsupported
        elif not op.lo <= n <= op.hi:
            raise Unsupported
        out.append(varint(n))
    elif kind == _STRING:
        if type(v) is not str:
            raise Unsupported
        b = v.encode()
        out.append(varint(len(b)))
        out.append(b)
    elif kind == _BYTES:
        if type(v) is not bytes:
            raise Unsupported
        out.append(varint(len(v)))
        out.append(v)
    elif kind == _BOOLEAN:
        if v is True:
            out.append(b"\x01")
        elif v is False:
            out.append(b"\x00")
        else:
            raise Unsupported
    elif kind == _NULL:
        if v is not None:
            raise Unsupported
    else:  # _ENUM_OP
        tag = op.symbols.get(v) if type(v) is str else None
        if tag is None:
            raise Unsupported
        out.append(tag)


def _emit(op: Op, out: list[bytes], v: Any) -> None:
    """Append the encoding of ``v`` as ``op``; raise Unsupported where fastavro decides."""
    kind = op.kind
    if kind < _RECORD or kind == _ENUM_OP:
        _leaf(op, out, v)
    elif kind == _RECORD:
        if type(v) is not dict:
            raise Unsupported
        d: dict[str, Any] = v
        for key, field in op.fields:
            x = d.get(key, _MISSING)  # one lookup; ``key`` interned, as the datum's are
            if x is _MISSING:  # fastavro would write the default, or refuse
                raise Unsupported
            _emit(field, out, x)
    elif kind == _UNION:
        item = op.item
        assert item is not None
        if v is None:
            out.append(b"\x00" if op.null_first else b"\x02")
        else:
            out.append(b"\x02" if op.null_first else b"\x00")
            _emit(item, out, v)
    elif kind == _ARRAY:
        item = op.item
        assert item is not None
        if type(v) is not list:
            raise Unsupported
        items: list[Any] = v
        if items:
            out.append(varint(len(items)))
            for x in items:
                _emit(item, out, x)
        out.append(b"\x00")
    elif kind == _MAP:
        _map(op, out, v)
    else:  # _REF
        done = op.named[op.name]
        assert done is not None  # compiled by the time a value reaches it
        _emit(done, out, v)


def _map(op: Op, out: list[bytes], v: Any) -> None:
    item = op.item
    assert item is not None
    if type(v) is not dict:
        raise Unsupported
    if v:
        out.append(varint(len(v)))
        for key, x in v.items():
            if type(key) is not str:
                raise Unsupported
            b = key.encode()
            out.append(varint(len(b)))
            out.append(b)
            _emit(item, out, x)
    out.append(b"\x00")


_PRIMITIVES: Final[dict[str, Op]] = {
    "null": Op(_NULL),
    "boolean": Op(_BOOLEAN),
    "int": _ranged(_INT_MIN, _INT_MAX),
    "long": _ranged(_LONG_MIN, _LONG_MAX),
    "string": Op(_STRING),
    "bytes": Op(_BYTES),
}


def _compile(t: Any, named: dict[str, Op | None], fields_of: dict[str, Any]) -> Op | None:
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return _PRIMITIVES[t]
        if t in named:  # a reference to a type compiled already
            done = named[t]
            if done is not None:
                return done
            ref = Op(_REF)  # a record naming itself
            ref.name, ref.named = t, named
            return ref
        if t in fields_of:
            return _compile(fields_of[t], named, fields_of)
        return None
    if isinstance(t, list):
        return _union(t, named, fields_of)
    if not isinstance(t, Mapping):
        return None
    kind = t.get("type")
    if kind == "record":
        return _record(t, named, fields_of)
    if kind in ("array", "map"):
        item = _compile(t.get("items" if kind == "array" else "values"), named, fields_of)
        if item is None:
            return None
        op = Op(_ARRAY if kind == "array" else _MAP)
        op.item = item
        return op
    if kind == "enum":
        op = Op(_ENUM_OP)
        op.symbols = {s: varint(i) for i, s in enumerate(t.get("symbols", ()))}
        named[str(t.get("name"))] = op
        return op
    if isinstance(kind, str) and kind in _PRIMITIVES and "logicalType" not in t:
        return _PRIMITIVES[kind]  # {"type": "long"}
    return None


def _record(
    t: Mapping[str, Any], named: dict[str, Op | None], fields_of: dict[str, Any]
) -> Op | None:
    name = str(t.get("name"))
    named[name] = None  # placeholder: a self-reference resolves at call time
    fields: list[tuple[str, Op]] = []
    for f in t.get("fields", ()):
        op = _compile(f.get("type"), named, fields_of)
        if op is None:
            return None
        fields.append((sys.intern(str(f.get("name"))), op))
    record = Op(_RECORD)
    record.fields = tuple(fields)
    named[name] = record
    return record


def _union(
    branches: list[Any], named: dict[str, Op | None], fields_of: dict[str, Any]
) -> Op | None:
    """``[null, T]`` in either order; other unions are left to fastavro."""
    if len(branches) != 2 or branches.count("null") != 1:
        return None
    null_at = branches.index("null")
    item = _compile(branches[1 - null_at], named, fields_of)
    if item is None:
        return None
    op = Op(_UNION)
    op.item, op.null_first = item, null_at == 0
    return op


def compile_writer(parsed: Mapping[str, Any]) -> Writer | None:
    """A function from a datum to the body fastavro would write, or None when the
    schema has a type compiled here does not handle.  The function raises
    :class:`Unsupported` for a datum it leaves to fastavro."""
    fields_of: dict[str, Any] = dict(parsed.get("__named_schemas") or {})
    root = _compile(dict(parsed), {}, fields_of)
    if root is None:
        return None

    def write(datum: Any) -> bytes:
        out: list[bytes] = []
        _emit(root, out, datum)
        return b"".join(out)

    return write
