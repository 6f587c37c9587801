"""The hand-written Avro bodies of View and CheckpointPart equal fastavro's."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.codec import CodecError, View, default_codec
from processor.codec.avro_fast import PART_LAYOUT, VIEW_LAYOUT, layout_matches, part_body
from processor.codec.names import CHECKPOINT_PART, VIEW

CODEC = default_codec()
longs = st.integers(-(1 << 63), (1 << 63) - 1)
ints = st.integers(-(1 << 31), (1 << 31) - 1)
encodings = st.sampled_from(["JSON", "ZSTD_JSON"])


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(), longs, ints, encodings, st.binary(max_size=300), st.data())
def test_a_view_encodes_to_fastavros_bytes(
    sid: str, name: str, as_of: int, version: int, encoding: str, value: bytes, data: st.DataObject
) -> None:
    parts = data.draw(st.integers(1, (1 << 31) - 1))
    part = data.draw(st.integers(0, parts - 1))
    view = View(sid, name, as_of, version, encoding, value, part, parts)  # type: ignore[arg-type]
    datum = {
        "sessionId": sid,
        "view": name,
        "asOfSeq": as_of,
        "stateVersion": version,
        "encoding": encoding,
        "value": value,
        "part": part,
        "parts": parts,
    }
    fast = CODEC.encode_view(view)
    assert fast == CODEC.encode_record(VIEW, datum)
    assert CODEC.decode_view(fast) == view


@settings(max_examples=300, deadline=None)
@given(st.text(), longs, encodings, st.binary(max_size=300))
def test_a_checkpoint_part_encodes_to_fastavros_bytes(
    name: str, version: int, encoding: str, value: bytes
) -> None:
    datum = {"name": name, "version": version, "encoding": encoding, "value": value}
    fast = CODEC.header(CHECKPOINT_PART) + part_body(name, version, encoding, value)
    assert fast == CODEC.encode_record(CHECKPOINT_PART, datum)


def test_out_of_range_numbers_and_unknown_encodings_are_refused() -> None:
    with pytest.raises(CodecError, match="version must be a long"):
        part_body("e.1", 1 << 63, "JSON", b"")
    with pytest.raises(CodecError, match="unknown encoding"):
        part_body("e.1", 0, "GZIP", b"")
    with pytest.raises(CodecError, match="stateVersion must be a 32-bit int"):
        CODEC.encode_view(View("s", "v", 0, 1 << 31, "JSON", b"", 0, 1))


def test_a_schema_whose_layout_changed_is_not_encoded_by_hand() -> None:
    assert layout_matches(CODEC.store.current(VIEW).parsed, VIEW_LAYOUT)
    assert layout_matches(CODEC.store.current(CHECKPOINT_PART).parsed, PART_LAYOUT)
    changed = copy.deepcopy(CODEC.store.current(VIEW).parsed)
    changed["fields"].append({"name": "extra", "type": "long"})
    assert not layout_matches(changed, VIEW_LAYOUT)
    changed = copy.deepcopy(CODEC.store.current(CHECKPOINT_PART).parsed)
    changed["fields"][1]["type"] = "int"
    assert not layout_matches(changed, PART_LAYOUT)
