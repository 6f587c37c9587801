"""Deep-frozen JSON values.

Events are the only truth, and every message the model sees is borrowed from an
event.  Freezing event data once, at the edge, lets the surface, the derived
message list and built requests share one object per message (G-2, F-2) without
defensive copies: a plugin that tries to mutate a message gets a TypeError
instead of silently rewriting history.

``FrozenDict`` and ``FrozenList`` subclass ``dict`` and ``list`` so equality,
``isinstance`` checks and JSON encoders (json, orjson) keep working unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Final, NoReturn

from processor.core.errors import SessionError

#: Deepest nesting of dicts and lists a frozen value may have.  Untrusted JSON
#: (orjson accepts 1024 levels) would otherwise overflow the Python stack in
#: ``freeze`` and in every recursive walk after it, and orjson cannot encode
#: more than 254 levels back (checkpoints wrap ``data`` in ~10 more levels).
MAX_DEPTH: Final = 128


class JsonDepthError(SessionError):
    """A JSON value nests deeper than :data:`MAX_DEPTH` (rule E-3: bounded plain JSON)."""

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        super().__init__(
            None,
            "E-3",
            f"data nests deeper than {limit} levels; data must be "
            f"plain JSON nested at most {limit} levels",
        )


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise TypeError("frozen JSON value cannot be modified")


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses every mutation."""

    __slots__ = ()
    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return thaw(self)  # type: ignore[no-any-return]

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __reduce__(self) -> Any:
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
    """A ``list`` that refuses every mutation."""

    __slots__ = ()
    __setitem__ = _refuse
    __delitem__ = _refuse
    __iadd__ = _refuse
    __imul__ = _refuse
    append = _refuse
    extend = _refuse
    insert = _refuse
    pop = _refuse
    remove = _refuse
    clear = _refuse
    sort = _refuse
    reverse = _refuse

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return thaw(self)  # type: ignore[no-any-return]

    def __copy__(self) -> list[Any]:
        return list(self)

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))


# Values that need no work: already frozen, or immutable scalars.  Checked
# inline (one set lookup) so freezing a dict of mostly-frozen values costs no
# call per value.
_DONE = frozenset({str, int, float, bool, type(None), FrozenDict, FrozenList})
# The base classes' item setters: only freeze itself fills a frozen container.
_dict_set = dict.__setitem__
_list_set = list.__setitem__


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
        d = _depth + 1
        fdict = FrozenDict(value)
        for k, v in value.items():
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
    if t is FrozenDict or t is FrozenList or not isinstance(value, dict | list | tuple):
        return value
    if _depth >= MAX_DEPTH:
        raise JsonDepthError()
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v, _depth + 1) for k, v in value.items()})
    return FrozenList([freeze(v, _depth + 1) for v in value])


def thaw(value: Any) -> Any:
    """Return a plain, mutable deep copy of a JSON value."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


def json_problem(value: Any, path: str = "data", _depth: int = 0) -> str | None:
    """Describe why ``value`` is not plain JSON, or return None when it is.

    Plain JSON: dict with str keys, list, str, bool, None, int, finite float,
    nested at most :data:`MAX_DEPTH` levels.
    """
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} holds a non-finite number"
    if isinstance(value, dict | list | tuple) and _depth >= MAX_DEPTH:
        return f"{path} nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} has a non-string key {k!r}"
            problem = json_problem(v, f"{path}.{k}", _depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            problem = json_problem(v, f"{path}[{i}]", _depth + 1)
            if problem:
                return problem
        return None
    return f"{path} holds a non-JSON value of type {type(value).__name__}"
