"""Running one tool call and logging it the way the runtime does (format v4).

``tool/call`` carries the raw ``arguments`` text the model produced; the
handler gets it parsed (an empty string is ``{}``, invalid JSON stays the
string, as the runtime's ``parseArguments``).  The result is a ``tool``
message ``{role: "tool", content, source: {kind: "tool", callId},
toolCallId, isError}`` that cites its call; a failure adds ``error: {name,
code}`` to the event data.  A call of a tool not offered in the step, or a
handler that raises, becomes an error result the model can react to.
"""

from __future__ import annotations

from typing import Any

import orjson

from processor.agent.agent import ToolContext, ToolHandler, ToolOutput
from processor.agent.context import EventDraft
from processor.agent.plugins import StepContext
from processor.core.frozen import thaw

__all__ = ["parse_arguments", "run_tool"]


def parse_arguments(raw: str) -> Any:
    """The runtime's argument parsing: empty -> ``{}``, invalid JSON stays text."""
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def run_tool(ctx: StepContext, call: Any, handler: ToolHandler | None) -> None:
    """Log ``tool/call``, run ``handler`` (None: not offered), log ``tool/result``."""
    call_id, name = call["id"], call["name"]
    raw = call.get("arguments", "")
    arguments = raw if isinstance(raw, str) else orjson.dumps(thaw(raw)).decode()
    call_event = ctx.commit(
        EventDraft(
            "tool/call",
            {
                "turn": ctx.turn,
                "step": ctx.step,
                "callId": call_id,
                "name": name,
                "arguments": arguments,
            },
        )
    )
    if handler is None:
        output = ToolOutput(
            f"Error: unknown tool {name!r}", error={"name": "UnknownTool", "code": "unknown-tool"}
        )
    else:
        try:
            produced = handler(
                parse_arguments(arguments),
                ToolContext(ctx.turn, ctx.step, call_id, name, ctx.session),
            )
            output = ToolOutput(produced) if isinstance(produced, str) else produced
        except Exception as exc:  # a failing tool is reported to the model
            output = ToolOutput(
                f"Error: {exc}", error={"name": type(exc).__name__, "code": "tool-failed"}
            )
    content = (
        [{"type": "text", "text": output.content}]
        if isinstance(output.content, str)
        else [thaw(b) for b in output.content]
    )
    message: dict[str, Any] = {
        "id": ctx.new_id("tool"),
        "role": "tool",
        "content": content,
        "source": {"kind": "tool", "callId": call_id},
        "toolCallId": call_id,
        "isError": output.error is not None,
    }
    data: dict[str, Any] = {"turn": ctx.turn, "step": ctx.step, "message": message}
    if output.error is not None:
        data["error"] = {"name": output.error["name"], "code": output.error["code"]}
    if output.meta is not None:
        data["meta"] = dict(output.meta)
    ctx.commit(
        EventDraft("tool/result", data, surface_op="append", source_event_seqs=[call_event.seq])
    )
