"""``requestHeader``: the canonical last request header (H-1).

State and view (the same deep-frozen JSON value): ``None`` before the first
``request/header``, then::

    {"seq": int,                    # seq of the last request/header
     "reason": str,                 # initial | resume | change | series
     "header": canonical_header(data.header)}

Why: a reader (or a resumed loop) needs the header in effect without
scanning the log, whose prefix may be gone after a checkpoint restore.  The
canonical form (H-1) makes two equal headers equal JSON.  Every other event
returns the same object (P-1).
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict, require_seq
from processor.core.events import Event
from processor.core.frozen import freeze
from processor.core.header import canonical_header
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY = "requestHeader"


def init(header: SessionHeader, inherited: int) -> Any:
    return None


def apply(state: Any, event: Event) -> Any:
    if event.type != "request/header":
        return state
    header = event.data.get("header")
    return freeze(
        {
            "seq": event.seq,
            "reason": event.data.get("reason"),
            "header": canonical_header(header if isinstance(header, dict) else {}),
        }
    )


def validate(state: Any) -> None:
    if state is None:
        return
    require_dict(state, ("seq", "reason", "header"), "requestHeader state")
    require_seq(state["seq"], "requestHeader.seq", optional=False)
    if not isinstance(state["reason"], str):
        raise ValueError("requestHeader.reason must be a string")
    require_dict(state["header"], ("config",), "requestHeader.header")


REQUEST_HEADER = ProjectionDefinition(
    key=KEY,
    state_version=1,
    init=init,
    apply=apply,
    validate_state=validate,
    wire=WireView(view=identity, validate_view=validate),
    event_types=frozenset({"request/header"}),
)
