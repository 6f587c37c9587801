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
import sys
from typing import Any

import orjson
import pytest

import processor.core.session
from processor.core.events import ABSENT, Event, make_event, parse_event_bytes
from processor.core.frozen import FrozenDict, FrozenList, freeze, frozen_dict_of, thaw
from processor.core.leaf import SETTLE
from processor.core.session import Session

COMPILED = not str(processor.core.session.__file__).endswith(".py")
settles = pytest.mark.skipif(SETTLE is None, reason="the pure build has no processor.core._leaf")
try:
    from processor.core import _leaf

    IN_PLACE = bool(_leaf.ADOPT_IN_PLACE)
except ImportError:  # the pure build
    IN_PLACE = False
adopts_in_place = pytest.mark.skipif(
    not IN_PLACE, reason="adopt() changes types in place only on CPython 3.11 with the GIL"
)

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


def test_the_compiled_build_writes_event_slots_natively() -> None:
    # compiled: mypyc's own attribute stores; pure: the frozen dataclass refuses them
    import processor.core.events as events

    assert (events._new_event is events._native_event) == COMPILED
    built = events._new_event("t", 1, 2, {"a": 1}, ABSENT, [0], None)
    assert repr(built) == repr(Event("t", 1, 2, {"a": 1}, ABSENT, [0], None))
    with pytest.raises(AttributeError):  # still frozen to everyone else
        built.seq = 5  # type: ignore[misc]


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


def _built_here(ids: list[int]) -> dict[str, Any]:
    """A fresh dict whose only reference is the return value (its id noted)."""
    d: dict[str, Any] = {"seq": 7, "message": freeze({"role": "user", "content": []})}
    ids.append(id(d))
    return d


def test_frozen_dict_of_is_a_frozen_copy_of_a_dict_someone_holds() -> None:
    held: dict[str, Any] = {"a": 1, "b": freeze([1])}
    out = frozen_dict_of(held)
    assert type(out) is FrozenDict and out == held and out is not held
    held["c"] = 2  # the caller's dict is still its own, mutable
    assert "c" not in out and type(held) is dict


@settles
def test_adopt_in_place_only_on_the_interpreter_ci_vets() -> None:
    """A refcount of 1 means "nobody else holds it" only where CI has checked it."""
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    vetted = sys.version_info[:2] == (3, 11) and gil
    assert vetted == IN_PLACE
    held: dict[str, Any] = {"a": 1}
    assert frozen_dict_of(held) is not held  # someone else holds it: always a copy


@adopts_in_place
def test_frozen_dict_of_freezes_a_just_built_dict_in_place() -> None:
    ids: list[int] = []
    out = frozen_dict_of(_built_here(ids))
    # no copy: the dict built for it is the frozen dict (without the C module's
    # adopt, FrozenDict(d) allocated a second dict and freed the first)
    assert id(out) == ids[0]
    assert type(out) is FrozenDict and not gc.is_tracked(out)
    assert out == {"seq": 7, "message": {"role": "user", "content": []}}
    with pytest.raises(TypeError):
        out["x"] = 1
    assert orjson.dumps(out) == b'{"seq":7,"message":{"role":"user","content":[]}}'
    again = pickle.loads(pickle.dumps(out))
    assert type(again) is FrozenDict and again == out
    assert thaw(out) == out and type(thaw(out)) is dict
    # a frozen dict made this way is freed as any other (no crash, no leak of its
    # type: each instance holds a reference to it).  Collected first, and compared
    # within a slack far below the 1,000 a leak adds: frozen dicts of earlier tests
    # in this worker (and their threads) come and go (under xdist the count fell
    # from 7,568 to 1,212 when a collection freed them during this loop)
    gc.collect()
    before = sys.getrefcount(FrozenDict)
    for _ in range(1000):
        frozen_dict_of({"k": 1})
    gc.collect()
    assert sys.getrefcount(FrozenDict) - before < 100


@settles
def test_transcript_entries_are_settled_frozen_dicts() -> None:
    session = Session()
    message: dict[str, Any] = {"id": "u-0", "role": "user", "source": {"kind": "user"}}
    message["content"] = [{"type": "text", "text": "hi"}]
    session.append(make_event("user/message", 0, message, surface_op="append"))
    (entry,) = session.transcript()
    assert type(entry) is FrozenDict and entry["seq"] == 0
    # built in place and settled (FrozenDict(literal) copied a tracked dict and stayed tracked)
    assert not gc.is_tracked(entry)
