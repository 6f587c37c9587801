"""Avro codec: schemas, framing, evolution, event envelope fidelity, payloads.

Pure tests: no broker, no registry server.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
import zstandard
from fastavro.schema import to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import processor
from processor import codec
from processor.codec import (
    CHECKPOINT,
    CORE_STATE_VERSION,
    DEAD_LETTER,
    SESSION_EVENT,
    VIEW,
    Anchor,
    Checkpoint,
    Codec,
    CodecError,
    DeadLetter,
    InMemorySchemaRegistry,
    SchemaStore,
    View,
    ViewAssembler,
    decode_checkpoint,
    decode_dead_letter,
    decode_event,
    decode_events_batch,
    decode_json_payload,
    decode_view,
    encode_checkpoint,
    encode_dead_letter,
    encode_event,
    encode_json_payload,
    encode_parsed_event,
    encode_view,
    join_view_parts,
    split_view,
    stale_part_keys,
    view_key,
)
from processor.codec import envelope as codec_envelope
from processor.codec import schemas as codec_schemas
from processor.core.errors import SessionError
from processor.core.events import make_event, parse_event

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas"
V1_PATH = SCHEMAS / "history" / "session_event.v1.avsc"
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def typical_envelope(seq: int = 12) -> dict[str, Any]:
    return {
        "type": "assistant/message",
        "seq": seq,
        "time": 1733140000000,
        "data": {
            "turn": 3,
            "step": 1,
            "stream": "s1",
            "message": {
                "id": f"m-{seq}",
                "role": "assistant",
                "content": [{"type": "text", "text": "Here is the summary. ünïcode ✓ 日本"}],
                "source": "model",
            },
            "usage": {"input": 1234, "output": 56},
        },
        "surfaceOp": "append",
    }


def strict_json(value: Any) -> bytes:
    """Comparison bytes that tell True from 1 and 1.0 from 1."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def outcome(envelope: dict[str, Any]) -> tuple[str, Any]:
    try:
        return ("ok", strict_json(parse_event(envelope).to_json()))
    except SessionError as exc:
        return ("error", str(exc))


# --------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------


def all_schema_files() -> list[Path]:
    return sorted(SCHEMAS.glob("*.avsc")) + sorted((SCHEMAS / "history").glob("*.avsc"))


def test_schema_files_are_documented_records_in_processor_v1() -> None:
    files = all_schema_files()
    assert {f.name for f in files} >= {
        "session_event.avsc",
        "view.avsc",
        "checkpoint.avsc",
        "dead_letter.avsc",
        "session_event.v1.avsc",
    }
    for file in files:
        schema = json.loads(file.read_text("utf-8"))
        fastavro.parse_schema(schema, {})
        assert schema["namespace"] == "processor.v1", file
        assert schema["type"] == "record" and schema["doc"], file
        for field in schema["fields"]:
            assert field.get("doc"), f"{file.name}: field {field['name']} has no doc"


def test_schema_store_indexes_current_and_history() -> None:
    store = SchemaStore.from_directory(SCHEMAS)
    names = {(info.name, info.current) for info in store}
    assert names == {
        (SESSION_EVENT, True),
        (SESSION_EVENT, False),
        (VIEW, True),
        (CHECKPOINT, True),
        ("processor.v1.CheckpointHead", True),
        ("processor.v1.CheckpointHead", False),  # its units had no leaves
        ("processor.v1.CheckpointPart", True),
        (DEAD_LETTER, True),
    }
    v1 = json.loads(V1_PATH.read_text("utf-8"))
    assert codec.schema_fingerprint(v1) != store.current(SESSION_EVENT).fingerprint
    assert store.get(codec.schema_fingerprint(v1)) is not None


def test_default_store_is_loaded_once() -> None:
    assert SchemaStore.default() is SchemaStore.default()
    assert codec.default_codec() is codec.default_codec()


def test_schema_dir_falls_back_to_package_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the repository's schemas/ for the checkout's source; the wheel's copy for an
    # installed package (the compiled suite runs on the installed wheel)
    package = Path(str(processor.__file__)).resolve().parent
    assert codec.find_schema_dir() == (SCHEMAS if package.parent == REPO else package / "schemas")
    pkg = tmp_path / "site" / "processor"
    (pkg / "service" / "codec").mkdir(parents=True)
    shutil.copytree(SCHEMAS, pkg / "schemas")
    monkeypatch.setattr(codec_schemas, "__file__", str(pkg / "service" / "codec" / "schemas.py"))
    assert codec.find_schema_dir() == pkg / "schemas"
    shutil.rmtree(pkg / "schemas")
    with pytest.raises(CodecError, match="schemas not found"):
        codec.find_schema_dir()


def test_two_current_schemas_for_one_name_are_refused(tmp_path: Path) -> None:
    for file in SCHEMAS.glob("*.avsc"):
        shutil.copy(file, tmp_path / file.name)
    shutil.copy(V1_PATH, tmp_path / "session_event_old.avsc")
    with pytest.raises(CodecError, match="two current schemas"):
        SchemaStore.from_directory(tmp_path)


# --------------------------------------------------------------------------
# Single-object framing
# --------------------------------------------------------------------------


def crc64_avro(data: bytes) -> int:
    """Independent CRC-64-AVRO (Rabin) from the Avro specification."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_crc64_reference_vector() -> None:
    # From the Avro test suite (schema-tests.txt): "null" -> 7195948357588979594.
    assert crc64_avro(b'"null"') == 7195948357588979594


def test_single_object_framing_bytes() -> None:
    data = encode_event("s-1", typical_envelope())
    current = json.loads((SCHEMAS / "session_event.avsc").read_text("utf-8"))
    canonical = to_parsing_canonical_form(fastavro.parse_schema(current, {}))
    assert '"doc"' not in canonical and "default" not in canonical
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == crc64_avro(canonical.encode()).to_bytes(8, "little")
    assert data[2:10] == codec.schema_fingerprint(current)
    # the body is plain schemaless Avro of the current schema
    body = fastavro.schemaless_reader(io.BytesIO(data[10:]), fastavro.parse_schema(current, {}))
    assert isinstance(body, dict) and body["sessionId"] == "s-1" and body["seq"] == 12


# --------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------


def test_event_round_trip_typical() -> None:
    env = typical_envelope()
    decoded = decode_event(encode_event("sess-0001", env))
    assert decoded.session_id == "sess-0001"
    assert decoded.envelope == env
    assert strict_json(decoded.envelope) == strict_json(env)
    assert decoded.data_text == orjson.dumps(env["data"]).decode()
    assert decoded.producer is None
    assert decoded.seq == 12
    assert decoded.to_event().to_json() == parse_event(env).to_json()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"surfaceOp": "append"},
        {"surfaceOp": {"op": "replace", "startSeq": 2, "endSeq": 4}, "sourceEventSeqs": [2, 4]},
        {"surfaceOp": {"op": "replace", "startSeq": 2}},  # missing endSeq
        {"surfaceOp": {"op": "replace", "startSeq": 2, "endSeq": 4, "x": 1}},  # extra key
        {"surfaceOp": {"op": "replace", "startSeq": True, "endSeq": 4}},  # bool is not a seq
        {"surfaceOp": {"op": "replace", "startSeq": -1, "endSeq": 4}},
        {"surfaceOp": {"op": "replace", "startSeq": 1.0, "endSeq": 4}},
        {"surfaceOp": {"op": "Replace", "startSeq": 1, "endSeq": 4}},
        {"surfaceOp": None},  # explicit null is not "absent"
        {"surfaceOp": "prepend"},
        {"surfaceOp": ["append"]},
        {"surfaceOp": 7},
        {"sourceEventSeqs": None},
        {"sourceEventSeqs": []},
        {"sourceEventSeqs": [True, 1]},
        {"sourceEventSeqs": [1.5]},
        {"sourceEventSeqs": [-3, LONG_MAX, LONG_MIN]},
        {"sourceEventSeqs": {"a": 1}},
        {"sourceEventSeqs": "1,2"},
        {"ignorable": True},
        {"ignorable": False},
        {"ignorable": None},
        {"ignorable": "yes"},
        {"ignorable": 1},
    ],
)
def test_envelope_optional_keys_round_trip_in_meaning(extra: dict[str, Any]) -> None:
    env = {
        "type": "user/message",
        "seq": 3,
        "time": 5,
        "data": {"id": "u", "role": "user", "content": []},
        **extra,
    }
    decoded = decode_event(encode_event("s", env)).envelope
    assert decoded == env
    assert strict_json(decoded) == strict_json(env)
    assert list(decoded) == list(env)
    assert outcome(decoded) == outcome(env)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(LONG_MIN, LONG_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)
seqs = st.integers(0, LONG_MAX)
ops = st.one_of(
    st.just("append"),
    st.builds(lambda a, b: {"op": "replace", "startSeq": a, "endSeq": b}, seqs, seqs),
    st.dictionaries(st.sampled_from(["op", "startSeq", "endSeq", "x"]), json_values, max_size=4),
    st.fixed_dictionaries(
        {
            "op": st.sampled_from(["replace", "append", ""]),
            "startSeq": json_values,
            "endSeq": json_values,
        }
    ),
    st.none(),
    st.lists(st.integers(LONG_MIN, LONG_MAX), max_size=4),
    json_values,
)
source_seqs = st.one_of(st.lists(st.integers(LONG_MIN, LONG_MAX), max_size=5), json_values)
types = st.sampled_from(
    [
        "user/message",
        "assistant/message",
        "tool/result",
        "turn/start",
        "tool/call",
        "custom/thing",
        "image/offload",
    ]
) | st.text(min_size=0, max_size=12)


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    env: dict[str, Any] = {
        "type": draw(types),
        "seq": draw(st.integers(LONG_MIN, LONG_MAX) | seqs),
        "time": draw(st.integers(LONG_MIN, LONG_MAX)),
        "data": draw(json_values),
    }
    if draw(st.booleans()):
        env["surfaceOp"] = draw(ops)
    if draw(st.booleans()):
        env["sourceEventSeqs"] = draw(source_seqs)
    if draw(st.booleans()):
        env["ignorable"] = draw(st.booleans() | json_values)
    return env


@FAST
@given(env=envelopes(), session=st.text(max_size=30))
def test_event_round_trip_property(env: dict[str, Any], session: str) -> None:
    data = encode_event(session, env)
    decoded = decode_event(data)
    assert decoded.session_id == session
    assert decoded.envelope == env
    assert strict_json(decoded.envelope) == strict_json(env)
    assert decoded.data_text == orjson.dumps(env["data"]).decode()
    # the processor's verdict is the same on the JSON and on the Avro record
    assert outcome(decoded.envelope) == outcome(env)
    # and the record is deterministic
    assert encode_event(session, decoded.envelope) == data


def test_data_text_is_carried_verbatim() -> None:
    text = '{"b": 1.0,  "a":"\\u00e9\\ud83d\\ude00", "n": 18446744073709551615 }'
    env = {"type": "turn/start", "seq": 0, "time": 1, "data": orjson.loads(text)}
    decoded = decode_event(encode_event("s", env, data_text=text))
    assert decoded.data_text == text
    assert decoded.envelope["data"] == {"b": 1.0, "a": "é😀", "n": 18446744073709551615}


def test_invalid_data_text_is_refused_unless_trusted() -> None:
    env = {"type": "turn/start", "seq": 0, "time": 1, "data": {}}
    with pytest.raises(CodecError, match="data_text is not valid JSON"):
        encode_event("s", env, data_text="{nope")
    data = encode_event("s", env, data_text="{nope", trusted=True)
    with pytest.raises(CodecError, match="data is not valid JSON"):
        decode_event(data)


def test_producer_field_round_trips() -> None:
    data = encode_event("s", typical_envelope(), producer="processor.SessionWriter/0.1")
    assert decode_event(data).producer == "processor.SessionWriter/0.1"


def test_encode_parsed_event() -> None:
    event = make_event(
        "tool/result",
        9,
        {"turn": 1, "step": 1, "message": {"id": "t", "role": "tool", "content": []}},
        time=77,
        surface_op={"op": "replace", "startSeq": 4, "endSeq": 4},
        source_event_seqs=[4],
    )
    decoded = decode_event(encode_parsed_event("s", event, producer="w"))
    assert decoded.envelope == event.to_json()
    assert decoded.to_event().same_as(event)
    assert decoded.producer == "w"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"type": "x", "seq": 1, "time": 1, "data": {}, "extra": 1}, "extra"),
        ({"type": "x", "seq": 1, "time": 1}, "missing 'data'"),
        ({"seq": 1, "time": 1, "data": {}}, "missing 'type'"),
        ({"type": 5, "seq": 1, "time": 1, "data": {}}, "type must be a string"),
        ({"type": "x", "seq": True, "time": 1, "data": {}}, "seq must be an integer"),
        ({"type": "x", "seq": "1", "time": 1, "data": {}}, "seq must be an integer"),
        ({"type": "x", "seq": 2**63, "time": 1, "data": {}}, "seq must be an integer"),
        ({"type": "x", "seq": 1, "time": 1.5, "data": {}}, "time must be an integer"),
        ({"type": "x", "seq": 1, "time": 1, "data": {"a": float("nan")}}, "non-finite"),
        ({"type": "x", "seq": 1, "time": 1, "data": [float("inf")]}, "non-finite"),
        ({"type": "x", "seq": 1, "time": 1, "data": {1: 2}}, "not JSON-serialisable"),
        ({"type": "x", "seq": 1, "time": 1, "data": 2**64}, "not JSON-serialisable"),
        ({"type": "x", "seq": 1, "time": 1, "data": {}, "surfaceOp": float("nan")}, "non-finite"),
        ({"type": "x", "seq": 1, "time": 1, "data": {}, "surfaceOp": {1}}, "non-JSON"),
    ],
)
def test_unrepresentable_envelopes_are_refused(env: dict[Any, Any], message: str) -> None:
    with pytest.raises(CodecError, match=message):
        encode_event("s", env)


def test_tuples_in_python_data_are_json_arrays() -> None:
    env = {"type": "x", "seq": 1, "time": 1, "data": {"a": (1, 2)}}
    assert decode_event(encode_event("s", env)).envelope["data"] == {"a": [1, 2]}


def test_decode_events_batch_reports_bad_records_in_place() -> None:
    good = [encode_event("s", typical_envelope(i)) for i in range(3)]
    values: list[bytes | None] = [good[0], b"garbage", good[1], None, good[2][:-3]]
    out = decode_events_batch(values)
    assert [type(x).__name__ for x in out] == [
        "DecodedEvent",
        "CodecError",
        "DecodedEvent",
        "CodecError",
        "CodecError",
    ]
    assert decode_events_batch(good) == [decode_event(g) for g in good]


# --------------------------------------------------------------------------
# Schema evolution
# --------------------------------------------------------------------------


def v1_record(session: str, env: dict[str, Any]) -> bytes:
    """Frame a record written with the *history* v1 schema (no producer)."""
    v1 = fastavro.parse_schema(json.loads(V1_PATH.read_text("utf-8")), {})
    current = Codec()
    datum = codec_envelope._event_datum(session, env, None, None, False)
    del datum["producer"]
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + codec.schema_fingerprint(json.loads(V1_PATH.read_text("utf-8"))))
    fastavro.schemaless_writer(buf, v1, datum)
    assert buf.getvalue()[:2] == current.header(SESSION_EVENT)[:2]
    return buf.getvalue()


def test_schema_evolution_v1_record_read_with_v2_reader() -> None:
    env = {**typical_envelope(), "sourceEventSeqs": [1, 2], "ignorable": None}
    old = v1_record("s-old", env)
    assert old[2:10] != encode_event("s", env)[2:10]
    decoded = decode_event(old)
    assert decoded.session_id == "s-old"
    assert decoded.envelope == env
    assert decoded.producer is None  # the v2 field takes its default


def test_v2_record_is_not_readable_as_v1_body() -> None:
    # Guard that the evolution test has real material: the bodies differ.
    env = typical_envelope()
    assert v1_record("s", env)[10:] != encode_event("s", env, producer="p")[10:]


# --------------------------------------------------------------------------
# Confluent framing
# --------------------------------------------------------------------------


def test_confluent_framing_round_trip() -> None:
    registry = InMemorySchemaRegistry(first_id=41)
    cf = Codec("confluent", resolver=registry)
    env = typical_envelope()
    data = cf.encode_event("s", env, producer="p")
    schema_id = data[1:5]
    assert data[0] == 0 and int.from_bytes(schema_id, "big") == 41
    assert registry.subjects == {SESSION_EVENT: [41]}
    decoded = cf.decode_event(data)
    assert decoded.envelope == env and decoded.producer == "p"
    # same body as the single-object record
    assert data[5:] == encode_event("s", env, producer="p")[10:]
    # every record type gets its own id, stable per codec and registry
    view = View.of("s", "status", 3, CORE_STATE_VERSION, {"ok": True})
    vdata = cf.encode_view(view)
    assert int.from_bytes(vdata[1:5], "big") == 42
    assert cf.decode_view(vdata) == view
    assert Codec("confluent", resolver=registry).encode_event("s", env)[1:5] == schema_id


def test_confluent_reader_accepts_single_object_and_vice_versa_errors() -> None:
    cf = Codec("confluent", resolver=InMemorySchemaRegistry())
    env = typical_envelope()
    assert cf.decode_event(encode_event("s", env)).envelope == env
    with pytest.raises(CodecError, match="no schema registry"):
        decode_event(cf.encode_event("s", env))
    with pytest.raises(CodecError, match="unknown schema id 999"):
        cf.decode_event(b"\x00" + (999).to_bytes(4, "big") + b"\x00")


def test_confluent_old_schema_id_is_resolved_against_current_reader() -> None:
    registry = InMemorySchemaRegistry()
    old_id = registry.id_for_schema(SESSION_EVENT, json.loads(V1_PATH.read_text("utf-8")))
    cf = Codec("confluent", resolver=registry)
    env = typical_envelope()
    body = v1_record("s", env)[10:]
    decoded = cf.decode_event(b"\x00" + old_id.to_bytes(4, "big") + body)
    assert decoded.envelope == env and decoded.producer is None


def test_confluent_needs_a_resolver() -> None:
    with pytest.raises(ValueError, match="SchemaIdResolver"):
        Codec("confluent")
    with pytest.raises(ValueError, match="unknown framing"):
        Codec("avro-json")  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Corruption
# --------------------------------------------------------------------------


def test_bad_marker_unknown_fingerprint_truncation_trailing_bytes() -> None:
    data = encode_event("s", typical_envelope())
    with pytest.raises(CodecError, match="not a framed Avro record"):
        decode_event(b"\xc3\x02" + data[2:])
    with pytest.raises(CodecError, match="not a framed Avro record"):
        decode_event(b"")
    with pytest.raises(CodecError, match="unknown writer schema fingerprint 0000000000000000"):
        decode_event(b"\xc3\x01" + bytes(8) + data[10:])
    with pytest.raises(CodecError, match="truncated single-object header"):
        decode_event(data[:6])
    with pytest.raises(CodecError, match="trailing byte"):
        decode_event(data + b"\x00")
    with pytest.raises(CodecError, match="null"):
        codec.default_codec().decode_record(None)
    for cut in range(len(data)):
        with pytest.raises(CodecError):
            decode_event(data[:cut])


def test_wrong_record_type_is_refused() -> None:
    data = encode_event("s", typical_envelope())
    with pytest.raises(CodecError, match="expected a processor.v1.View record"):
        decode_view(data)
    letter = encode_dead_letter(dead_letter())
    with pytest.raises(CodecError, match="expected a processor.v1.SessionEvent"):
        decode_event(letter)


@FAST
@given(st.data())
def test_random_corruption_raises_only_codec_error(draw: st.DataObject) -> None:
    data = bytearray(encode_event("s", typical_envelope()))
    for _ in range(draw.draw(st.integers(1, 4))):
        pos = draw.draw(st.integers(10, len(data) - 1))
        data[pos] = draw.draw(st.integers(0, 255))
    try:
        decoded = decode_event(bytes(data))
    except CodecError:
        return
    assert isinstance(decoded.envelope, dict)


# --------------------------------------------------------------------------
# Views and payload compression
# --------------------------------------------------------------------------


def test_view_round_trip_small_is_plain_json() -> None:
    view = View.of("s", "messages", 7, CORE_STATE_VERSION, [{"id": "m", "role": "user"}])
    assert view.encoding == "JSON" and view.value == orjson.dumps([{"id": "m", "role": "user"}])
    back = decode_view(encode_view(view))
    assert back == view and back.json_value() == [{"id": "m", "role": "user"}]
    assert back.key == b"s/messages"


def test_zstd_threshold_behaviour() -> None:
    def value_of_size(n: int) -> str:
        return "a" * (n - 2)  # JSON string: two quotes + n-2 letters

    at = encode_json_payload(value_of_size(1024))
    assert at == ("JSON", orjson.dumps(value_of_size(1024))) and len(at[1]) == 1024
    above_enc, above = encode_json_payload(value_of_size(1025))
    assert above_enc == "ZSTD_JSON" and len(above) < 100
    assert above[:4] == b"\x28\xb5\x2f\xfd"  # zstd frame magic
    assert decode_json_payload(above_enc, above) == value_of_size(1025)
    # custom thresholds, and incompressible payloads stay plain JSON
    assert encode_json_payload(value_of_size(100), threshold=50)[0] == "ZSTD_JSON"
    noise = random.Random(1).randbytes(3000).hex()[:40]
    assert encode_json_payload(noise, threshold=10)[0] == "JSON"
    # the codec's threshold is used for views and checkpoints
    low = Codec(compress_threshold=10)
    records = low.encode_view_records("s", "v", 1, 0, value_of_size(100))
    assert low.decode_view(records[0][1]).encoding == "ZSTD_JSON"


def test_zstd_frame_without_content_size_is_readable() -> None:
    raw = orjson.dumps({"k": "v" * 5000})
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=False)
    out = io.BytesIO()
    with cctx.stream_writer(out, closefd=False) as writer:
        writer.write(raw)
    assert decode_json_payload("ZSTD_JSON", out.getvalue()) == {"k": "v" * 5000}
    with pytest.raises(CodecError, match="corrupt zstd"):
        decode_json_payload("ZSTD_JSON", b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(CodecError, match="not valid JSON"):
        decode_json_payload("JSON", b"{")
    with pytest.raises(CodecError, match="unknown payload encoding"):
        decode_json_payload("BROTLI", b"{}")


def big_view_value(n: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    return [{"seq": i, "text": rng.randbytes(40).hex()} for i in range(n)]


def test_large_view_split_into_parts_and_reassembled() -> None:
    value = big_view_value(400)
    whole = View.of("sess", "transcript", 99, CORE_STATE_VERSION, value)
    assert whole.encoding == "ZSTD_JSON"
    parts = split_view(whole, max_part_bytes=4096)
    n = len(parts)
    assert n > 3 and all(p.parts == n for p in parts)
    assert [p.part for p in parts] == list(range(n))
    assert all(len(p.value) <= 4096 for p in parts)
    assert [p.key for p in parts] == [b"sess/transcript"] + [
        f"sess/transcript#{i}".encode() for i in range(1, n)
    ]
    with pytest.raises(CodecError, match="reassemble"):
        parts[0].json_value()
    decoded = [decode_view(encode_view(p)) for p in parts]
    assert decoded == parts
    joined = join_view_parts(reversed(decoded))
    assert joined == whole and joined.json_value() == value
    with pytest.raises(CodecError, match="needs parts"):
        join_view_parts(decoded[:-1])
    with pytest.raises(CodecError, match="disagree"):
        join_view_parts([decoded[0], View(**{**_fields(decoded[1]), "as_of_seq": 98})])
    assert split_view(whole, max_part_bytes=len(whole.value)) == [whole]


def _fields(view: View) -> dict[str, Any]:
    return {name: getattr(view, name) for name in View.__dataclass_fields__}


def test_view_assembler_waits_for_all_parts_of_one_version() -> None:
    old = split_view(View.of("s", "v", 5, 2, big_view_value(300)), 2048)
    new = split_view(View.of("s", "v", 6, 2, big_view_value(320)), 2048)
    assembler = ViewAssembler()
    shuffled = [*new[1:], old[0], old[1]]  # old version's parts arrive late
    random.Random(3).shuffle(shuffled)
    results = [assembler.add(p) for p in shuffled]
    assert all(r is None for r in results)
    assert assembler.pending == 1
    whole = assembler.add(new[0])
    assert whole is not None and whole.as_of_seq == 6 and whole.json_value() == big_view_value(320)
    assert assembler.pending == 0
    assert assembler.add(old[2]) is None  # stale part: ignored
    single = View.of("s", "v", 7, 2, {"small": True})
    assert assembler.add(single) == single
    assembler.forget("s", "v")
    assert assembler.add(old[0]) is None and assembler.pending == 1


def test_encode_view_records_produce_parts_first_head_last() -> None:
    c = Codec()
    records = c.encode_view_records(
        "s", "surface", 4, CORE_STATE_VERSION, big_view_value(300), max_part_bytes=1500
    )
    keys = [k for k, _ in records]
    assert keys[-1] == b"s/surface" and keys[0] == b"s/surface#1"
    views = [c.decode_view(v) for _, v in records]
    assert join_view_parts(views).json_value() == big_view_value(300)
    assert [k for k, _ in c.encode_view_records("s", "x", 1, 0, 1)] == [b"s/x"]


def test_view_keys_and_stale_part_keys() -> None:
    assert view_key("s", "v") == b"s/v" and view_key("s", "v", 3) == b"s/v#3"
    assert stale_part_keys("s", "v", 4, 2) == [b"s/v#2", b"s/v#3"]
    assert stale_part_keys("s", "v", 2, 0) == [b"s/v", b"s/v#1"]
    assert stale_part_keys("s", "v", 1, 1) == []


def test_view_record_defaults_part_fields_for_old_style_readers() -> None:
    schema = json.loads((SCHEMAS / "view.avsc").read_text("utf-8"))
    fields = {f["name"]: f for f in schema["fields"]}
    assert fields["part"]["default"] == 0 and fields["parts"]["default"] == 1
    assert fields["encoding"]["type"]["symbols"] == ["JSON", "ZSTD_JSON"]


# --------------------------------------------------------------------------
# Checkpoints and dead letters
# --------------------------------------------------------------------------


def checkpoint(rows: dict[str, Any], surface: Any) -> Checkpoint:
    return Checkpoint(
        session_id="sess",
        last_seq=41,
        anchor=Anchor(partition=3, offset=10_000_000_000, seq=41, digest=bytes(range(32))),
        rows=rows,
        surface=surface,
        core_version=2,
    )


def test_checkpoint_round_trip_small_and_large() -> None:
    small = checkpoint(
        {"todo": {"ver": 1, "seq": 40, "val": {"items": []}}},
        {"nodes": [0, 2], "replaceGeneration": 0},
    )
    data = encode_checkpoint(small)
    assert decode_checkpoint(data) == small
    rec = codec.default_codec().decode_record(data, CHECKPOINT)[1]
    assert rec["encoding"] == "JSON"
    large = checkpoint(
        {f"k{i}": {"ver": 1, "seq": i, "val": "x" * 50} for i in range(100)},
        {"nodes": list(range(500))},
    )
    data = encode_checkpoint(large)
    rec = codec.default_codec().decode_record(data, CHECKPOINT)[1]
    assert rec["encoding"] == "ZSTD_JSON"
    assert decode_checkpoint(data) == large
    assert len(data) < len(orjson.dumps(large.rows))


def dead_letter(**over: Any) -> DeadLetter:
    base: dict[str, Any] = dict(
        session_id="sess",
        topic="agent.events",
        partition=2,
        offset=1234,
        seq=7,
        rule="S-2",
        reason="surfaceOp must be append or replace",
        key=b"sess",
        value=b"\xc3\x01raw\x00",
        timestamp=1733140000000,
        processor="proc-1",
    )
    base.update(over)
    return DeadLetter(**base)


def test_dead_letter_round_trip() -> None:
    for letter in (
        dead_letter(),
        dead_letter(session_id=None, seq=None, key=None, value=None, rule="codec"),
        dead_letter(value=b""),
    ):
        assert decode_dead_letter(encode_dead_letter(letter)) == letter


def test_encode_errors_on_out_of_range_fields_are_codec_errors() -> None:
    with pytest.raises(CodecError, match="cannot encode processor.v1.View: stateVersion"):
        encode_view(View("s", "v", 1, 2**40, "JSON", b"{}"))
    with pytest.raises(CodecError, match="unknown view encoding"):
        encode_view(View("s", "v", 1, 0, "XML", b"{}"))  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="part 2 of 2"):
        encode_view(View("s", "v", 1, 0, "JSON", b"{}", part=2, parts=2))
    with pytest.raises(CodecError, match="cannot encode processor.v1.View"):
        encode_view(View("s", "v", 2**63, 0, "JSON", b"{}"))
    with pytest.raises(CodecError, match="partition must be a 32-bit int"):
        encode_dead_letter(dead_letter(partition=2**31))
    with pytest.raises(CodecError, match="coreVersion must be a 32-bit int"):
        encode_checkpoint(Checkpoint("s", 1, Anchor(0, 0, 1, b""), {}, {}, -(2**31) - 1))
    with pytest.raises(CodecError, match="not JSON-serialisable"):
        encode_checkpoint(checkpoint({"k": object()}, {}))


def test_decoded_events_share_known_strings_and_intern_nothing_else() -> None:
    """Held events share one copy of a known type and of "append" (memory per
    held session); a type or surfaceOp the input made up is not interned (on
    Python 3.12 an interned string is never freed: a stream of made-up types
    would grow the process without bound)."""
    one = decode_event(encode_event("s", {**typical_envelope(), "surfaceOp": "append"}))
    two = decode_event(encode_event("s", {**typical_envelope(), "surfaceOp": "append"}))
    assert one.envelope["type"] is two.envelope["type"]
    assert one.envelope["surfaceOp"] is two.envelope["surfaceOp"]
    made_up = "".join(["vendor/", "made-up-", str(random.random())])
    env = {**typical_envelope(), "type": made_up, "ignorable": True, "surfaceOp": made_up}
    decoded = decode_event(encode_event("s", env)).envelope
    assert decoded["type"] == made_up and decoded["surfaceOp"] == made_up
    probe = "".join(["vendor/", made_up.removeprefix("vendor/")])  # an equal, new string
    assert sys.intern(probe) is probe  # so nobody interned one before
    assert decoded["type"] is not probe and decoded["surfaceOp"] is not probe


def test_a_decoded_event_compares_and_prints_as_the_frozen_dataclass_did() -> None:
    """``DecodedEvent`` is a plain (compiled) class: equal by its fields, the
    dataclass's repr, unhashable (a dict field), read-only; the codec's decoded
    events are exactly those."""
    from processor.codec.decoded import DecodedEvent

    args: tuple[str, dict[str, Any], str, str | None] = ("s1", {"seq": 3}, "{}", None)
    made = DecodedEvent(*args)
    assert made == DecodedEvent(*args) and made != DecodedEvent("s2", {"seq": 3}, "{}")
    assert made != args and made.seq == 3
    assert repr(made) == (
        "DecodedEvent(session_id='s1', envelope={'seq': 3}, data_text='{}', producer=None)"
    )
    with pytest.raises(TypeError):
        hash(made)
    with pytest.raises(AttributeError):
        made.data_text = "x"  # type: ignore[misc]
    from processor.workload import generate_session

    ev = generate_session(random.Random(3), 5)[2]
    c = codec.default_codec()
    decoded = c.decode_event(c.encode_parsed_event("s1", ev))
    assert type(decoded) is DecodedEvent
    assert decoded == DecodedEvent(
        decoded.session_id, decoded.envelope, decoded.data_text, decoded.producer
    )
    assert decoded.to_event().digest_bytes() == ev.digest_bytes()


@pytest.mark.parametrize(
    ("state_version", "encoding", "value"),
    [
        (0, "JSON", b'{"a":1}'),
        (7, "ZSTD_JSON", zstandard.ZstdCompressor().compress(b"[1,2,3]")),
        (2**31 - 1, "JSON", b""),
        (2**31, "JSON", b"1"),  # not an Avro int: refused with encode_view's text
        (-(2**31) - 1, "JSON", b"1"),
        (1, "BROTLI", b"1"),  # unknown encoding: refused with encode_view's text
    ],
)
def test_encode_whole_view_is_encode_view_of_the_one_part_view(
    state_version: int, encoding: Any, value: bytes
) -> None:
    """The engine's per-view shortcut writes the bytes ``encode_view`` writes for
    ``View(...)`` (part 0 of 1), and refuses what it refuses, with its text."""
    c = codec.default_codec()
    fields = ("s1", "unit", 12, state_version, encoding, value)
    try:
        want: bytes | str = c.encode_view(View(*fields))
    except CodecError as exc:
        want = str(exc)
    try:
        got: bytes | str = c.encode_whole_view(*fields)
    except CodecError as exc:
        got = str(exc)
    assert got == want
