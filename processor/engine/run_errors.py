"""Errors the engine raises that end the run rather than dead-letter a record."""

from __future__ import annotations

from processor.core.errors import Unavailable


class AnchorError(Unavailable, RuntimeError):
    """The events log no longer holds what the checkpoints were folded from."""
