"""Frozen values out of the cyclic collector (processor/core/leaf.py, _leaf.c).

The compiled build untracks the events ``parse_event`` builds and every
container ``freeze`` builds whose parts cannot lead back to it; anything
holding a mutable or tracked part stays tracked, and cycles made of ordinary
objects around frozen values are still collected.  The pure build has no C
module and changes nothing (these tests then check only that).
"""

from __future__ import annotations

import copy
import gc
import pickle
from typing import Any

import orjson
import pytest

import processor.core.session
from processor.core.events import Event, make_event, parse_event_bytes
from processor.core.frozen import FrozenDict, FrozenList, freeze, thaw
from processor.core.leaf import SETTLE

COMPILED = not str(processor.core.session.__file__).endswith(".py")
settles = pytest.mark.skipif(SETTLE is None, reason="the pure build has no processor.core._leaf")

LINE = (
    b'{"type":"assistant/message","seq":3,"time":5,"data":{"message":{"role":"assistant",'
    b'"content":[{"type":"text","text":"hi"}],"source":{"kind":"model"}},"stream":[]},'
    b'"surfaceOp":"append","sourceEventSeqs":[1,2]}'
)


def _parts(value: Any) -> list[Any]:
    """``value`` and every dict and list inside it."""
    if not isinstance(value, dict | list):
        return []
    inner = value.values() if isinstance(value, dict) else value
    return [value, *(p for v in inner for p in _parts(v))]


def test_the_compiled_build_ships_the_c_module() -> None:
    # without it the compiled build would silently keep ~5 tracked containers per event
    assert (SETTLE is not None) == COMPILED


@settles
def test_parsed_events_and_their_frozen_parts_are_untracked() -> None:
    event = parse_event_bytes(LINE)
    parts = [*_parts(event.data), *_parts(event.source_event_seqs)]
    assert len(parts) == 7
    assert not gc.is_tracked(event)
    assert not any(gc.is_tracked(p) for p in parts)
    # still the frozen values they were
    with pytest.raises(TypeError):
        event.data["message"]["content"].append(1)
    with pytest.raises(AttributeError):
        event.seq = 4  # type: ignore[misc]
    assert event.data == orjson.loads(LINE)["data"]
    assert orjson.loads(event.to_bytes()) == orjson.loads(LINE)
    assert thaw(event.data) == event.data and copy.deepcopy(event.data) == event.data
    again = pickle.loads(pickle.dumps(event.data))
    assert type(again) is FrozenDict and again == event.data


@settles
def test_a_frozen_value_holding_a_mutable_part_stays_tracked() -> None:
    hand_built = FrozenDict({"a": [1]})  # not through freeze: holds a plain list
    assert gc.is_tracked(hand_built)
    assert gc.is_tracked(freeze({"x": hand_built}))
    assert gc.is_tracked(FrozenList([{"b": 1}]))
    assert not gc.is_tracked(freeze({"x": [{"b": 1}]}))
    # an Event built by hand may hold anything: only parse_event settles one
    assert gc.is_tracked(Event("t", 1, 2, [3]))
    assert not gc.is_tracked(make_event("user/message", 1, {"role": "user", "content": "x"}))


@settles
def test_writing_through_the_base_class_tracks_the_dict_again() -> None:
    value = freeze({"a": 1})
    assert not gc.is_tracked(value)
    dict.__setitem__(value, "self", [value])
    assert gc.is_tracked(value)


def test_cycles_around_frozen_values_are_still_collected() -> None:
    class Node:
        def __init__(self, payload: Any) -> None:
            self.payload = payload
            self.other: Node | None = None

    event = parse_event_bytes(LINE)
    a, b = Node(event), Node(event.data["message"])
    a.other, b.other = b, a
    del a, b
    gc.collect()
    a, b = Node(event), Node(event.data)
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
