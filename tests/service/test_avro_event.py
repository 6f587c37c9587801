"""The ``SessionEvent`` reader (codec/avro_event.py) reads what fastavro reads.

Whatever body it accepts, fastavro reads to the same datum and consumes all
of it; whatever it declines (None), the codec hands to fastavro, so a bad
record's error stays fastavro's.  Bodies are drawn valid, then corrupted
(bytes flipped, cut, appended) and as arbitrary bytes.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.codec import CodecError, default_codec
from processor.codec.avro_event import EVENT_CANONICAL, read_event, read_event_fields
from processor.codec.envelope import _event_from_record
from processor.codec.names import SESSION_EVENT

CODEC = default_codec()
SCHEMA = CODEC.store.current(SESSION_EVENT).parsed
HEADER = CODEC.header(SESSION_EVENT)

longs = st.integers(-(1 << 63), (1 << 63) - 1)
text = st.text(max_size=12)
opaque = st.builds(lambda s: {"json": s}, text)
datums = st.fixed_dictionaries(
    {
        "sessionId": text,
        "type": text,
        "seq": longs,
        "time": longs,
        "data": text,
        "surfaceOp": st.one_of(
            st.none(),
            text,
            st.fixed_dictionaries({"op": text, "startSeq": longs, "endSeq": longs}),
            opaque,
        ),
        "sourceEventSeqs": st.one_of(st.none(), st.lists(longs, max_size=70), opaque),
        "ignorable": st.one_of(st.none(), st.booleans(), opaque),
        "producer": st.one_of(st.none(), text),
    }
)


def body(datum: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, datum)
    return buf.getvalue()


def fastavro_read(data: bytes) -> dict[str, Any] | None:
    """fastavro's datum, or None when it fails or leaves bytes over."""
    fo = io.BytesIO(data)
    try:
        rec = fastavro.schemaless_reader(fo, SCHEMA, None)
    except Exception:
        return None
    return rec if fo.tell() == len(data) and isinstance(rec, dict) else None


def outcome(decode: Any, framed: bytes) -> Any:
    """What a decode gives: its value, or the text of its CodecError."""
    try:
        return decode(framed)
    except CodecError as exc:
        return f"CodecError: {exc}"


def slow_decode(framed: bytes) -> Any:
    return _event_from_record(CODEC.decode_record(framed, SESSION_EVENT)[1])


def check(data: bytes) -> dict[str, Any] | None:
    """read_event agrees with fastavro wherever it answers at all."""
    ours = read_event(b"\x00" + data, 1)  # at an offset, as behind a frame
    fields = read_event_fields(b"\x00" + data, 1)  # what the codec decodes from
    assert (fields is None) == (ours is None)
    if ours is not None:
        assert ours == fastavro_read(data)
        assert list(ours) == [f["name"] for f in SCHEMA["fields"]]
        assert list(fields or ()) == list(ours.values())
    return ours


def test_layout_is_the_current_schema() -> None:
    """The reader's layout is the current SessionEvent: the codec uses it."""
    assert to_parsing_canonical_form(SCHEMA) == EVENT_CANONICAL


@settings(max_examples=400, deadline=None)
@given(datums)
def test_valid_bodies_read_as_fastavro_does(datum: dict[str, Any]) -> None:
    data = body(datum)
    assert check(data) == fastavro_read(data) == datum
    framed = HEADER + data  # (``data`` is mostly not JSON: the same error either way)
    assert outcome(CODEC.decode_event, framed) == outcome(slow_decode, framed)


@settings(max_examples=400, deadline=None)
@given(datums, st.data())
def test_corrupted_bodies_are_read_as_fastavro_does_or_left_to_it(
    datum: dict[str, Any], draw: st.DataObject
) -> None:
    data = bytearray(body(datum))
    for _ in range(draw.draw(st.integers(1, 3))):
        how = draw.draw(st.sampled_from(["flip", "cut", "append", "byte"]))
        at = draw.draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "flip" and data:
            data[at] ^= 1 << draw.draw(st.integers(0, 7))
        elif how == "byte" and data:
            data[at] = draw.draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF]))
        elif how == "cut":
            del data[at:]
        else:
            data[at:at] = draw.draw(st.binary(min_size=1, max_size=3))
    check(bytes(data))
    framed = HEADER + bytes(data)  # the codec: ours where it reads, fastavro's otherwise
    assert outcome(CODEC.decode_event, framed) == outcome(slow_decode, framed)
    framed = HEADER + bytes(data)
    assert outcome(CODEC.decode_event, framed) == outcome(slow_decode, framed)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)
    framed = HEADER + data
    assert outcome(CODEC.decode_event, framed) == outcome(slow_decode, framed)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02",
        b"\x01a",  # negative length
        b"\x00" * 4 + b"\xff" * 10 + b"\x01",  # a varint past 64 bits
        b"\x00\x00\x00\x00\x00\x08\x00\x00\x00",  # surfaceOp branch 4 of 4
        b"\x00\x00\x00\x00\x00\x00\x00\x02\x04\x00",  # ignorable byte 4
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # trailing byte
        b"\x04\xed\xa0\x00\x00\x00\x00\x00\x00\x00",  # not UTF-8
        b"\x00\x00\x00\x00\x00\x00\x02\x01\x02\x00\x00\x00\x00",  # a sized array block
    ],
)
def test_odd_bodies_are_left_to_fastavro(data: bytes) -> None:
    assert read_event(data, 0) is None
    framed = HEADER + data
    assert str(outcome(CODEC.decode_event, framed)).startswith("CodecError")
    assert outcome(CODEC.decode_event, framed) == outcome(slow_decode, framed)


def test_a_minimal_body() -> None:
    datum = {
        "sessionId": "s",
        "type": "user/message",
        "seq": 3,
        "time": -1,
        "data": "{}",
        "surfaceOp": {"op": "replace", "startSeq": 1, "endSeq": 300},
        "sourceEventSeqs": [1, -2, 1 << 62],
        "ignorable": True,
        "producer": None,
    }
    assert read_event(HEADER + body(datum), len(HEADER)) == datum


def test_other_writer_schemas_are_read_by_fastavro() -> None:
    """A v1 writer (no ``producer``) is resolved by fastavro, not read here."""
    v1 = [
        info
        for info in CODEC.store._by_fp.values()
        if info.name == SESSION_EVENT and info.canonical != EVENT_CANONICAL
    ]
    assert v1, "the schema history holds the v1 SessionEvent"
    datum = {"sessionId": "s", "type": "t", "seq": 0, "time": 1, "data": "{}"}
    datum |= {"surfaceOp": None, "sourceEventSeqs": None, "ignorable": None}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, v1[0].parsed, datum)
    framed = b"\xc3\x01" + v1[0].fingerprint + buf.getvalue()
    decoded = CODEC.decode_event(framed)
    assert decoded.producer is None and decoded.seq == 0


def test_only_the_read_layouts_frame_head_skips_the_plan_lookup() -> None:
    """The codec remembers the single-object head of a writer avro_event.py
    reads (then a corrupt body behind it still goes to fastavro, as the
    parity tests above check with the head remembered); a v1 writer's head is
    never remembered, so its events keep being resolved by fastavro."""
    datum = {"sessionId": "s", "type": "t", "seq": 0, "time": 1, "data": "{}"}
    datum |= {"surfaceOp": None, "sourceEventSeqs": None, "ignorable": None}
    CODEC.decode_event(HEADER + body({**datum, "producer": None}))
    assert HEADER in CODEC._fast_event_heads
    v1 = next(
        info
        for info in CODEC.store._by_fp.values()
        if info.name == SESSION_EVENT and info.canonical != EVENT_CANONICAL
    )
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, v1.parsed, datum)
    framed = b"\xc3\x01" + v1.fingerprint + buf.getvalue()
    for _ in range(2):
        assert CODEC.decode_event(framed).producer is None
    assert CODEC._fast_event_heads == {HEADER}
    cut = HEADER[:6]  # a head cut short is not a remembered one
    assert str(outcome(CODEC.decode_event, cut)) == str(outcome(slow_decode, cut))
