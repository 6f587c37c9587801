"""Issue 17: the agent side behaves as the runtime's own code (Y, R, H, F rules).

Each test names the rule it pins and the issue item it comes from; each one
failed with the behaviour we had before (the docstring says what it was).
Items 1, 4, 5 and 6 are in test_prompt.py / test_context.py next to their
rules.
"""

from __future__ import annotations

from typing import Any

import pytest

from processor.agent.adapters import RequestContext
from processor.agent.adapters.mock import MockModelAdapter, MockRoute, Overflow, Say, ToolCall
from processor.agent.context import EventDraft
from processor.agent.loop import Agent, CompactionPlugin, StepLoop
from processor.agent.prompt import (
    UNLISTED_TOOLS,
    ContextSection,
    Section,
    SystemPrompt,
    ToolSpec,
)
from processor.agent.request import RequestState, build_request, header_of, request_mismatches
from processor.agent.tool_history import ToolHistoryError, tool_history
from processor.core.events import Event, make_event
from processor.core.header import (
    call_config_equals,
    canonical_header,
    header_equals,
    js_json,
)
from processor.core.session import Session

ROUTES = {
    "default": MockRoute(),
    "other": MockRoute(model="mock-2"),
    "incapable": MockRoute(in_history_system_prompt=False, tool_updates=False),
}


def spec(name: str) -> ToolSpec:
    return ToolSpec(name, f"the {name} tool", {"type": "object"})


class Harness:
    def __init__(self, context: str = "") -> None:
        self.context = context
        self.agent = Agent()
        self.agent.prompt.add_section(Section("main", 0, "You are careful."))
        self.agent.prompt.add_context(ContextSection("env", 0, lambda _c: self.context))
        self.session = self.agent.new_session()
        self.adapter = MockModelAdapter(routes=ROUTES)
        self.loop = StepLoop(
            self.agent, self.session, self.adapter, plugins=[CompactionPlugin(keep_last=1)]
        )

    def turn(self, *items: Any, text: str = "go") -> list[Event]:
        self.adapter.push(*items)
        return list(self.loop.run_turn(text).events)

    def events(self, etype: str) -> list[Event]:
        return [e for e in self.session.log if e.type == etype]


def commit_into(session: Session) -> Any:
    def commit(draft: EventDraft) -> Event:
        event = make_event(
            draft.type,
            session.next_seq,
            draft.data,
            surface_op=draft.surface_op,
            source_event_seqs=draft.source_event_seqs,
        )
        session.validate(event)
        session.append(event)
        return event

    return commit


# ---------------------------------------------------------------- Y (items 2, 3)


def test_Y2_defer_loading_kept_only_when_true() -> None:
    """Item 2: ``deferLoading: false`` is dropped from the assembled tool (and so from the
    header); we used to keep it."""
    prompt = SystemPrompt()
    prompt.add_tools(
        lambda: [
            {"name": "a", "description": "", "parameters": {}, "deferLoading": False},
            {"name": "b", "description": "", "parameters": {}, "deferLoading": True},
            ToolSpec("c", "", {}, defer_loading=False),
        ]
    )
    a, b, c = prompt.assemble().tools
    assert "deferLoading" not in a and "deferLoading" not in c
    assert b["deferLoading"] is True


def test_Y2_duplicate_tool_names_are_kept_in_provider_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 36 item 3: the runtime's SystemPrompt.assemble collects every provider's
    schemas and sorts them stably by name (system-prompt/src/index.ts, ``orderTools``),
    so two tools of one name both reach the header, in provider order; we refused
    (Y-2 PromptError).  A warning names the tool."""
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [spec("read"), ToolSpec("b", "first b", {})])
    prompt.scope("s").add_tools(lambda: [ToolSpec("read", "the second read", {}), spec("a")])
    with caplog.at_level("WARNING"):
        tools = prompt.assemble("s").tools
    assert [(t["name"], t["description"]) for t in tools] == [
        ("a", "the a tool"),
        ("b", "first b"),
        ("read", "the read tool"),
        ("read", "the second read"),
    ]
    assert "'read'" in caplog.text
    prompt.set_tool_order(("read", UNLISTED_TOOLS))
    ordered = prompt.assemble("s").tools
    assert [t["description"] for t in ordered][:2] == ["the read tool", "the second read"]


# ---------------------------------------------------------------- H-1 (items 9, 10, 11)


BASE = {"provider": "p", "model": "m"}


def test_H1_stop_empty_list_is_not_absent() -> None:
    """Item 9: ``stop: []`` and no ``stop`` are different configurations for the runtime's
    callConfigEquals; we called them equal."""
    assert not call_config_equals({**BASE, "stop": []}, BASE)
    assert call_config_equals({**BASE, "stop": ["x"]}, {**BASE, "stop": ["x"]})
    assert not call_config_equals({**BASE, "stop": ["x"]}, {**BASE, "stop": ["y"]})


def test_H1_null_temperature_is_not_absent() -> None:
    """Item 9: ``temperature: null`` differs from an absent temperature (JavaScript
    ``null !== undefined``); we called them equal."""
    assert not call_config_equals({**BASE, "temperature": None}, BASE)
    assert call_config_equals({**BASE, "temperature": None}, {**BASE, "temperature": None})
    assert call_config_equals({**BASE, "temperature": 1}, {**BASE, "temperature": 1.0})
    assert not call_config_equals({**BASE, "maxTokens": True}, {**BASE, "maxTokens": 1})


def test_H1_adapter_defaults_only_known_true_flags() -> None:
    """Item 10: only the ``reasoningEffort``/``maxTokens`` markers count, and only when
    ``true``; we kept any true flag (an unknown flag made headers differ and was kept in
    the canonical form)."""
    only_unknown = {"config": BASE, "adapterDefaults": {"temperature": True}}
    assert "adapterDefaults" not in canonical_header(only_unknown)
    assert header_equals(canonical_header(only_unknown), canonical_header({"config": BASE}))
    known = canonical_header({"config": BASE, "adapterDefaults": {"maxTokens": True}})
    assert known["adapterDefaults"] == {"maxTokens": True}
    assert not header_equals(known, canonical_header({"config": BASE}))
    # the writer takes only known markers from a route
    adapter = MockModelAdapter(
        routes={"default": MockRoute(defaults={"maxTokens": 4096, "temperature": 0.5})}
    )
    route = adapter.prepare_call(RequestContext(1, 1, 1))
    assert header_of(route, [])["adapterDefaults"] == {"maxTokens": True}


def test_H1_tool_schemas_compare_by_their_json_text() -> None:
    """Item 11: tools compare by ``JSON.stringify``: key order matters, ``1`` equals
    ``1.0``; our canonical JSON sorted keys and printed ``1.0``."""
    a = {"name": "t", "description": "d", "parameters": {"type": "object", "max": 1}}
    reordered = {"name": "t", "description": "d", "parameters": {"max": 1, "type": "object"}}
    as_float = {"name": "t", "description": "d", "parameters": {"type": "object", "max": 1.0}}
    ha, hr, hf = ({"config": BASE, "tools": [t]} for t in (a, reordered, as_float))
    assert not header_equals(ha, hr)
    assert header_equals(ha, hf)
    assert js_json(as_float["parameters"]) == '{"type":"object","max":1}'
    assert (
        js_json({"x": 1e21, "y": 1e-7, "z": 0.5, "s": "é\n"})
        == '{"x":1e+21,"y":1e-7,"z":0.5,"s":"é\\n"}'
    )


# ---------------------------------------------------------------- H-2, H-3 (items 7, 8)


def test_H3_tool_update_source_kind_is_tool_registry() -> None:
    """Item 7: the developer message announcing tool changes has ``source.kind``
    ``tool-registry``; we wrote ``tool-update``."""
    h = Harness()
    h.agent.add_tool(spec("read"), lambda a, c: "ok")
    h.turn(Say("one"))
    h.agent.add_tool(spec("grep"), lambda a, c: "ok")
    h.turn(Say("two"))
    (dev,) = h.events("developer/message")
    assert dev.data["message"]["source"] == {"kind": "tool-registry"}


def test_H2_initial_header_carries_starts_series() -> None:
    """Item 8: a request that starts a series marks ``startsSeries: true`` on its
    ``initial`` (or ``resume``) header too; we never wrote it on ``initial``."""
    agent = Agent()
    session = agent.new_session()
    route = MockModelAdapter().prepare_call(RequestContext(1, 1, 1))
    commit = commit_into(session)
    commit(
        EventDraft(
            "user/message",
            {
                "id": "u",
                "role": "user",
                "source": {"kind": "user"},
                "content": [{"type": "text", "text": "hi"}],
            },
            surface_op="append",
        )
    )
    build_request(
        session,
        RequestState.from_session(session),
        route,
        [],
        commit=commit,
        new_id=lambda k: f"{k}-1",
        starts_series=True,
        turn=1,
        step=1,
        attempt=1,
        stream="s",
    )
    (header,) = [e for e in session.log if e.type == "request/header"]
    assert header.data == {
        "header": header.data["header"],
        "reason": "initial",
        "startsSeries": True,
    }


def test_H2_resume_after_a_rewrite_since_the_loop_started_starts_a_series() -> None:
    """Item 8: the series baseline is the surface generation when the loop was created; a
    rewrite before the first request marks the ``resume`` header."""
    h = Harness()
    h.turn(Say("one"))
    h.turn(Say("two"))
    loop = StepLoop(h.agent, h.session, h.adapter)
    nodes = list(h.session.surface.state.nodes)[1:]
    loop.commit(
        EventDraft(
            "user/message",
            {
                "id": "sum",
                "role": "user",
                "source": {"kind": "compaction"},
                "content": [{"type": "text", "text": "summary"}],
            },
            surface_op={"op": "replace", "startSeq": nodes[0], "endSeq": nodes[-1]},
            source_event_seqs=nodes,
        )
    )
    h.adapter.push(Say("three"))
    loop.run_turn("again")
    last = h.events("request/header")[-1]
    assert last.data["reason"] == "resume" and last.data.get("startsSeries") is True


def test_H2_model_switch_is_a_change_without_a_new_series() -> None:
    """Item 8: a model switch logs a ``change`` header but starts no series; we started one
    (``startsSeries: true`` and a consolidated system prompt)."""
    h = Harness()
    h.turn(Say("one"))
    h.turn(Say("two", route="other"))
    header = h.events("request/header")[-1]
    assert header.data["reason"] == "change" and "startsSeries" not in header.data
    assert not h.adapter.requests[-1].starts_series


def test_H2_tool_change_on_an_incapable_route_starts_no_series() -> None:
    """Item 8: a tool-name change on a route without tool updates consolidates the system
    prompt (nothing to rewrite here) but the ``change`` header starts no series; we marked
    one."""
    h = Harness()
    h.turn(Say("one", route="incapable"))
    h.agent.add_tool(spec("read"), lambda a, c: "ok")
    h.turn(Say("two", route="incapable"))
    header = h.events("request/header")[-1]
    assert header.data["reason"] == "change" and "startsSeries" not in header.data
    assert len(h.events("developer/message")) == 1
    assert request_mismatches(h.adapter.requests, list(h.session.log)) == []


def test_H2_compaction_still_starts_a_series() -> None:
    h = Harness()
    h.turn(Say("one"))
    h.turn(Say("two"))
    h.turn(Overflow(), Say("three"))
    assert h.events("request/header")[-1].data["reason"] == "series"
    assert h.adapter.requests[-1].starts_series


# ---------------------------------------------------------------- H-5 (item 12)


def header_event(seq: int, tools: list[dict[str, Any]], reason: str = "initial") -> Event:
    return make_event(
        "request/header", seq, {"header": {"config": BASE, "tools": tools}, "reason": reason}
    )


def developer(seq: int, blocks: list[dict[str, Any]], header_seq: int | None = None) -> Event:
    data: dict[str, Any] = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": f"dev-{seq}",
            "role": "developer",
            "content": blocks,
            "source": {"kind": "tool-registry"},
        },
    }
    if header_seq is not None:
        data["headerSeq"] = header_seq
    return make_event("developer/message", seq, data, surface_op="append")


def test_H5_developer_message_without_tool_blocks_is_an_empty_update() -> None:
    """Item 12: every developer message adds an update to the tool history, one without
    tool blocks an empty one; we skipped it."""
    read = {"name": "read", "description": "r", "parameters": {}}
    grep = {"name": "grep", "description": "g", "parameters": {}}
    events = [
        header_event(0, [read]),
        developer(1, [{"type": "text", "text": "note"}]),
        header_event(2, [grep, read], "change"),
        developer(3, [{"type": "tool-addition", "toolName": "grep"}], 2),
    ]
    history = tool_history(events)
    assert history["tools"] == [read]
    assert history["updates"] == [
        {"messageId": "dev-1", "additions": []},
        {"messageId": "dev-3", "additions": [grep]},
    ]


def test_H5_tool_history_snapshot_rules() -> None:
    read = {"name": "read", "description": "r", "parameters": {}}
    grep = {"name": "grep", "description": "g", "parameters": {}}
    # a header changing tools without an update (old logs): the active tools, no updates
    assert tool_history([header_event(0, [read]), header_event(1, [read, grep], "change")]) == {
        "tools": [read, grep],
        "updates": [],
    }
    # a redeclared name (different JSON text) starts a new series
    changed = {"name": "read", "description": "r2", "parameters": {}}
    history = tool_history([header_event(0, [read]), header_event(1, [changed], "change")])
    assert history == {"tools": [changed], "updates": []}
    with pytest.raises(ToolHistoryError):
        tool_history(
            [
                header_event(0, [read]),
                developer(1, [{"type": "tool-addition", "toolName": "grep"}], 0),
            ]
        )


# ---------------------------------------------------------------- F-1 (item 13)


def test_F1_runtime_context_follows_the_admitted_user_messages() -> None:
    """Item 13: in a step the runtime appends the runtime-context message after the
    admitted user messages; we put it first."""
    h = Harness(context="cwd: /work")
    events = h.turn(Say("ok"), text="question")
    users = [e.data for e in events if e.type == "user/message"]
    assert [u["source"]["kind"] for u in users] == ["user", "runtime-context"]


def test_F3_logs_are_runtime_shaped() -> None:
    """The step loop writes what the runtime writes: v4 tool results, raw argument text,
    embedded streams, structured turn/end reasons."""
    h = Harness()
    h.agent.add_tool(spec("read"), lambda a, c: f"read {a['path']}")
    h.turn(Say("", [ToolCall("read", {"path": "a.py"}, id="c1")]), Say("done"))
    call = h.events("tool/call")[0].data
    result = h.events("tool/result")[0].data
    assert call["arguments"] == '{"path":"a.py"}'
    assert result["message"]["content"] == [{"type": "text", "text": "read a.py"}]
    assert result["message"]["source"] == {"kind": "tool", "callId": "c1"}
    message = h.events("assistant/message")[0].data
    block = message["message"]["content"][0]
    assert block == {
        "type": "tool-call",
        "id": "c1",
        "name": "read",
        "arguments": '{"path":"a.py"}',
    }
    kinds = [r["type"] for r in message["stream"]]
    assert kinds == ["chunk", "tool-call-chunks", "chunk", "chunk", "chunk"]
    assert h.events("turn/end")[0].data["reason"] == {"kind": "completed"}


# ---------------------------------------------------------------- issue 36


def test_H4_request_context_records_consolidate_initial_and_resume() -> None:
    """Issue 36 item 1: the runtime's buildRequest writes ``preparedCall.systemPromptUpdate``
    as is (agent-loop/src/agent.ts, ``requestContext``), so a consolidating route records
    ``"consolidate"`` on the initial header's context and again after a resume; we left the
    field out."""
    adapter = MockModelAdapter(routes={"default": MockRoute(in_history_system_prompt=False)})
    agent = Agent()
    agent.prompt.add_section(Section("main", 0, "You are careful."))
    session = agent.new_session()
    adapter.push(Say("one"))
    StepLoop(agent, session, adapter).run_turn("go")
    (initial,) = [e.data for e in session.log if e.type == "request/context"]
    assert initial["systemPromptUpdate"] == "consolidate"
    # a route declaring no mode leaves the field out (and that is a change: logged)
    quiet = MockModelAdapter(routes={"default": MockRoute(system_prompt_update=None)})
    quiet.push(Say("two"))
    StepLoop(agent, session, quiet).run_turn("again")
    contexts = [e.data for e in session.log if e.type == "request/context"]
    assert "systemPromptUpdate" not in contexts[-1] and len(contexts) == 2
    adapter.push(Say("three"))
    StepLoop(agent, session, adapter).run_turn("resumed")  # resume: the field comes back
    headers = [e.data["reason"] for e in session.log if e.type == "request/header"]
    assert headers[-1] == "resume"
    assert [e.data for e in session.log if e.type == "request/context"][-1] == initial
