"""The built-in domain projection units the service ships (docs/session-semantics.md §6).

Each module documents its exact state and view shape:

* :mod:`~processor.core.builtin.turn_boundary` — ``turnBoundary``
* :mod:`~processor.core.builtin.tool_history` — ``toolHistory`` (H-5)
* :mod:`~processor.core.builtin.request_header` — ``requestHeader`` (H-1)
* :mod:`~processor.core.builtin.session_stats` — ``sessionStats``
* :mod:`~processor.core.builtin.inbox` — ``inbox``
* :mod:`~processor.core.builtin.runtime_units` — the runtime's own units
  ``title``, ``titleInput`` (not a wire unit), ``todos`` and ``plan``
* :mod:`~processor.core.builtin.goal` — the runtime's ``goal`` unit (GL-1..GL-7)
* :mod:`~processor.core.builtin.token_usage` — the runtime's ``tokenUsage`` unit (TU-1..TU-3)

All but ``titleInput`` are wire units; states are deep-frozen plain JSON and ``apply`` returns
the same object for an irrelevant event (P-1).
"""

from __future__ import annotations

from processor.core.builtin.goal import GOAL
from processor.core.builtin.inbox import INBOX
from processor.core.builtin.request_header import REQUEST_HEADER
from processor.core.builtin.runtime_units import RUNTIME_UNITS
from processor.core.builtin.session_stats import SESSION_STATS
from processor.core.builtin.token_usage import TOKEN_USAGE
from processor.core.builtin.tool_history import TOOL_HISTORY
from processor.core.builtin.turn_boundary import TURN_BOUNDARY
from processor.core.projections import ProjectionDefinition, ProjectionRegistry, Registration

__all__ = [
    "BUILTIN_UNITS",
    "GOAL",
    "INBOX",
    "REQUEST_HEADER",
    "SESSION_STATS",
    "TOKEN_USAGE",
    "TOOL_HISTORY",
    "TURN_BOUNDARY",
    "default_registry",
    "register_builtins",
]

BUILTIN_UNITS: tuple[ProjectionDefinition, ...] = (
    TURN_BOUNDARY,
    TOOL_HISTORY,
    REQUEST_HEADER,
    SESSION_STATS,
    INBOX,
    *RUNTIME_UNITS,
    GOAL,
    TOKEN_USAGE,
)


def register_builtins(registry: ProjectionRegistry) -> list[Registration]:
    """Register the built-in units (P-2: adds a reference when already there)."""
    return [registry.register(unit) for unit in BUILTIN_UNITS]


def default_registry() -> ProjectionRegistry:
    """A fresh registry holding the built-in units."""
    registry = ProjectionRegistry()
    register_builtins(registry)
    return registry
