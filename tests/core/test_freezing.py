"""``freeze`` copies into plain containers only where a container holds
containers, then freezes the copy: the result must still be the input's
value, key order and all, frozen at every level, with the input untouched
and already-frozen parts reused."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.errors import SessionError
from processor.core.events import parse_event, parse_event_owned
from processor.core.freezing import freeze_item, walk
from processor.core.frozen import MAX_DEPTH, FrozenDict, FrozenList, JsonDepthError, freeze

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=25,
)


def _container_types(value: Any) -> Iterator[type]:
    """The type of every dict and list in ``value``, at every level."""
    if isinstance(value, dict | list):
        yield type(value)
        for v in value.values() if isinstance(value, dict) else value:
            yield from _container_types(v)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_freeze_keeps_the_value_and_its_order_and_leaves_the_input(value: Any) -> None:
    before = copy.deepcopy(value)
    frozen = freeze(value)
    assert orjson.dumps(frozen) == orjson.dumps(before)  # key order too
    assert orjson.dumps(value) == orjson.dumps(before)  # the input is not written:
    assert set(_container_types(value)) <= {dict, list}  # not even with equal frozen copies
    assert set(_container_types(frozen)) <= {FrozenDict, FrozenList}


def test_freeze_reuses_frozen_parts_beside_plain_ones() -> None:
    inner = freeze({"a": [1, {"b": 2}]})
    value = {"x": inner, "y": [inner, {"z": [3]}], "w": "s"}
    frozen = freeze(value)
    assert frozen["x"] is inner and frozen["y"][0] is inner
    assert list(frozen) == ["x", "y", "w"]
    assert type(frozen["y"][1]["z"]) is FrozenList
    assert value["y"][1] == {"z": [3]} and type(value["y"][1]["z"]) is list


def test_freeze_of_a_tuple_is_a_frozen_list() -> None:
    frozen = freeze(({"a": 1}, 2))
    assert type(frozen) is FrozenList and type(frozen[0]) is FrozenDict
    assert frozen == [{"a": 1}, 2]


# The compiled build freezes in C (_leaf.freeze); the pure build's walk is the
# reference it must agree with, value, types and refusals alike.
try:
    from processor.core import _leaf
except ImportError:  # the pure build
    _leaf = None  # type: ignore[assignment]
c_walk = pytest.mark.skipif(_leaf is None, reason="the pure build has no processor.core._leaf")


class _Sub(dict[str, Any]):
    pass


class _SubList(list[Any]):
    pass


def test_the_compiled_build_freezes_in_c() -> None:
    assert (freeze is getattr(_leaf, "freeze", None)) == (_leaf is not None)
    assert (freeze is walk) == (_leaf is None)


def _shape(value: Any) -> Any:
    """``value`` with each container's type beside it (tuples and subclasses kept)."""
    if isinstance(value, dict):
        return (type(value).__name__, [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_shape(v) for v in value])
    return (type(value).__name__, value)


MIXED = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.lists(inner, max_size=3).map(_SubList)
        | st.dictionaries(st.text(max_size=3), inner, max_size=4)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(_Sub)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(walk)
    ),
    max_leaves=30,
)


@c_walk
@settings(max_examples=400, deadline=None)
@given(MIXED)
def test_c_freeze_agrees_with_the_python_walk(value: Any) -> None:
    before = _shape(value)
    assert _shape(freeze(value)) == _shape(walk(value))
    assert _shape(value) == before  # the input is not written


@c_walk
def test_c_freeze_refuses_depth_as_the_walk_does() -> None:
    outcomes = set()
    bases: tuple[Any, ...] = ([], {}, _Sub(), ())
    for base in bases:
        for levels in (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1):
            value: Any = base
            for i in range(levels):
                value = [value] if i % 2 else {"k": value}
            results = []
            for fn in (freeze, walk):
                try:
                    results.append(_shape(fn(value)))
                except JsonDepthError:
                    results.append("refused")
            assert results[0] == results[1]
            outcomes.add(results[0] == "refused")
    assert outcomes == {True, False}


@c_walk
def test_c_freeze_reuses_frozen_parts_and_other_objects() -> None:
    inner = freeze({"a": [1]})
    other = object()
    frozen = freeze([inner, {"o": other}, (inner,)])
    assert frozen[0] is inner and frozen[1]["o"] is other and frozen[2][0] is inner


def _outcome(parse: Any, raw: Any) -> Any:
    try:
        event = parse(raw)
    except SessionError as exc:
        return ("refused", exc.rule, str(exc))
    return ("event", event.digest_bytes(), _shape(event.data))


ENVELOPE_DATA = MIXED | st.recursive(st.just([]), lambda inner: st.lists(inner, max_size=1))


@settings(max_examples=300, deadline=None)
@given(ENVELOPE_DATA, st.sampled_from([0, 5, -1]))
def test_parse_event_owned_is_parse_event(data: Any, seq: int) -> None:
    # the owned parse may freeze raw's data in place: each parse gets its own copy
    def raw() -> dict[str, Any]:
        return {"type": "custom/x", "seq": seq, "time": 1, "data": copy.deepcopy(data)}

    assert _outcome(parse_event_owned, raw()) == _outcome(
        lambda r: parse_event(r, trusted_json=True), raw()
    )


def test_parse_event_owned_refuses_depth_as_parse_event() -> None:
    deep: Any = 0
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    for seq in (3, -1):  # -1: the seq's refusal (E-2) comes first, as in parse_event
        a = _outcome(parse_event_owned, {"type": "t", "seq": seq, "time": 1, "data": deep})
        b = _outcome(
            lambda r: parse_event(r, trusted_json=True),
            {"type": "t", "seq": seq, "time": 1, "data": copy.deepcopy(deep)},
        )
        assert a == b and a[0] == "refused"


@pytest.mark.skipif(freeze_item is None, reason="types change in place only compiled on 3.11")
def test_parse_event_owned_freezes_in_place_only_what_no_one_else_holds() -> None:
    shared = {"kept": [1]}
    data = {"mine": {"a": [1, {"b": 2}]}, "shared": shared}
    raw = {"type": "custom/x", "seq": 0, "time": 1, "data": data}
    ids = (id(data), id(data["mine"]))  # no reference kept: it would make them shared
    del data  # raw is now the only holder of its data (the caller's contract)
    event = parse_event_owned(raw)
    assert event.data is raw["data"] and type(event.data) is FrozenDict
    assert (id(event.data), id(event.data["mine"])) == ids  # frozen in place, not copied
    assert type(event.data["mine"]["a"][1]) is FrozenDict
    assert type(shared) is dict and type(shared["kept"]) is list  # held here too: copied
    assert event.data["shared"] == shared and type(event.data["shared"]) is FrozenDict
