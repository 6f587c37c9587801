"""Helpers shared by the built-in units (validators and the identity view)."""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    """A JSON integer (booleans are not integers here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number (booleans are not numbers here)."""
    # Exact int/float first (every value a JSON decoder makes): the
    # ``isinstance(value, int | float)`` form built a union type per call,
    # and ``sessionStats`` asks this for every usage field of every reply.
    kind = type(value)
    if kind is int or kind is float:
        return True
    return isinstance(value, _NUMBER_TYPES) and kind is not bool


_NUMBER_TYPES = (int, float)


def require_dict(value: Any, keys: tuple[str, ...], what: str) -> None:
    """``value`` is an object holding at least ``keys`` (ValueError otherwise)."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")


def require_seq(value: Any, what: str, *, optional: bool = True) -> None:
    """``value`` is a seq (int >= 0), or None when ``optional``."""
    if value is None and optional:
        return
    if not is_int(value) or value < 0:
        raise ValueError(f"{what} must be a seq (integer >= 0){' or null' if optional else ''}")


def require_list(value: Any, what: str) -> None:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list")


def identity(state: Any) -> Any:
    """A view that is the state itself: it reuses the state's identity (P-1)."""
    return state
