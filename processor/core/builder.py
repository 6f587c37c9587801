"""A small builder of well-formed session events (tests, examples, benches).

It assigns seqs and message ids and produces envelopes exactly as the agent
harness writes them; it does not validate — :class:`~processor.core.session.
Session` does.  ``build_*`` methods return the raw envelope dict so callers
can corrupt it on purpose; ``add_*`` methods append a parsed :class:`Event`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from processor.core.events import Event, parse_event


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


class LogBuilder:
    """Append-only list of envelopes with seq and id bookkeeping."""

    def __init__(self, start_seq: int = 0, time0: int = 1_700_000_000_000, form: int = 4) -> None:
        #: Session format whose message shapes are written: 4 (the runtime's
        #: newest) or 3 (the released v3 form: plugin-sourced system messages,
        #: user-role tool results wrapping one tool-result block).
        self.form = form
        self.events: list[Event] = []
        self.next_seq = start_seq
        self.time = time0
        self._ids = 0
        self.turn = 0
        self.step = 0

    # ------------------------------------------------------------ basics

    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    def envelope(self, etype: str, data: Any, **extra: Any) -> dict[str, Any]:
        self.time += 1
        raw: dict[str, Any] = {"type": etype, "seq": self.next_seq, "time": self.time, "data": data}
        raw.update(extra)
        return raw

    def add(self, raw: dict[str, Any]) -> Event:
        event = parse_event(raw)
        self.events.append(event)
        self.next_seq = event.seq + 1
        return event

    def add_raw(self, etype: str, data: Any, **extra: Any) -> Event:
        return self.add(self.envelope(etype, data, **extra))

    # ------------------------------------------------------------ messages

    def message(self, role: str, content: list[Any], **fields: Any) -> dict[str, Any]:
        """A message whose ``source`` is what the runtime requires of its role."""
        if role == "system" and self.form == 3:
            source: dict[str, Any] = {"kind": "plugin", "plugin": "@deepseek-ai/dsh-system-prompt"}
        else:
            source = dict(_SOURCES.get(role, {"kind": "test"}))
        return {
            "id": self._id(role[:3]),
            "role": role,
            "content": content,
            "source": source,
            **fields,
        }

    def _op(self, replace: tuple[int, int] | None) -> Any:
        if replace is None:
            return "append"
        return {"op": "replace", "startSeq": replace[0], "endSeq": replace[1]}

    def _surface_extra(
        self, replace: tuple[int, int] | None, sources: list[int] | None
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {"surfaceOp": self._op(replace)}
        if sources is not None:
            extra["sourceEventSeqs"] = sources
        return extra

    def system(
        self, body: str, *, replace: tuple[int, int] | None = None, sources: list[int] | None = None
    ) -> Event:
        content = [text(body)] if body else []
        data = {"turn": self.turn, "step": self.step, "message": self.message("system", content)}
        return self.add_raw("system/message", data, **self._surface_extra(replace, sources))

    def user(
        self,
        body: str,
        *,
        replace: tuple[int, int] | None = None,
        sources: list[int] | None = None,
        source: Any = None,
    ) -> Event:
        message = self.message("user", [text(body)])
        if source is not None:
            message["source"] = source
        return self.add_raw("user/message", message, **self._surface_extra(replace, sources))

    def assistant(
        self,
        body: str,
        *,
        tool_calls: list[dict[str, Any]] | None = None,
        usage: dict[str, int] | None = None,
        replace: tuple[int, int] | None = None,
    ) -> Event:
        content: list[Any] = [text(body)] if body else []
        for call in tool_calls or []:
            content.append({"type": "tool-call", **call})
        data: dict[str, Any] = {
            "turn": self.turn,
            "step": self.step,
            "stream": [],
            "message": self.message("assistant", content),
        }
        if usage:
            data["usage"] = usage
        return self.add_raw("assistant/message", data, surfaceOp=self._op(replace))

    def summary(self, body: str, start: int, end: int, sources: list[int]) -> Event:
        """A compaction: a user-role summary replacing ``start..end``."""
        return self.user(body, replace=(start, end), sources=sources, source={"kind": "compaction"})

    def tool_call(self, call_id: str, name: str, arguments: Any) -> Event:
        return self.add_raw(
            "tool/call",
            {
                "turn": self.turn,
                "step": self.step,
                "callId": call_id,
                "name": name,
                "arguments": arguments,
            },
        )

    def tool_result(
        self,
        call_id: str,
        body: str,
        *,
        call_seq: int | None = None,
        error: dict[str, Any] | None = None,
        replace: tuple[int, int] | None = None,
        like: Event | None = None,
        form: int | None = None,
    ) -> Event:
        """A tool result; ``like`` rewrites an earlier result's content (S-5).

        ``form`` (default: the builder's) 4 writes the runtime's newest shape (a
        ``tool`` message with ``toolCallId``); 3 writes the released v3 shape (a
        ``user`` message wrapping one ``tool-result`` block).
        """
        if like is not None:
            old = like.data["message"]
            if old["role"] == "user":
                wrapper = {**old["content"][0], "content": [text(body)]}
                rewrite = {**like.data, "message": {**old, "content": [wrapper]}}
            else:
                rewrite = {**like.data, "message": {**old, "content": [text(body)]}}
            return self.add_raw("tool/result", rewrite, **self._surface_extra(replace, [like.seq]))
        source = {"kind": "tool", "callId": call_id}
        if (form or self.form) == 3:
            block: dict[str, Any] = {
                "type": "tool-result",
                "toolCallId": call_id,
                "content": [text(body)],
            }
            if error is not None:
                block["isError"] = True
            message = self.message("user", [block], source=source)
        else:
            message = self.message("tool", [text(body)], source=source, toolCallId=call_id)
        if error is not None:
            message["isError"] = True
        data: dict[str, Any] = {"turn": self.turn, "step": self.step, "message": message}
        if error is not None:
            data["error"] = error
        sources = [call_seq] if call_seq is not None else None
        return self.add_raw("tool/result", data, **self._surface_extra(replace, sources))

    # ------------------------------------------------------------ log-only

    def turn_start(self) -> Event:
        self.turn += 1
        self.step = 0
        return self.add_raw("turn/start", {"turn": self.turn})

    def turn_end(self, reason: str = "completed") -> Event:
        return self.add_raw("turn/end", {"turn": self.turn, "reason": {"kind": reason}})

    def step_start(self) -> Event:
        self.step += 1
        return self.add_raw("step/start", {"turn": self.turn, "step": self.step})

    def step_end(self) -> Event:
        return self.add_raw("step/end", {"turn": self.turn, "step": self.step})

    def header(
        self,
        tools: list[dict[str, Any]] | None = None,
        *,
        reason: str = "initial",
        model: str = "mock-1",
        starts_series: bool = False,
    ) -> Event:
        header: dict[str, Any] = {"config": {"provider": "mock", "model": model}}
        if tools:
            header["tools"] = tools
        data: dict[str, Any] = {"header": header, "reason": reason}
        if starts_series:
            data["startsSeries"] = True
        return self.add_raw("request/header", data)

    def tool_update(
        self, header_seq: int | None, added: Sequence[str] = (), removed: Sequence[str] = ()
    ) -> Event:
        blocks = [{"type": "tool-addition", "toolName": n} for n in added]
        blocks += [{"type": "tool-removal", "toolName": n} for n in removed]
        data: dict[str, Any] = {
            "turn": self.turn,
            "step": self.step,
            "message": self.message("developer", blocks),
        }
        if added:
            data["headerSeq"] = header_seq
        return self.add_raw("developer/message", data, surfaceOp="append")

    def attempt(self, error: str = "overloaded") -> Event:
        return self.add_raw(
            "assistant/attempt",
            {"turn": self.turn, "step": self.step, "stream": [], "error": error},
        )


_SOURCES: dict[str, dict[str, Any]] = {
    "system": {"kind": "system-prompt"},
    "user": {"kind": "user"},
    "developer": {"kind": "tool-registry"},
    "assistant": {"kind": "model", "provider": "mock", "model": "mock-1"},
}


def tool_def(name: str, description: str = "", **params: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": description or f"the {name} tool",
        "parameters": {"type": "object", "properties": params},
    }
