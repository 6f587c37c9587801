"""The built-in domain projection units the service ships (SESSION-SEMANTICS §6)."""

from __future__ import annotations

from processor.core.builtin.inbox import INBOX
from processor.core.builtin.request_header import REQUEST_HEADER
from processor.core.builtin.session_stats import SESSION_STATS
from processor.core.builtin.tool_history import TOOL_HISTORY
from processor.core.builtin.turn_boundary import TURN_BOUNDARY
from processor.core.projections import ProjectionRegistry, Registration

BUILTIN_UNITS = (TURN_BOUNDARY, TOOL_HISTORY, REQUEST_HEADER, SESSION_STATS, INBOX)


def register_builtins(registry: ProjectionRegistry) -> list[Registration]:
    return [registry.register(unit) for unit in BUILTIN_UNITS]


def default_registry() -> ProjectionRegistry:
    """A fresh registry holding the built-in units."""
    registry = ProjectionRegistry()
    register_builtins(registry)
    return registry
