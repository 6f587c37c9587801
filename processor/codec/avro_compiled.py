"""Avro bodies from a schema compiled once into closures, without fastavro.

``fastavro.schemaless_writer`` re-collects the named types of the schema and
dispatches on each field's type at every call: ~75 µs for a 150-byte
``CheckpointHead``, one per changed session and batch (about 2% of the
service's CPU).  Compiling the parsed schema into one small function per
type does that walk once; a head then takes a few µs.

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

from collections.abc import Callable, Mapping
from typing import Any, Final

from processor.codec.avro_fast import _INT_MAX, _INT_MIN, _LONG_MAX, _LONG_MIN, varint
from processor.codec.names import CodecError

#: appends the encoding of one value to the output list
Emit = Callable[[list[bytes], Any], None]
Writer = Callable[[Any], bytes]


class Unsupported(CodecError):
    """A value the compiled writer leaves to fastavro (never escapes the codec:
    ``Codec.encode_record`` catches it and runs fastavro)."""


def _ranged(lo: int, hi: int) -> Emit:
    def emit(out: list[bytes], v: Any) -> None:
        if type(v) is not int or not lo <= v <= hi:
            raise Unsupported
        out.append(varint(v))

    return emit


def _string(out: list[bytes], v: Any) -> None:
    if type(v) is not str:
        raise Unsupported
    b = v.encode()
    out.append(varint(len(b)))
    out.append(b)


def _bytes(out: list[bytes], v: Any) -> None:
    if type(v) is not bytes:
        raise Unsupported
    out.append(varint(len(v)))
    out.append(v)


def _boolean(out: list[bytes], v: Any) -> None:
    if v is True:
        out.append(b"\x01")
    elif v is False:
        out.append(b"\x00")
    else:
        raise Unsupported


def _null(out: list[bytes], v: Any) -> None:
    if v is not None:
        raise Unsupported


_PRIMITIVES: Final[dict[str, Emit]] = {
    "null": _null,
    "boolean": _boolean,
    "int": _ranged(_INT_MIN, _INT_MAX),
    "long": _ranged(_LONG_MIN, _LONG_MAX),
    "string": _string,
    "bytes": _bytes,
}


def _late(named: dict[str, Emit | None], name: str) -> Emit:
    emit = named[name]
    assert emit is not None  # compiled by the time a value reaches it
    return emit


def _compile(t: Any, named: dict[str, Emit | None], fields_of: dict[str, Any]) -> Emit | None:
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return _PRIMITIVES[t]
        if t in named:  # a reference to a type compiled already
            done = named[t]
            if done is not None:
                return done
            return lambda out, v: _late(named, t)(out, v)  # a record naming itself
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
    if kind == "array":
        return _array(t.get("items"), named, fields_of)
    if kind == "map":
        return _map(t.get("values"), named, fields_of)
    if kind == "enum":
        symbols = {s: varint(i) for i, s in enumerate(t.get("symbols", ()))}
        emit = _enum(symbols)
        named[str(t.get("name"))] = emit
        return emit
    if isinstance(kind, str) and kind in _PRIMITIVES and "logicalType" not in t:
        return _PRIMITIVES[kind]  # {"type": "long"}
    return None


def _record(
    t: Mapping[str, Any], named: dict[str, Emit | None], fields_of: dict[str, Any]
) -> Emit | None:
    name = str(t.get("name"))
    named[name] = None  # placeholder: a self-reference resolves at call time
    fields: list[tuple[str, Emit]] = []
    for f in t.get("fields", ()):
        emit = _compile(f.get("type"), named, fields_of)
        if emit is None:
            return None
        fields.append((str(f.get("name")), emit))
    plan = tuple(fields)

    def record(out: list[bytes], v: Any) -> None:
        if type(v) is not dict:
            raise Unsupported
        for key, emit in plan:
            if key not in v:  # fastavro would write the default, or refuse
                raise Unsupported
            emit(out, v[key])

    named[name] = record
    return record


def _array(items: Any, named: dict[str, Emit | None], fields_of: dict[str, Any]) -> Emit | None:
    emit = _compile(items, named, fields_of)
    if emit is None:
        return None

    def array(out: list[bytes], v: Any) -> None:
        if type(v) is not list:
            raise Unsupported
        if v:
            out.append(varint(len(v)))
            for item in v:
                emit(out, item)
        out.append(b"\x00")

    return array


def _map(values: Any, named: dict[str, Emit | None], fields_of: dict[str, Any]) -> Emit | None:
    emit = _compile(values, named, fields_of)
    if emit is None:
        return None

    def map_(out: list[bytes], v: Any) -> None:
        if type(v) is not dict:
            raise Unsupported
        if v:
            out.append(varint(len(v)))
            for key, item in v.items():
                _string(out, key)
                emit(out, item)
        out.append(b"\x00")

    return map_


def _enum(symbols: dict[str, bytes]) -> Emit:
    def enum(out: list[bytes], v: Any) -> None:
        tag = symbols.get(v) if type(v) is str else None
        if tag is None:
            raise Unsupported
        out.append(tag)

    return enum


def _union(
    branches: list[Any], named: dict[str, Emit | None], fields_of: dict[str, Any]
) -> Emit | None:
    """``[null, T]`` in either order; other unions are left to fastavro."""
    if len(branches) != 2 or branches.count("null") != 1:
        return None
    null_at = branches.index("null")
    emit = _compile(branches[1 - null_at], named, fields_of)
    if emit is None:
        return None
    null_tag, value_tag = varint(null_at), varint(1 - null_at)

    def union(out: list[bytes], v: Any) -> None:
        if v is None:
            out.append(null_tag)
        else:
            out.append(value_tag)
            emit(out, v)

    return union


def compile_writer(parsed: Mapping[str, Any]) -> Writer | None:
    """A function from a datum to the body fastavro would write, or None when the
    schema has a type compiled here does not handle.  The function raises
    :class:`Unsupported` for a datum it leaves to fastavro."""
    fields_of: dict[str, Any] = dict(parsed.get("__named_schemas") or {})
    emit = _compile(dict(parsed), {}, fields_of)
    if emit is None:
        return None

    def write(datum: Any) -> bytes:
        out: list[bytes] = []
        emit(out, datum)
        return b"".join(out)

    return write
