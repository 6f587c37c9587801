"""The schema-compiled Avro writer (codec/avro_compiled.py) writes fastavro's bytes.

Values are drawn from each schema the codec writes, with some of the wrong
type or out of range mixed in: for those the compiled writer must step
aside (``Unsupported``) so the codec's bytes or errors stay fastavro's.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.codec import CodecError, default_codec
from processor.codec.avro_compiled import Unsupported, compile_writer
from processor.codec.names import CHECKPOINT_HEAD, DEAD_LETTER

CODEC = default_codec()
NAMES = [CHECKPOINT_HEAD, DEAD_LETTER, "processor.v1.Checkpoint"]

odd = st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=3))


def values(t: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly values of type ``t``, sometimes not."""
    return st.one_of(_typed(t, named), odd) if isinstance(t, str) else _typed(t, named)


def _typed(t: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    if isinstance(t, list):
        return st.one_of(*(_typed(b, named) for b in t))
    if isinstance(t, dict):
        kind = t["type"]
        if kind == "record":
            named[t["name"]] = t
            fields = {f["name"]: values(f["type"], named) for f in t["fields"]}
            return st.fixed_dictionaries({}, optional=fields) | st.fixed_dictionaries(fields)
        if kind == "array":
            return st.lists(values(t["items"], named), max_size=4)
        if kind == "map":
            return st.dictionaries(st.text(max_size=4), values(t["values"], named), max_size=3)
        if kind == "enum":
            return st.sampled_from([*t["symbols"], "NOPE"])
        return _typed(kind, named)
    primitives: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(),
        "long": st.integers(-(1 << 63), (1 << 63) - 1),
        "string": st.text(max_size=20),
        "bytes": st.binary(max_size=20),
    }
    if t in primitives:
        return primitives[t]
    return st.deferred(lambda: _typed(named[t], named))  # a named type


def fastavro_body(schema: Any, datum: Any) -> bytes | None:
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, schema, datum)
    except Exception:
        return None
    return buf.getvalue()


@pytest.mark.parametrize("name", NAMES)
def test_the_record_schemas_the_engine_writes_compile(name: str) -> None:
    assert compile_writer(CODEC.store.current(name).parsed) is not None


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_compiled_body_is_fastavros_or_left_to_fastavro(name: str, data: st.DataObject) -> None:
    schema = CODEC.store.current(name).parsed
    datum = data.draw(_typed(dict(schema), {}))
    write = compile_writer(schema)
    assert write is not None
    expected = fastavro_body(schema, datum)
    try:
        got = write(datum)
    except Unsupported:
        got = None  # fastavro's turn: the codec's bytes are its bytes
    if got is not None:
        assert got == expected
    if expected is not None:  # and through the codec, whoever wrote it
        assert CODEC.encode_record(name, datum) == CODEC.header(name) + expected
    else:
        with pytest.raises(CodecError):
            CODEC.encode_record(name, datum)


def test_unions_other_than_null_or_one_type_and_logical_types_are_not_compiled() -> None:
    record = {"type": "record", "name": "R", "fields": []}
    for t in (["null", "long", "string"], {"type": "long", "logicalType": "timestamp-millis"}):
        schema = fastavro.parse_schema({**record, "fields": [{"name": "x", "type": t}]})
        assert isinstance(schema, dict) and compile_writer(schema) is None


@pytest.mark.parametrize(
    "kind, n",
    [
        (kind, n)
        for kind in ("int", "long")
        for edge in (1 << 31, 1 << 60, 1 << 62, 1 << 63)
        for n in (edge - 1, edge, edge + 1, -edge - 1, -edge, -edge + 1)
    ],
)
def test_ints_at_the_edges_of_their_range_and_of_the_small_ints(kind: str, n: int) -> None:
    """The range checks compare small ints natively and a long's bounds only past
    them (avro_compiled ``Op.wide``): each edge is fastavro's bytes or left to it."""
    record = {"type": "record", "name": "R", "fields": [{"name": "x", "type": kind}]}
    schema = fastavro.parse_schema(record)
    assert isinstance(schema, dict)
    write = compile_writer(schema)
    assert write is not None
    try:
        got: bytes | None = write({"x": n})
    except Unsupported:
        got = None  # fastavro's turn
    lo, hi = (-(1 << 31), (1 << 31) - 1) if kind == "int" else (-(1 << 63), (1 << 63) - 1)
    assert (got is not None) == (lo <= n <= hi)
    if got is not None:
        assert got == fastavro_body(schema, {"x": n})
