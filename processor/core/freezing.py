"""The walk of :func:`processor.core.frozen.freeze`, in its own module so the
compiled build can compile it (the dict/list subclasses, in ``frozen_types.py``,
cannot be compiled by mypyc).  Callers import ``freeze`` from ``frozen``.

Compiled, the walk, the type tests and the recursion run as C; the copies
stay ``dict``/``list`` copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

from processor.core.frozen_types import MAX_DEPTH, FrozenDict, FrozenList, JsonDepthError
from processor.core.leaf import SETTLE, c_freeze, c_freeze_item

# The frozen types as module constants: compiled, a Final is a C static, while
# each use of an imported class name is a lookup in the module's dict.
_FROZEN_DICT: Final = FrozenDict
_FROZEN_LIST: Final = FrozenList
# Untracks each frozen container whose parts are scalars or settled parts (the
# compiled build; None in the pure one): kept events are then no work for the
# young collections (leaf.py).
_SETTLE: Final = SETTLE


def _done(t: type) -> bool:
    """Values of type ``t`` need no work: immutable scalars, or already frozen.

    Identity tests, most common first (compiled: pointer compares, where a
    set of types was a hash lookup per value)."""
    return (
        t is str
        or t is int
        or t is bool
        or t is float
        or t is type(None)
        or t is _FROZEN_DICT
        or t is _FROZEN_LIST
    )


class _Freeze(Protocol):
    def __call__(self, value: Any, _depth: int = 0, /) -> Any: ...


def walk(value: Any, _depth: int = 0) -> Any:
    """:func:`freeze` in Python: the pure build's, and the compiled build's for
    dict and list subclasses (the C walk hands those back here)."""
    t = type(value)
    # A container of scalars is copied once, in C.  One that holds containers
    # is copied into a plain dict or list whose nested values are replaced
    # (plain item writes), then frozen: writing into the frozen copy went
    # through the base class's __setitem__ as a generic call per nested value.
    if t is dict:
        if _depth >= MAX_DEPTH:
            raise JsonDepthError()
        src: dict[str, Any] = value
        d = _depth + 1
        copy: dict[str, Any] | None = None
        for k, v in src.items():
            tv = type(v)  # _done(tv), inline: a call per value costs the pure build
            if not (tv is str or tv is int or tv is bool or tv is float or v is None) and not (
                tv is _FROZEN_DICT or tv is _FROZEN_LIST
            ):
                if copy is None:
                    copy = dict(src)
                copy[k] = freeze(v, d)
        frozen_dict = _FROZEN_DICT(src if copy is None else copy)
        return frozen_dict if _SETTLE is None else _SETTLE(frozen_dict)
    if t is list or t is tuple:
        if _depth >= MAX_DEPTH:
            raise JsonDepthError()
        d = _depth + 1
        items: list[Any] | None = None
        for i, v in enumerate(value):
            tv = type(v)  # _done(tv), inline
            if not (tv is str or tv is int or tv is bool or tv is float or v is None) and not (
                tv is _FROZEN_DICT or tv is _FROZEN_LIST
            ):
                if items is None:
                    items = list(value)
                items[i] = freeze(v, d)
        frozen_list = _FROZEN_LIST(value if items is None else items)
        return frozen_list if _SETTLE is None else _SETTLE(frozen_list)
    # the union below is built per call: scalars and frozen parts first
    if _done(t) or not isinstance(value, dict | list | tuple):
        return value
    if _depth >= MAX_DEPTH:
        raise JsonDepthError()
    frozen: Any
    if isinstance(value, dict):
        frozen = FrozenDict({k: freeze(v, _depth + 1) for k, v in value.items()})
    else:
        frozen = FrozenList([freeze(v, _depth + 1) for v in value])
    return frozen if _SETTLE is None else _SETTLE(frozen)


#: Return a deep-frozen copy of a JSON value (frozen parts are reused).
#: Raises :class:`JsonDepthError` (never ``RecursionError``) when the value
#: nests deeper than :data:`MAX_DEPTH`.  The compiled build's is the same walk
#: in C (``_leaf.freeze``: one copy per container where this one made two for
#: a container of containers, no call per level through the type); the pure
#: build's is :func:`walk`.
freeze: Final[_Freeze] = c_freeze(FrozenDict, FrozenList, JsonDepthError, MAX_DEPTH, walk) or walk

#: ``freeze_item(d, key)``: ``d[key] = freeze(d[key])`` for a dict the caller
#: has just decoded and holds the only reference to: compiled, the value's
#: dicts and lists become the frozen ones in place instead of being copied
#: (leaf.py).  None in the pure build: callers use :data:`freeze`.
freeze_item: Final[Callable[[dict[str, Any], str], None] | None] = (
    c_freeze_item(FrozenDict, FrozenList) if freeze is not walk else None
)
