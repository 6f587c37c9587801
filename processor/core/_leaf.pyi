from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

def settle(obj: _T, /) -> _T: ...
def register(types: tuple[type, ...], objects: tuple[object, ...], /) -> None: ...
def adopts(frozen_dict: type, /) -> bool: ...
def adopt(value: object, /) -> object: ...
def freeze(value: object, depth: int = 0, /) -> object: ...
def freezer(
    dict_type: type,
    list_type: type,
    error: Callable[[], BaseException],
    fallback: Callable[[object, int], object],
    max_depth: int,
    /,
) -> bool: ...

#: 1 where adopt() may change a value's type in place (CPython 3.11 with the GIL), else 0
ADOPT_IN_PLACE: int
