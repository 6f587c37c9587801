"""The output's per-record shortcuts (engine/output.py): the frame heads looked
up once per changed session, the bodies written by avro_fast.py — the bytes and
the refusals of the codec's per-record calls they replace; unit view changes
built without a dataclass ``__init__``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import zstandard

from processor.codec import CodecError, ViewEncoding, default_codec, encode_part
from processor.engine.output import _whole_view
from processor.engine.runtime import ViewChange


def _result(call: Callable[[], bytes]) -> bytes | str:
    try:
        return call()
    except CodecError as exc:
        return str(exc)


@pytest.mark.parametrize(
    ("as_of", "state_version", "encoding", "value"),
    [
        (12, 0, "JSON", b'{"a":1}'),
        (0, 7, "ZSTD_JSON", zstandard.ZstdCompressor().compress(b"[1,2,3]")),
        (-1, 2**31 - 1, "JSON", b""),
        (5, 2**31, "JSON", b"1"),  # not an Avro int: refused with the codec's text
        (5, -(2**31) - 1, "JSON", b"1"),
        # (a bool: the compiled engine's int parameters take True as 1, as its
        # ViewChange.state_version did before; test_codec.py covers the codec's refusal)
    ],
)
def test_a_whole_view_is_framed_as_the_codec_frames_it(
    as_of: int, state_version: int, encoding: ViewEncoding, value: bytes
) -> None:
    c = default_codec()
    view_frame, _ = c.fast_heads()
    assert view_frame is not None  # the current View schema is avro_fast.py's layout
    fields = ("s1", "unit", as_of, state_version, encoding, value)
    want = _result(lambda: c.encode_whole_view(*fields))
    assert _result(lambda: _whole_view(c, view_frame, *fields)) == want
    assert _result(lambda: _whole_view(c, None, *fields)) == want  # the codec's path


@pytest.mark.parametrize(
    ("name", "version", "value"),
    [
        ("e.3", 0, {"type": "user/message", "seq": 3}),
        ("u.stats", 41, {"ver": 1, "val": list(range(2_000))}),  # above the threshold: zstd
        ("h", 2**40, None),
        ("x", -(2**63) - 1, [1]),  # not an Avro long: refused with the codec's text
    ],
)
def test_a_checkpoint_part_is_framed_as_the_codec_frames_it(
    name: str, version: int, value: Any
) -> None:
    c = default_codec()
    _, part_frame = c.fast_heads()
    assert part_frame is not None
    want = _result(lambda: encode_part(c, name, version, value))
    assert _result(lambda: encode_part(c, name, version, value, part_frame)) == want
    assert _result(lambda: encode_part(c, name, version, value, None)) == want


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
