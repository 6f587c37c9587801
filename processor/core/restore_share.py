"""Restore-side sharing of frozen values (a loaded session holds what a fresh one does).

A fresh fold's projection cells hold the frozen message blocks and strings the
surface's events already hold; a checkpoint stores each row's value apart, so
restoring froze a second copy of each (~10 KB per 30-event scripted session,
figure 9).  :class:`SharedValues` indexes the restored surface's
frozen containers by their JSON text, and :meth:`SharedValues.freeze` reuses an
equal one where the row holds it.  Equal by JSON text keeps key order and the
int/float/bool distinction, so the restored state and its next checkpoint are
the same as without sharing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from processor.core.events import Event
from processor.core.frozen import freeze
from processor.core.frozen_types import FrozenDict, FrozenList
from processor.core.sharing import ShortLivedTables

#: Each level re-serializes its subtree: a depth cap keeps the work a small
#: multiple of the session's size (the blocks worth sharing sit 1-4 levels
#: down); a hostile 128-deep value would otherwise cost 128 copies of itself.
SHARE_DEPTH = 6
#: The index's keys for one restore, in bytes; past it nothing more is indexed
#: (values are then frozen unshared, as before the sharing existed).
INDEX_BUDGET = 8 * 1024 * 1024
#: Exported with the other sharing tables: reuses, and restores whose index
#: spent its budget (``processor_shared_table_full_total{table="restore_blocks"}``)
RESTORE_BLOCKS = ShortLivedTables("restore_blocks", INDEX_BUDGET)


def _json(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return None  # not plain JSON (e.g. an int over 64 bits): not shared


class SharedValues:
    """Frozen containers of restored events, by their JSON text (one restore's life)."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._by_json: dict[bytes, Any] = {}
        self._indexed = 0
        self._spent = False
        for event in events:
            self._index(event.data, 0)

    def _index(self, value: Any, depth: int) -> None:
        t = type(value)
        if (t is not FrozenDict and t is not FrozenList) or depth >= SHARE_DEPTH:
            return
        key = _json(value)
        if key is None or key in self._by_json:
            return  # an equal value's parts are indexed already
        if self._indexed + len(key) > INDEX_BUDGET:
            if not self._spent:
                self._spent = True
                RESTORE_BLOCKS.full += 1
            return
        self._indexed += len(key)
        self._by_json[key] = value
        for part in value.values() if t is FrozenDict else value:
            self._index(part, depth + 1)

    def freeze(self, value: Any) -> Any:
        """``freeze(value)``, reusing indexed frozen parts equal to parts of it."""
        return freeze(self._share(value, 0)) if self._by_json else freeze(value)

    def _share(self, value: Any, depth: int) -> Any:
        t = type(value)
        if (t is not dict and t is not list) or depth >= SHARE_DEPTH:
            return value  # scalars; deeper parts are frozen unshared
        key = _json(value)
        hit = self._by_json.get(key) if key is not None else None
        if hit is not None:
            RESTORE_BLOCKS.hits += 1
            return hit
        if t is dict:
            return {k: self._share(v, depth + 1) for k, v in value.items()}
        return [self._share(v, depth + 1) for v in value]
