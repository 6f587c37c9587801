"""``freeze`` copies into plain containers only where a container holds
containers, then freezes the copy: the result must still be the input's
value, key order and all, frozen at every level, with the input untouched
and already-frozen parts reused."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.frozen import FrozenDict, FrozenList, freeze

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
