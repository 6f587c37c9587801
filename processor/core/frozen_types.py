"""The frozen containers and the depth bound of :mod:`processor.core.frozen`.

Their own module so that the walk (:mod:`processor.core.freezing`), which
the compiled build compiles, and ``frozen`` (which re-exports everything)
import them without a cycle; mypyc cannot compile dict/list subclasses, so
this module stays interpreted.  Import from ``processor.core.frozen``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NoReturn

from processor.core.errors import SessionError
from processor.core.leaf import adopter, register

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


# frozen values hold only scalars and finished frozen parts (freeze builds them
# bottom-up): none can be part of a reference cycle (processor/core/leaf.py)
register((FrozenDict, FrozenList))

#: ``FrozenDict(d)`` for a dict its caller has just built and does not keep:
#: compiled, it becomes the frozen value in place instead of being copied into
#: a new one and freed (leaf.py).  Its values must already be frozen or
#: scalars, as for ``FrozenDict(d)`` wherever a frozen value is built by hand.
frozen_dict_of: Final[Callable[[dict[str, Any]], FrozenDict]] = adopter(FrozenDict)


def thaw(value: Any) -> Any:
    """Return a plain, mutable deep copy of a JSON value."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
