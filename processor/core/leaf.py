"""Frozen values out of the cyclic collector, where the build can do it.

The compiled build ships the C module ``processor.core._leaf`` (setup.py):
its ``settle(obj)`` untracks a frozen container or event whose references
cannot lead back to it (CPython's rule for tuples, which it never applies to
dict/list subclasses), so young collections no longer walk every kept event.
The pure build has no C module: :data:`SETTLE` is None and the values stay
tracked, which changes nothing but the collector's work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

try:
    from processor.core import _leaf
except ImportError:  # the pure build
    _leaf = None  # type: ignore[assignment]

#: ``settle(obj) -> obj``, or None where the C module is not built
SETTLE: Final[Callable[[Any], Any] | None] = _leaf.settle if _leaf is not None else None


_F = TypeVar("_F")


def adopter(frozen: type[_F]) -> Callable[[Any], _F]:
    """``frozen(v)`` for a dict or list ``v`` its caller has just built and drops.

    ``frozen`` is a registered dict or list subclass.  Compiled, ``v`` itself
    becomes the frozen value when the call holds its only reference (its
    type changes in place: no second object, no copied table) and is
    settled; a value anyone else holds is copied.  The pure build, or a type
    without its base's exact layout: ``frozen`` itself.
    """
    if _leaf is not None and _leaf.adopts(frozen):
        return _leaf.adopt  # type: ignore[return-value]
    return frozen


def c_freeze(
    frozen_dict: type,
    frozen_list: type,
    error: Callable[[], BaseException],
    max_depth: int,
    fallback: Callable[[Any, int], Any],
) -> Callable[..., Any] | None:
    """The C walk of ``freezing.freeze`` over these frozen types, or None (the
    pure build, or types without their base's layout).  ``fallback(value,
    depth)`` freezes what the C walk leaves to Python (dict and list subclasses)."""
    if _leaf is not None and _leaf.freezer(frozen_dict, frozen_list, error, fallback, max_depth):
        return _leaf.freeze
    return None


def c_freeze_item(
    frozen_dict: type, frozen_list: type
) -> Callable[[dict[str, Any], str], None] | None:
    """``freeze_item(d, key)``: ``d[key] = freeze(d[key])`` for a dict its
    caller has just decoded and holds the only reference to; compiled on
    CPython 3.11, each unshared dict and list in it becomes frozen in place
    (no copy).  None where :func:`c_freeze` gave no C walk or types cannot
    change in place."""
    if (
        _leaf is not None
        and _leaf.ADOPT_IN_PLACE
        and _leaf.adopts(frozen_dict)
        and _leaf.adopts(frozen_list)
        and _leaf.freezer(frozen_dict, frozen_list, None, None, 0)  # the types c_freeze took
    ):
        return _leaf.freeze_item
    return None


def register(types: tuple[type, ...], inert: tuple[object, ...] = ()) -> None:
    """Let :data:`SETTLE` untrack instances of ``types`` (immutable, built from
    finished parts only) whose references are scalars, their own type, the
    ``inert`` singletons or untracked instances of registered types."""
    if _leaf is not None:
        _leaf.register(types, inert)
