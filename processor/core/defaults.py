"""A session with the default registries, assembled in one place.

The fold command, the service, the writer, the agent, ingest and the
inspector must fold with the same built-in units (``core/builtin``) and the
same message projections (``image/offload``): a verdict or a view that
differs between two of them is a bug no single test of either would see.
Every ``None`` below means "the defaults".

This module sits above ``message_projections`` and ``image_offload`` (the
built-in interpreter needs the registry's context type), so neither of them
imports the other's module back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from processor.core.builtin import default_registry
from processor.core.events import Event
from processor.core.image_offload import ImageOffload
from processor.core.log import SessionHeader
from processor.core.message_projections import MessageProjectionRegistry
from processor.core.projections import ProjectionRegistry
from processor.core.session import Session

__all__ = [
    "default_message_projections",
    "default_registry",
    "fold_session",
    "new_session",
    "session_from_checkpoint",
]


def default_message_projections() -> MessageProjectionRegistry:
    """A registry with the built-in interpreters (``image/offload``)."""
    return MessageProjectionRegistry([ImageOffload()])


def _or_defaults(
    message_projections: MessageProjectionRegistry | None,
    projections: ProjectionRegistry | None,
) -> tuple[MessageProjectionRegistry, ProjectionRegistry]:
    return (
        message_projections if message_projections is not None else default_message_projections(),
        projections if projections is not None else default_registry(),
    )


def new_session(
    header: SessionHeader | None = None,
    *,
    message_projections: MessageProjectionRegistry | None = None,
    projections: ProjectionRegistry | None = None,
    dialect: int | None = None,
) -> Session:
    """An empty session (``header`` None: a synthetic one)."""
    mp, pr = _or_defaults(message_projections, projections)
    return Session(header, message_projections=mp, projections=pr, dialect=dialect)


def fold_session(
    events: Sequence[Event],
    header: SessionHeader | None = None,
    *,
    message_projections: MessageProjectionRegistry | None = None,
    projections: ProjectionRegistry | None = None,
    dialect: int | None = None,
) -> Session:
    """A whole log folded through the same path as live appends."""
    mp, pr = _or_defaults(message_projections, projections)
    return Session.fold(events, header, message_projections=mp, projections=pr, dialect=dialect)


def session_from_checkpoint(
    checkpoint: Mapping[str, Any],
    header: SessionHeader | None = None,
    *,
    message_projections: MessageProjectionRegistry | None = None,
    projections: ProjectionRegistry | None = None,
    dialect: int | None = None,
) -> Session:
    """A session continued from ``Session.checkpoint`` output (raises ``SessionError``)."""
    mp, pr = _or_defaults(message_projections, projections)
    return Session.from_checkpoint(
        checkpoint, header, message_projections=mp, projections=pr, dialect=dialect
    )
