"""``requestHeader``: the canonical last request header (H-1).

State and view: ``None`` before the first header, then
``{"seq": int, "reason": str, "header": canonical_header(...)}``.
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict
from processor.core.events import Event
from processor.core.header import canonical_header
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView


def init(header: SessionHeader, inherited: int) -> Any:
    return None


def apply(state: Any, event: Event) -> Any:
    if event.type != "request/header":
        return state
    return {"seq": event.seq, "reason": event.data["reason"],
            "header": canonical_header(event.data["header"])}


def validate(state: Any) -> None:
    if state is not None:
        require_dict(state, ("seq", "reason", "header"), "requestHeader state")


REQUEST_HEADER = ProjectionDefinition(
    key="requestHeader", state_version=1, init=init, apply=apply, validate_state=validate,
    wire=WireView(view=identity, validate_view=validate))
