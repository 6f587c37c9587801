"""Rule F (retry, immutability, log equality) and the step loop's behaviour."""

from __future__ import annotations

from typing import Any

import pytest

from processor.agent.adapters import ModelFailure
from processor.agent.adapters.mock import (
    Fail,
    MaxTokens,
    MockModelAdapter,
    MockRoute,
    MockScriptExhausted,
    Overflow,
    Say,
    ToolCall,
)
from processor.agent.context import message_text
from processor.agent.loop import (
    Agent,
    CompactionPlugin,
    RetryDecision,
    StepContext,
    StepLoop,
    ToolOutput,
)
from processor.agent.prompt import ContextSection, Section, ToolSpec
from processor.agent.request import request_mismatches
from processor.core.events import Event

ROUTES = {
    "default": MockRoute(),
    "other": MockRoute(provider="mock-b", model="mock-b1"),
    "incapable": MockRoute(in_history_system_prompt=False, tool_updates=False),
}


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, _ctx: Any) -> str:
        self.n += 1
        return "You are careful."


def make_agent(counter: Counter | None = None) -> Agent:
    agent = Agent()
    agent.prompt.add_section(Section("main", 0, counter or "You are careful."))
    agent.prompt.add_context(ContextSection("env", 0, "cwd: /work"))
    agent.add_tool(
        ToolSpec("read", "read a file", {"type": "object"}),
        lambda args, ctx: f"contents of {args.get('path')}",
    )
    return agent


def loop_for(script: list[Any], **kw: Any) -> tuple[StepLoop, MockModelAdapter]:
    agent = kw.pop("agent", None) or make_agent()
    adapter = MockModelAdapter(script, routes=ROUTES)
    return StepLoop(agent, agent.new_session(), adapter, **kw), adapter


def types(events: Any) -> list[str]:
    return [e.type for e in events]


# ---------------------------------------------------------------- F-1


def test_F1_a_retry_does_not_reassemble_or_readmit() -> None:
    counter = Counter()
    agent = make_agent(counter)
    loop, adapter = loop_for([Fail(), Fail(), Say("ok")], agent=agent)
    result = loop.run_turn("question")
    assert result.reason == "completed"
    assert counter.n == 1  # one assembly for the step, not one per attempt
    users = [e for e in loop.session.log if e.type == "user/message"]
    assert len(users) == 2  # runtime context + the question, once
    assert len(adapter.requests) == 3


def test_F1_every_attempt_prepares_reconciles_and_builds_a_new_request() -> None:
    loop, adapter = loop_for([Fail(), Fail(route="other"), Say("ok", route="incapable")])
    loop.run_turn("question")
    assert len(adapter.prepared) == 3
    r1, r2, r3 = adapter.requests
    assert r1 is not r2 is not r3
    assert [r.attempt for r in adapter.requests] == [1, 2, 3]
    assert r2.header["config"]["provider"] == "mock-b"  # the route of attempt 2
    assert r3.context["systemPromptUpdate"] == "consolidate"  # incapable route: declared mode
    # headers are logged on change only: attempt 2 (other provider) and 3 (back)
    headers = [e for e in loop.session.log if e.type == "request/header"]
    assert [h.data["reason"] for h in headers] == ["initial", "change", "change"]


# ---------------------------------------------------------------- F-2


def test_F2_the_adapter_that_prepared_the_route_is_called() -> None:
    agent = make_agent()
    a = MockModelAdapter([Fail()], routes=ROUTES, name="A")
    b = MockModelAdapter([Say("from B")], routes={"default": MockRoute(provider="b")}, name="B")
    loop = StepLoop(agent, agent.new_session(), a)

    def swap(event: Event) -> None:  # the agent switches provider mid-attempt
        if event.type == "request/context" and loop.adapter is a:
            loop.adapter = b

    loop.sink = swap
    result = loop.run_turn("question")
    assert result.reason == "completed"
    assert len(a.requests) == 1 and a.requests[0].header["config"]["provider"] == "mock"
    assert len(b.requests) == 1 and b.requests[0].header["config"]["provider"] == "b"
    assert all(r.route.adapter is a for r in a.requests)
    assert request_mismatches([*a.requests, *b.requests], list(loop.session.log)) == []


# ---------------------------------------------------------------- F-3


def test_F3_failed_attempt_logs_attempt_success_logs_message() -> None:
    loop, _ = loop_for([Fail(code="overloaded"), Say("fine")])
    loop.run_turn("question")
    log = list(loop.session.log)
    attempts = [e for e in log if e.type == "assistant/attempt"]
    messages = [e for e in log if e.type == "assistant/message"]
    # each settlement embeds its model stream (the runtime's compact records)
    finish = attempts[0].data["stream"][-1]["chunk"]
    assert finish["reason"] == {
        "kind": "error",
        "failure": {"message": "the model is overloaded", "code": "overloaded"},
    }
    assert set(attempts[0].data) == {"turn", "step", "stream"}
    assert messages[0].data["stream"][-1]["chunk"]["reason"] == {"kind": "stop"}
    assert message_text(messages[0].data["message"]) == "fine"
    # the failed attempt put nothing on the surface
    assert attempts[0].seq not in loop.session.surface.state.node_events
    # the retry re-logged no header or context: nothing changed
    assert types(log)[-4:] == ["llm/retry-started", "assistant/message", "step/end", "turn/end"]


def test_F3_adapter_messages_equal_the_log_rebuild() -> None:
    loop, adapter = loop_for(
        [Say("reading", [ToolCall("read", {"path": "a"})]), Fail(), Say("done")]
    )
    loop.run_turn("question")
    assert len(adapter.requests) == 3
    assert request_mismatches(adapter.requests, list(loop.session.log)) == []


class SneakyPlugin:
    """A plugin that pushes a model-facing message without logging it (forbidden)."""

    def on_failure(self, ctx: StepContext, failure: ModelFailure) -> bool:
        ctx.session.derive_messages().append({"id": "x", "role": "user", "content": []})
        return False


def test_F3_a_plugin_cannot_smuggle_unlogged_messages() -> None:
    loop, adapter = loop_for([Fail(), Say("ok")], plugins=[SneakyPlugin()])
    loop.run_turn("question")
    assert request_mismatches(adapter.requests, list(loop.session.log)) == []
    assert all(m["id"] != "x" for r in adapter.requests for m in r.messages)


# ---------------------------------------------------------------- loop behaviour


def test_event_sequence_of_a_tool_turn() -> None:
    loop, _ = loop_for([Say("reading", [ToolCall("read", {"path": "a"}, id="c1")]), Say("done")])
    result = loop.run_turn("question")
    assert result.steps == 2 and result.reason == "completed"
    # the runtime's order: the prompt is queued, the turn claims it, then the step runs
    assert types(loop.session.log) == [
        "agent/inbox/spliced",
        "turn/start",
        "agent/inbox/spliced",
        "step/start",
        "system/message",
        "user/message",
        "user/message",
        "request/header",
        "request/context",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "step/start",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    call = next(e for e in loop.session.log if e.type == "tool/call")
    res = next(e for e in loop.session.log if e.type == "tool/result")
    assert call.data == {
        "turn": 1,
        "step": 1,
        "callId": "c1",
        "name": "read",
        "arguments": '{"path":"a"}',
    }  # the raw JSON text, as the model wrote it
    assert res.source_event_seqs == [call.seq]
    # format v4: a tool-role message answering its call
    assert res.data["message"]["role"] == "tool"
    assert res.data["message"]["source"] == {"kind": "tool", "callId": "c1"}
    assert res.data["message"]["toolCallId"] == "c1"
    assert res.data["message"]["isError"] is False
    assert res.data["message"]["content"] == [{"type": "text", "text": "contents of a"}]


def test_retry_policy_hook_can_give_up() -> None:
    seen: list[tuple[str, int]] = []

    def policy(failure: ModelFailure, attempt: int) -> RetryDecision | None:
        seen.append((failure.code, attempt))
        return None

    loop, adapter = loop_for([Fail(code="boom"), Say("never")], retry_policy=policy)
    result = loop.run_turn("question")
    assert result.reason == "error" and seen == [("boom", 1)]
    assert types(loop.session.log)[-3:] == ["assistant/attempt", "step/end", "turn/end"]
    assert adapter.remaining == 1


def test_retry_records_delay_and_calls_sleep() -> None:
    slept: list[int] = []
    loop, _ = loop_for([Fail(), Fail(), Say("ok")], sleep=slept.append)
    loop.run_turn("q")
    retries = [e.data for e in loop.session.log if e.type == "llm/retry"]
    # the runtime's llm-retry records: planned (llm/retry), then started
    assert [r["retry"] for r in retries] == [1, 2]
    assert [r["delayMs"] for r in retries] == slept == [500, 1000]
    assert retries[0]["failure"] == {"message": "the model is overloaded", "code": "overloaded"}
    assert {r["mode"] for r in retries} == {"normal"} and retries[0]["provider"] == "mock"
    started = [e.data for e in loop.session.log if e.type == "llm/retry-started"]
    assert [(s["retryId"], s["retry"]) for s in started] == [
        (r["retryId"], r["retry"]) for r in retries
    ]


def test_max_attempts_bounds_a_step() -> None:
    loop, adapter = loop_for([Fail()] * 10, max_attempts=3)
    assert loop.run_turn("q").reason == "error"
    assert len(adapter.requests) == 3


def test_compaction_replaces_a_range_with_a_summary_and_retries() -> None:
    plugin = CompactionPlugin(keep_last=2)
    loop, adapter = loop_for([Say("a1"), Say("a2"), Overflow(), Say("a3")], plugins=[plugin])
    for q in ("q1", "q2", "q3"):
        loop.run_turn(q)
    assert plugin.compactions == 1
    summary = next(
        e
        for e in loop.session.log
        if e.type == "user/message" and e.data["source"]["kind"] == "compact-checkpoint"
    )
    # the runtime's compaction bracket around the checkpoint
    log = list(loop.session.log)
    start, record, end = (
        next(e for e in log if e.type == t)
        for t in ("compaction/start", "compaction/summary", "compaction/end")
    )
    assert start.seq < record.seq < summary.seq < end.seq
    op = summary.surface_op
    assert op["op"] == "replace"
    assert summary.source_event_seqs == [start.seq, record.seq, *record.data["shadowedSeqs"]]
    assert summary.data["source"]["compactionId"] == start.data["compactionId"]
    assert not [e for e in log if e.type == "llm/retry"]  # compaction answered the error
    nodes = loop.session.surface.state.nodes
    state = loop.session.surface.state
    assert state.node_events[nodes[0]].type == "system/message"
    assert nodes[1] == summary.seq
    before, after = adapter.requests[-2:]
    assert len(after.messages) < len(before.messages)
    assert after.starts_series
    assert request_mismatches(adapter.requests, list(loop.session.log)) == []


def test_overflow_without_compaction_ends_the_turn() -> None:
    loop, _ = loop_for([Overflow(), Say("never")])
    assert loop.run_turn("q").reason == "error"


def test_max_tokens_ends_the_turn() -> None:
    loop, _ = loop_for([MaxTokens("partial answer")])
    result = loop.run_turn("q")
    assert result.reason == "max-tokens"
    end = [e for e in loop.session.log if e.type == "turn/end"][-1]
    assert end.data["reason"] == {"kind": "max-tokens"}
    message = [e for e in loop.session.log if e.type == "assistant/message"][-1]
    assert message.data["stream"][-1]["chunk"]["reason"] == {"kind": "max-tokens"}


def test_unknown_tool_and_failing_tool_become_error_results() -> None:
    agent = make_agent()

    def broken(args: Any, ctx: Any) -> ToolOutput:
        raise RuntimeError("disk on fire")

    agent.add_tool(ToolSpec("burn", "fails", {"type": "object"}), broken)
    loop, _ = loop_for([Say("", [ToolCall("nope"), ToolCall("burn")]), Say("sorry")], agent=agent)
    loop.run_turn("q")
    results = [e.data for e in loop.session.log if e.type == "tool/result"]
    assert [r["error"]["code"] for r in results] == ["unknown-tool", "tool-failed"]
    assert all(r["message"]["isError"] is True for r in results)
    assert results[1]["error"] == {"name": "RuntimeError", "code": "tool-failed"}
    assert "disk on fire" in message_text({"content": results[1]["message"]["content"]})


def test_inbox_messages_are_admitted_at_the_next_step() -> None:
    loop, adapter = loop_for(
        [Say("", [ToolCall("read", {"path": "a"})]), Say("done"), Say("second turn")]
    )
    calls = 0

    def sink(event: Event) -> None:
        nonlocal calls
        if event.type == "tool/result" and calls == 0:
            calls += 1
            loop.splice("also check b", delivery="next-step")
            loop.splice("after this turn", delivery="next-turn")

    loop.sink = sink
    result = loop.run_turn("q")
    second_step = [message_text(m) for m in adapter.requests[1].messages if m["role"] == "user"]
    assert second_step[-1] == "also check b"
    assert "after this turn" not in second_step
    # as the runtime's driver: the queued prompt opens one more turn right away
    assert result.turn == 2
    third = [message_text(m) for m in adapter.requests[2].messages if m["role"] == "user"]
    assert third[-1] == "after this turn"
    assert not loop.inbox.has_pending
    splices = [e.data for e in loop.session.log if e.type == "agent/inbox/spliced"]
    # send q, claim q, queue two, claim next-step, claim next-turn
    assert [(d["target"], d.get("removedCount", 0), len(d["inserted"])) for d in splices] == [
        ("next-turn", 0, 1),
        ("next-turn", 1, 0),
        ("next-step", 0, 1),
        ("next-turn", 0, 1),
        ("next-step", 1, 0),
        ("next-turn", 1, 0),
    ]


def test_sink_receives_every_committed_event_in_order() -> None:
    got: list[Event] = []
    loop, _ = loop_for([Say("ok")], sink=got.append)
    loop.run_turn("q")
    assert got == list(loop.session.log)


def test_turn_numbers_continue_in_a_resumed_loop() -> None:
    loop, adapter = loop_for([Say("one")])
    loop.run_turn("q")
    again = StepLoop(loop.agent, loop.session, adapter)
    adapter.push(Say("two"))
    assert again.run_turn("q2").turn == 2


def test_a_resumed_loop_closes_the_turn_a_crash_left_open() -> None:
    loop, adapter = loop_for([])  # no script item: stream raises mid-step (a "crash")
    with pytest.raises(MockScriptExhausted):
        loop.run_turn("q")
    assert types(loop.session.log)[-1] == "request/context"
    again = StepLoop(loop.agent, loop.session, adapter)
    adapter.push(Say("back"))
    result = again.run_turn("q again")
    log = list(loop.session.log)
    end = next(e for e in log if e.type == "turn/end")
    assert end.data == {"turn": 1, "reason": {"kind": "interrupted"}}
    assert types(log)[types(log).index("turn/end") - 1] == "step/end"
    assert result.turn == 2 and result.reason == "completed"
    assert loop.session.projections.state_of("turnBoundary")["openTurnStartSeq"] is None


def test_a_resumed_loop_closes_dangling_tool_calls_like_the_runtime() -> None:
    """The runtime's interruptedTurnClosers: an error result for each tool call of the open
    step without one (TOOL_OUTCOME_UNKNOWN citing a recorded call, TOOL_NOT_STARTED
    otherwise), then step/end and turn/end, all stamped with the last event's time."""
    agent = make_agent()

    def crash(args: Any, ctx: Any) -> str:
        raise KeyboardInterrupt  # the process dies inside the first tool

    agent.add_tool(ToolSpec("crash", "r", {"type": "object"}), crash)
    loop, adapter = loop_for(
        [Say("", [ToolCall("crash", {}, id="c1"), ToolCall("crash", {}, id="c2")])], agent=agent
    )
    with pytest.raises(KeyboardInterrupt):
        loop.run_turn("q")
    last = list(loop.session.log)[-1]
    assert last.type == "tool/call"
    again = StepLoop(loop.agent, loop.session, adapter)
    adapter.push(Say("back"))
    again.run_turn("again")
    log = list(loop.session.log)
    closers = log[last.seq + 1 : last.seq + 5]
    assert [e.type for e in closers] == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert all(e.time == last.time for e in closers)
    first, second = closers[0], closers[1]
    assert first.data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert first.source_event_seqs == [last.seq]
    assert second.data["error"]["code"] == "TOOL_NOT_STARTED"
    assert second.data["message"]["source"] == {"kind": "tool", "callId": "c2"}
    assert closers[3].data == {"turn": 1, "reason": {"kind": "interrupted"}}
    assert request_mismatches(adapter.requests[-1:], log) == []
