"""The output's records (engine/output.py) go through the codec's one fast path
per record type (``Codec.encode_whole_view``, ``parted.encode_part``): the bytes
of the codec's general encoder; the frame-head lookups those calls make are
cached per codec and cannot go stale; unit view changes are built without a
dataclass ``__init__``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from processor.codec import (
    Codec,
    CodecError,
    InMemorySchemaRegistry,
    SchemaStore,
    default_codec,
    encode_part,
)
from processor.codec.names import CHECKPOINT_PART, VIEW
from processor.config import ServiceConfig
from processor.core.defaults import default_message_projections
from processor.core.session import Session, synthetic_header
from processor.engine.output import session_output
from processor.engine.records import Tally
from processor.engine.runtime import SessionRuntime, ViewChange
from tests.engine.kit import session_log

SCHEMAS = Path(__file__).parents[2] / "schemas"


def _result(call: Callable[[], bytes]) -> bytes | str:
    try:
        return call()
    except CodecError as exc:
        return str(exc)


@pytest.mark.parametrize(
    ("name", "version", "value"),
    [
        ("e.3", 0, {"type": "user/message", "seq": 3}),
        ("u.stats", 41, {"ver": 1, "val": list(range(2_000))}),  # above the threshold: zstd
        ("h", 2**40, None),
        ("x", -(2**63) - 1, [1]),  # not an Avro long: refused
    ],
)
def test_a_checkpoint_part_is_the_general_encoders_record(
    name: str, version: int, value: Any
) -> None:
    c = default_codec()
    got = _result(lambda: encode_part(c, name, version, value))
    if isinstance(got, str):
        assert "version must be a long" in got
        return
    datum = c.decode_record(got, CHECKPOINT_PART)[1]
    assert c.encode_record(CHECKPOINT_PART, datum) == got  # fastavro's bytes


def test_every_output_record_is_the_general_encoders_record() -> None:
    """A session's views and checkpoint parts, as session_output frames them,
    re-encode to the same bytes through the codec's general path."""
    c, cfg = default_codec(), ServiceConfig()
    session = Session(synthetic_header("s1"), message_projections=default_message_projections())
    rt = SessionRuntime("s1", 3, session)
    for offset, event in enumerate(session_log(40)):
        rt.session.append(event)
        rt.record_applied(event, offset)
    kinds: dict[str, int] = {}
    for out in session_output(rt, rt.view_changes(), {}, config=cfg, codec=c, tally=Tally()):
        if out.value is None:
            continue
        name, datum = c.decode_record(out.value)
        kinds[name] = kinds.get(name, 0) + 1
        if name == VIEW:
            assert c.encode_view(c.decode_view(out.value)) == out.value
        else:
            assert c.encode_record(name, datum) == out.value
    assert kinds[VIEW] >= 3 and kinds[CHECKPOINT_PART] >= 3


def test_frame_heads_follow_the_codecs_schema_set_and_registry(tmp_path: Path) -> None:
    """The heads are cached per codec by record name: what they derive from (the
    current schema, the registry) cannot change under them, and a refusal is not
    cached."""
    store = SchemaStore.from_directory(SCHEMAS)
    c = Codec(store=store)
    head = c.header(VIEW)
    assert head == b"\xc3\x01" + store.current(VIEW).fingerprint
    changed = json.loads((SCHEMAS / "view.avsc").read_text("utf-8"))
    changed["fields"].append({"name": "extra", "type": ["null", "string"], "default": None})
    with pytest.raises(CodecError, match="two current schemas"):
        store.add(changed, current=True)  # the store never swaps a current schema
    store.add(changed, current=False)  # an old writer: readable, not what is written
    assert c.header(VIEW) == head
    assert c.encode_whole_view("s", "v", 1, 0, "JSON", b"1")[: len(head)] == head

    class Flaky(InMemorySchemaRegistry):
        down = True

        def id_for_schema(self, subject: str, schema: Any) -> int:
            if self.down:
                raise ConnectionError("registry down")
            return super().id_for_schema(subject, schema)

    first, second = Flaky(first_id=7), InMemorySchemaRegistry(first_id=40)
    one = Codec("confluent", store=store, resolver=first)
    with pytest.raises(CodecError, match="registry refused"):
        one.header(VIEW)
    first.down = False
    assert one.header(VIEW) == b"\x00" + (7).to_bytes(4, "big")  # asked again
    other = Codec("confluent", store=store, resolver=second)  # no head shared across codecs
    assert other.header(VIEW) == b"\x00" + (40).to_bytes(4, "big")
    assert one.header(VIEW) == b"\x00" + (7).to_bytes(4, "big")


def test_a_view_change_is_built_by_its_own_init() -> None:
    """Not a dataclass's generated ``__init__``: the compiled build runs that one
    interpreted (one per changed unit view and batch); the repr stays the same."""
    code = getattr(ViewChange.__init__, "__code__", None)  # None: compiled
    assert code is None or "__create_fn__" not in code.co_qualname
    change = ViewChange("stats", 2, {"n": 1})
    assert (change.name, change.state_version, change.value, change.removed) == (
        "stats",
        2,
        {"n": 1},
        False,
    )
    assert repr(ViewChange("u", 0, None, removed=True)) == (
        "ViewChange(name='u', state_version=0, value=None, removed=True)"
    )
