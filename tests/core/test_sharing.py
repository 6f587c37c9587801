"""The sharing tables: one object per equal value, within a bound that is counted.

Held sessions share their event types, part names, unit keys and dispatch
tables; the values come from the input, so each table stops at a bound, and
an operator must see when one did (``processor_shared_table_full_total``).
"""

from __future__ import annotations

from processor.codec import envelope
from processor.core import projections
from processor.core.sharing import BoundedTable, FrozenTable, NewestTable, tables
from processor.engine import checkpoint_parts, runtime


def _copy(text: str) -> str:
    return (text + "!")[:-1]  # an equal string that is another object (not 1 char)


def test_a_bounded_table_shares_until_its_bound_then_counts_what_it_turns_away() -> None:
    t: BoundedTable[str] = BoundedTable("test_bounded", 2)
    a, b = t.share(_copy("a1")), t.share(_copy("b1"))
    assert t.share(_copy("a1")) is a and t.share(_copy("b1")) is b
    assert (t.hits, t.size(), t.full) == (2, 2, 0)
    c = _copy("c1")
    assert t.share(c) is c and t.share(_copy("c1")) is not c  # turned away: not kept
    assert (t.size(), t.full) == (2, 2)


def test_a_newest_table_keeps_the_newest_keys_and_counts_the_dropped() -> None:
    t: NewestTable[list[str], list[str]] = NewestTable("test_newest", 2)
    first, second, third = ["a"], ["b"], ["c"]
    assert t.get(first, first) is first and t.get(second, second) is second
    assert t.get(["a"], ["a"]) is first and t.hits == 1  # by equality: lists too
    assert t.get(third, third) is third  # the oldest (first) makes room
    assert (t.size(), t.full) == (2, 1)
    again = ["a"]
    assert t.get(again, again) is again and t.full == 2
    assert t.get(["c"], []) is third


def test_a_frozen_table_shares_its_values_only_and_never_grows() -> None:
    t: FrozenTable[str] = FrozenTable("test_frozen", ["user/message"])
    assert t.share(_copy("user/message")) == "user/message"
    assert t.share(_copy("user/message")) is t.share(_copy("user/message"))
    other = _copy("vendor/x")
    assert t.share(other) is other
    assert (t.size(), t.bound, t.full) == (1, 1, 0)


def test_every_sharing_table_of_the_processor_is_listed_with_its_bound() -> None:
    listed = {t.name: t for t in tables()}
    assert listed["event_strings"] is envelope.SHARED_STRINGS
    assert listed["part_names"] is checkpoint_parts.PART_NAMES
    assert listed["unit_keys"] is checkpoint_parts.UNIT_KEYS
    assert listed["published_units"] is runtime._UNITS
    assert listed["dispatch"] is projections._SHARED_DISPATCH
    for table in listed.values():
        assert table.size() <= table.bound, table.name


def test_decoded_event_types_share_the_frozen_table_and_do_not_grow_it() -> None:
    size = envelope.SHARED_STRINGS.size()
    assert envelope.shared_string(_copy("user/message")) is envelope.shared_string("user/message")
    vendor = _copy("vendor/thing")
    assert envelope.shared_string(vendor) is vendor
    assert envelope.SHARED_STRINGS.size() == size and envelope.SHARED_STRINGS.full == 0


def test_unit_keys_share_the_last_keys_seen_and_count_a_change() -> None:
    table = checkpoint_parts.UNIT_KEYS
    keys = ["sessionStats", "inbox"]
    assert checkpoint_parts.shared_keys(keys) is keys
    hits, full = table.hits, table.full
    assert checkpoint_parts.shared_keys(list(keys)) is keys
    assert table.hits == hits + 1
    other = ["sessionStats"]
    assert checkpoint_parts.shared_keys(other) is other
    assert (table.size(), table.full) == (1, full + 1)
    assert checkpoint_parts.shared_keys(list(keys)) is not keys  # dropped for `other`


def test_published_units_share_the_last_tuple_and_count_a_change() -> None:
    table = runtime._UNITS
    units = ("sessionStats", _copy("inbox"))
    assert table.get(units, units) is units
    full = table.full
    assert table.get(("sessionStats", "inbox"), ()) is units
    assert table.get(("x",), ("x",)) == ("x",)
    assert (table.size(), table.full) == (1, full + 1)
