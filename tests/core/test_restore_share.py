"""SharedValues: a restored row reuses the surface's equal frozen blocks, and only equal ones."""

from __future__ import annotations

from typing import Any

from processor.core.events import Event
from processor.core.frozen import FrozenDict, freeze
from processor.core.restore_share import SharedValues


def _event(data: object) -> Event:
    return Event(type="message", seq=0, time=0, data=freeze(data))


def test_an_equal_block_is_the_surface_s_own_object() -> None:
    block = {"type": "text", "text": "hello", "n": 1}
    event = _event({"message": {"content": [block]}})
    shared = SharedValues([event])
    row = shared.freeze({"messages": [{"content": [dict(block)]}], "count": 1})
    assert row == {"messages": [{"content": [block]}], "count": 1}
    assert row["messages"][0]["content"] is event.data["message"]["content"]
    assert type(row) is FrozenDict


def test_only_values_with_the_same_json_text_are_shared() -> None:
    event = _event({"a": {"x": 1, "y": 2}, "b": {"v": 1}})
    shared = SharedValues([event])
    reordered = shared.freeze({"k": {"y": 2, "x": 1}})["k"]
    assert list(reordered) == ["y", "x"]  # key order kept: the next checkpoint's bytes
    floats = shared.freeze({"k": {"v": 1.0}})["k"]
    assert floats is not event.data["b"] and type(floats["v"]) is float


def test_a_value_that_is_not_plain_json_is_frozen_unshared() -> None:
    shared = SharedValues([_event({"a": [1]})])
    assert shared.freeze({"big": [2**70]}) == {"big": [2**70]}


def test_a_deep_or_huge_value_costs_a_bounded_index() -> None:
    """Each indexed level holds its subtree's JSON: without the depth cap a
    128-deep value with a 1 MB leaf held 128 MB of keys during one restore."""
    from processor.core import restore_share

    deep: object = "x" * 1_000_000
    for _ in range(100):
        deep = [deep]
    shared = SharedValues([_event({"d": deep})])
    assert shared._indexed <= restore_share.SHARE_DEPTH * 1_001_000
    assert shared._indexed <= restore_share.INDEX_BUDGET
    row = shared.freeze({"d": deep})
    assert row == {"d": deep}


def test_a_restore_past_its_budget_is_counted_with_the_sharing_tables(monkeypatch: Any) -> None:
    """Past the budget values are frozen unshared (memory, not correctness); the
    service exports the count like any sharing table's, so an operator sees it."""
    from processor.core import restore_share
    from processor.core.sharing import tables

    assert restore_share.RESTORE_BLOCKS in tables()
    monkeypatch.setattr(restore_share, "INDEX_BUDGET", 40)
    full = restore_share.RESTORE_BLOCKS.full
    shared = SharedValues([_event({"a": {"x": "y" * 30}, "b": {"z": "w" * 30}})])
    assert restore_share.RESTORE_BLOCKS.full == full + 1  # once per restore
    assert shared._indexed <= 40
