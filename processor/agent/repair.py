"""Closing a turn a crashed writer left open, as the runtime does on resume.

A resumed loop must not nest a new turn inside an open one, and a provider
refuses a history whose assistant tool calls have no results.  The runtime's
``interruptedTurnClosers`` therefore appends, after the last real event and
with its timestamp: an error ``tool/result`` for every tool call of the open
step without one (``TOOL_OUTCOME_UNKNOWN`` when its ``tool/call`` was
recorded, citing it; ``TOOL_NOT_STARTED`` otherwise), then ``step/end`` for
an open step, then ``turn/end`` with reason ``{kind: "interrupted"}``.
When the retained log no longer holds the turn's start (a session restored
from a checkpoint), the ``turnBoundary`` unit supplies the open turn and step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from processor.agent.context import EventDraft
from processor.core.events import ABSENT, Event
from processor.core.session import Session

__all__ = [
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "interrupted_turn_closers",
    "last_turn",
    "resume_closers",
    "turn_boundary",
]

TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"

_UNKNOWN_TEXT: Final = (
    "The tool call was interrupted after it was recorded, but no result was durably "
    "recorded. Its outcome is unknown. Decide whether to retry from the tool semantics: "
    "retry only if the operation is read-only or idempotent; if it may have side effects, "
    "first verify external state or ask the user. Do not retry blindly."
)
_NOT_STARTED_TEXT: Final = (
    "The tool call was interrupted before the Harness recorded it as started. Retry it "
    "if it is still needed."
)


def interrupted_turn_closers(events: Sequence[Event]) -> list[EventDraft]:
    """The drafts that close an open tail turn (empty for a balanced log).

    The caller commits them in order with the last event's time.
    """
    open_turn: Any = None
    open_step: Any = None
    pending: dict[Any, dict[str, Any]] = {}
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "turn/start":
            open_turn, open_step = data.get("turn"), None
            pending.clear()
        elif event.type == "turn/end":
            open_turn, open_step = None, None
            pending.clear()
        elif event.type == "step/start":
            open_step = data.get("step")
        elif event.type == "step/end":
            pending.clear()
            open_step = None
        elif event.type == "assistant/message":
            message = data.get("message")
            for block in message.get("content", []) if isinstance(message, dict) else []:
                if isinstance(block, dict) and block.get("type") == "tool-call":
                    pending[block.get("id")] = {"step": data.get("step")}
        elif event.type == "tool/call":
            entry = pending.get(data.get("callId"))
            if entry is not None:
                entry["callSeq"] = event.seq
        elif event.type == "tool/result":
            message = data.get("message")
            source = message.get("source") if isinstance(message, dict) else None
            if isinstance(source, dict):
                pending.pop(source.get("callId"), None)
    if open_turn is None or not events:
        return []
    seq = events[-1].seq + 1
    drafts: list[EventDraft] = []
    for call_id, entry in pending.items():
        started = "callSeq" in entry
        message = {
            "id": f"interrupted-tool-result-{call_id}-{seq}",
            "role": "tool",
            "content": [{"type": "text", "text": _UNKNOWN_TEXT if started else _NOT_STARTED_TEXT}],
            "source": {"kind": "tool", "callId": call_id},
            "toolCallId": call_id,
            "isError": True,
        }
        error = (
            {"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN}
            if started
            else {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED}
        )
        drafts.append(
            EventDraft(
                "tool/result",
                {"turn": open_turn, "step": entry["step"], "message": message, "error": error},
                surface_op="append",
                source_event_seqs=[entry["callSeq"]] if started else ABSENT,
            )
        )
        seq += 1
    if open_step is not None:
        drafts.append(EventDraft("step/end", {"turn": open_turn, "step": open_step}))
    drafts.append(EventDraft("turn/end", {"turn": open_turn, "reason": {"kind": "interrupted"}}))
    return drafts


def resume_closers(session: Session, turn: int) -> tuple[list[EventDraft], int | None]:
    """The drafts that close the session's open turn and the time to commit them at.

    From the retained log when it holds the open turn; otherwise (a restored
    session) from the ``turnBoundary`` state, with ``turn`` the loop's
    current turn number.  No drafts for a balanced session.
    """
    events = list(session.log)
    time = events[-1].time if events else None
    drafts = interrupted_turn_closers(events)
    if drafts:
        return drafts, time
    boundary = turn_boundary(session)
    if boundary.get("openTurnStartSeq") is None:
        return [], time
    last = boundary.get("lastStepBoundary")
    if isinstance(last, dict) and last.get("kind") == "start":
        opened = session.log.get(last["seq"])
        step = opened.data.get("step") if opened is not None else last.get("step")
        drafts.append(
            EventDraft("step/end", {"turn": turn, "step": step if isinstance(step, int) else 0})
        )
    drafts.append(EventDraft("turn/end", {"turn": turn, "reason": {"kind": "interrupted"}}))
    return drafts, time


def turn_boundary(session: Session) -> dict[str, Any]:
    """The ``turnBoundary`` state (built-in unit), or one scanned from the retained log.

    The unit survives a checkpoint restore (the log prefix may be gone); the
    scan is the fallback for registries without the built-in units.
    """
    state = session.projections.state_of("turnBoundary")
    if isinstance(state, dict):
        return state
    found: dict[str, Any] = {"openTurnStartSeq": None, "lastStepBoundary": None, "lastTurn": None}
    for event in session.log:
        if event.type == "turn/start":
            found["openTurnStartSeq"], found["lastTurn"] = event.seq, event.data.get("turn")
        elif event.type == "turn/end":
            found["openTurnStartSeq"] = None
        elif event.type in ("step/start", "step/end"):
            kind = "start" if event.type == "step/start" else "end"
            found["lastStepBoundary"] = {
                "kind": kind,
                "seq": event.seq,
                "step": event.data.get("step"),
            }
    return found


def last_turn(session: Session) -> int:
    """The number of the session's last started turn (0 before any)."""
    turn = turn_boundary(session).get("lastTurn")
    return turn if isinstance(turn, int) else 0
