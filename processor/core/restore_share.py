"""Restore-side sharing of frozen values (a loaded session holds what a fresh one does).

A fresh fold's projection cells hold the frozen message blocks and strings the
surface's events already hold; a checkpoint stores each row's value apart, so
restoring froze a second copy of each (~10 KB per 30-event scripted session,
BENCHMARKS §9 ``rst``).  :class:`SharedValues` indexes the restored surface's
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
from processor.core.frozen_types import MAX_DEPTH, FrozenDict, FrozenList


def _json(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return None  # not plain JSON (e.g. an int over 64 bits): not shared


class SharedValues:
    """Frozen containers of restored events, by their JSON text (one restore's life)."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._by_json: dict[bytes, Any] = {}
        for event in events:
            self._index(event.data, 0)

    def _index(self, value: Any, depth: int) -> None:
        t = type(value)
        if (t is not FrozenDict and t is not FrozenList) or depth >= MAX_DEPTH:
            return
        key = _json(value)
        if key is None or key in self._by_json:
            return  # an equal value's parts are indexed already
        self._by_json[key] = value
        for part in value.values() if t is FrozenDict else value:
            self._index(part, depth + 1)

    def freeze(self, value: Any) -> Any:
        """``freeze(value)``, reusing indexed frozen parts equal to parts of it."""
        return freeze(self._share(value, 0)) if self._by_json else freeze(value)

    def _share(self, value: Any, depth: int) -> Any:
        t = type(value)
        if (t is not dict and t is not list) or depth >= MAX_DEPTH:
            return value  # scalars; too deep: freeze reports it
        key = _json(value)
        hit = self._by_json.get(key) if key is not None else None
        if hit is not None:
            return hit
        if t is dict:
            return {k: self._share(v, depth + 1) for k, v in value.items()}
        return [self._share(v, depth + 1) for v in value]
