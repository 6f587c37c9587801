"""Helpers shared by the built-in units."""

from __future__ import annotations

from typing import Any


def require_dict(value: Any, keys: tuple[str, ...], what: str) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")


def identity(state: Any) -> Any:
    """A view that is the state itself (reuses the object: P-1)."""
    return state
