"""Errors the engine raises that end the run rather than dead-letter a record."""

from __future__ import annotations


class AnchorError(RuntimeError):
    """The events log no longer holds what the checkpoints were folded from."""
