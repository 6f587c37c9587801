"""Bounded tables that make equal immutable values share one object.

A held session keeps its event types, part names, unit keys and dispatch
table; a copy of each per session was most of figure 6's growth, so equal
values share one canonical object.  The values come from the input (any
type string, any seq), so every table has a bound (never ``sys.intern``: on
Python 3.12 an interned string is never freed).  Past its bound a table costs
memory, never correctness: a value it turns away is used as it is.

Four kinds, each counting what it does (``tables()`` lists them; the service
exports them as metrics, so an operator sees a table that filled up):

- :class:`FrozenTable`: a fixed set of known values, never grows;
- :class:`BoundedTable`: values as they come, until ``bound``; later ones are
  turned away (counted in ``full``);
- :class:`NewestTable`: the ``bound`` newest keys by equality (lists too), for
  values that go stale (a registry's unit tuples); making room drops the
  oldest, counted in ``full``;
- :class:`ShortLivedTables`: only the counts of tables that live for one call
  (a restore's index, restore_share.py); they hold nothing between calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SharedTable:
    """What every kind counts: ``hits`` (a value found shared), ``full`` (the
    bound turned a value away or dropped one)."""

    __slots__ = ("bound", "full", "hits", "name")

    def __init__(self, name: str, bound: int) -> None:
        self.name = name
        self.bound = bound
        self.hits = 0
        self.full = 0
        _TABLES.append(self)

    def size(self) -> int:
        raise NotImplementedError


#: Every table made, in creation order (module-level: they live as long as the process)
_TABLES: Final[list[SharedTable]] = []


def tables() -> list[SharedTable]:
    return list(_TABLES)


class FrozenTable(SharedTable, Generic[V]):
    """A fixed table of known values.  It never grows, so its bound is its size
    and nothing is counted (``values`` is read inline on the decode path)."""

    __slots__ = ("values",)

    def __init__(self, name: str, values: Iterable[V]) -> None:
        self.values: Final[dict[V, V]] = {v: v for v in values}
        super().__init__(name, len(self.values))

    def share(self, value: V) -> V:
        return self.values.get(value, value)

    def size(self) -> int:
        return len(self.values)


class BoundedTable(SharedTable, Generic[V]):
    """The first ``bound`` distinct values seen; later ones are used as they come."""

    __slots__ = ("_values",)

    def __init__(self, name: str, bound: int) -> None:
        super().__init__(name, bound)
        self._values: dict[V, V] = {}

    def share(self, value: V) -> V:
        got = self._values.get(value)
        if got is not None:
            self.hits += 1
            return got
        if len(self._values) >= self.bound:
            self.full += 1
            return value
        self._values[value] = value
        return value

    def size(self) -> int:
        return len(self._values)


class NewestTable(SharedTable, Generic[K, V]):
    """The ``bound`` newest keys, matched by equality (a linear scan: bounds are
    a few entries), each with its shared value."""

    __slots__ = ("_keys", "_values")

    def __init__(self, name: str, bound: int) -> None:
        super().__init__(name, bound)
        self._keys: list[K] = []
        self._values: list[V] = []

    def get(self, key: K, default: V) -> V:
        """The value shared for ``key``; ``default`` becomes it when ``key`` is new."""
        keys = self._keys
        for i in range(len(keys) - 1, -1, -1):
            if keys[i] == key:
                self.hits += 1
                return self._values[i]
        if len(keys) >= self.bound:
            self.full += 1
            del keys[0]
            del self._values[0]
        keys.append(key)
        self._values.append(default)
        return default

    def size(self) -> int:
        return len(self._keys)


class ShortLivedTables(SharedTable):
    """The counts of per-call tables: ``hits`` summed over them, ``full`` each
    time one's ``bound`` (in bytes) turned values away."""

    __slots__ = ()

    def size(self) -> int:
        return 0  # each table is dropped when its call ends
