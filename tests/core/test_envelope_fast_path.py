"""``parse_event``'s fast path for well-formed envelopes (issue 15) must be
the checked path: the same Event for every envelope it accepts, and every
envelope it does not accept decided (and refused) by the checked path."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from processor.core.errors import SessionError
from processor.core.events import ABSENT, _parse_event_checked, parse_event

BASE: dict[str, Any] = {"type": "user/message", "seq": 3, "time": 5, "data": {"id": "m"}}
VARIANTS: list[tuple[str, Any]] = [
    ("type", "note/custom"),
    ("type", "turn/end"),
    ("type", 7),
    ("seq", 3.0),
    ("seq", -1),
    ("seq", True),
    ("seq", 2**53),
    ("time", -(2**53)),
    ("time", 2.5),
    ("time", None),
    ("ignorable", True),
    ("ignorable", False),
    ("surfaceOp", "append"),
    ("sourceEventSeqs", [1, 2]),
    ("ignorable", None),
    ("extra", 1),
    ("data", ABSENT),
    ("time", ABSENT),
    ("seq", ABSENT),
    ("type", ABSENT),
]


def _outcome(fn: Any, raw: Any) -> Any:
    try:
        return ("ok", repr(fn(raw, trusted_json=True) if fn is parse_event else fn(raw, True)))
    except SessionError as exc:
        return ("error", exc.seq, exc.rule, exc.reason)


@pytest.mark.parametrize("size", [0, 1, 2, 3])
def test_E_1_E_2_E_5_fast_path_same_as_checked_path(size: int) -> None:
    for combo in itertools.combinations(VARIANTS, size):
        raw = dict(BASE)
        for key, value in combo:
            if value is ABSENT:
                raw.pop(key, None)
            else:
                raw[key] = value
        assert _outcome(parse_event, raw) == _outcome(_parse_event_checked, raw), raw


def test_E_5_log_only_type_with_surface_op_refused_on_fast_path() -> None:
    raw = {"type": "turn/end", "seq": 1, "time": 0, "data": {}, "surfaceOp": "append"}
    with pytest.raises(SessionError) as info:
        parse_event(raw, trusted_json=True)
    assert info.value.rule == "E-5"


def test_E_1_key_count_alone_does_not_pass_the_fast_path() -> None:
    # as many keys as a valid envelope, one of them unknown in place of a known one
    for missing in ("data", "time", "ignorable"):
        raw: dict[str, Any] = {**BASE, "ignorable": True, "surfacop": "append"}
        raw.pop(missing)
        assert _outcome(parse_event, raw)[0] == "error", raw
        assert _outcome(parse_event, raw) == _outcome(_parse_event_checked, raw), raw


def test_E_1_unknown_key_refused_on_fast_path() -> None:
    raw = {"type": "turn/end", "seq": 1, "time": 0, "data": {}, "surfacop": "append"}
    with pytest.raises(SessionError) as info:
        parse_event(raw, trusted_json=True)
    assert info.value.rule == "E-1"


def test_known_types_shared_unknown_kept_as_decoded() -> None:
    """A kept event holds the one shared str of its known type (a decoder makes
    a fresh one per line); an unknown type is the decoded value itself."""
    lines = [b'{"type":"turn/start","seq":%d,"time":1,"data":{}}' % i for i in range(2)]
    lines += [b'{"type":"turn/start","seq":2,"time":1,"data":{},"ignorable":true}']
    raws = [orjson.loads(line) for line in lines]
    assert raws[0]["type"] is not raws[1]["type"]  # the decoder's own strs
    events = [parse_event(raw, trusted_json=True) for raw in raws]
    assert events[0].type is events[1].type is events[2].type == "turn/start"
    checked = _parse_event_checked(orjson.loads(lines[0]), False)
    assert checked.type is events[0].type
    raw = orjson.loads(b'{"type":"note/custom","seq":0,"time":1,"data":{}}')
    decoded = raw["type"]
    assert parse_event(raw, trusted_json=True).type is decoded
