"""The walk of :func:`processor.core.frozen.freeze`, in its own module so the
compiled build can compile it (the dict/list subclasses, in ``frozen_types.py``,
cannot be compiled by mypyc).  Callers import ``freeze`` from ``frozen``.

Interpreted it costs the same as when it lived in ``frozen.py``; compiled,
freezing an event's data takes about a third less time (the walk, the type
tests and the recursion run as C; the copies stay ``dict``/``list`` copies).
"""

from __future__ import annotations

from typing import Any, Final

from processor.core.frozen_types import MAX_DEPTH, FrozenDict, FrozenList, JsonDepthError

# Values that need no work: already frozen, or immutable scalars.  Checked
# inline (one set lookup) so freezing a dict of mostly-frozen values costs no
# call per value.
_DONE: Final = frozenset({str, int, float, bool, type(None), FrozenDict, FrozenList})
# The base classes' item setters: only freeze itself fills a frozen container.
_dict_set: Final = dict.__setitem__
_list_set: Final = list.__setitem__


def freeze(value: Any, _depth: int = 0) -> Any:
    """Return a deep-frozen copy of a JSON value (frozen parts are reused).

    Raises :class:`JsonDepthError` (never ``RecursionError``) when the value
    nests deeper than :data:`MAX_DEPTH`.
    """
    t = type(value)
    # Copy the container in C, then replace only its nested containers: most
    # values are scalars, and building a temporary dict or list per container
    # first was most of the cost of freezing an event.
    if t is dict:
        if _depth >= MAX_DEPTH:
            raise JsonDepthError()
        src: dict[str, Any] = value
        d = _depth + 1
        fdict = FrozenDict(src)
        for k, v in src.items():
            if type(v) not in _DONE:
                _dict_set(fdict, k, freeze(v, d))
        return fdict
    if t is list or t is tuple:
        if _depth >= MAX_DEPTH:
            raise JsonDepthError()
        d = _depth + 1
        flist = FrozenList(value)
        for i, v in enumerate(value):
            if type(v) not in _DONE:
                _list_set(flist, i, freeze(v, d))
        return flist
    # scalars and frozen parts first: the union below is built per call
    if t in _DONE or not isinstance(value, dict | list | tuple):
        return value
    if _depth >= MAX_DEPTH:
        raise JsonDepthError()
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v, _depth + 1) for k, v in value.items()})
    return FrozenList([freeze(v, _depth + 1) for v in value])
