"""Rule H-2..H-4 (request header, tool updates, request context) and F-2 (frozen request)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from processor.agent.adapters import RequestContext
from processor.agent.adapters.mock import Fail, MockModelAdapter, MockRoute, Overflow, Say
from processor.agent.context import EventDraft
from processor.agent.loop import Agent, CompactionPlugin, StepLoop
from processor.agent.prompt import Section, ToolSpec
from processor.agent.request import (
    Request,
    RequestState,
    build_request,
    header_of,
    request_mismatches,
)
from processor.core.events import Event, make_event
from processor.core.session import Session

ROUTES = {
    "default": MockRoute(),
    "wide": MockRoute(context_window=1_000_000),
    "other": MockRoute(model="mock-2"),
    "incapable": MockRoute(in_history_system_prompt=False, tool_updates=False),
}


def spec(name: str, description: str = "") -> ToolSpec:
    return ToolSpec(name, description or f"the {name} tool", {"type": "object"})


class Harness:
    def __init__(self, prompt: str = "You are careful.") -> None:
        self.prompt = prompt
        self.agent = Agent()
        self.agent.prompt.add_section(Section("main", 0, lambda _c: self.prompt))
        self.session = self.agent.new_session()
        self.adapter = MockModelAdapter(routes=ROUTES)
        self.loop = self.new_loop()

    def new_loop(self, **kw: Any) -> StepLoop:
        self.loop = StepLoop(self.agent, self.session, self.adapter, **kw)
        return self.loop

    def turn(self, *items: Any) -> list[Event]:
        self.adapter.push(*items)
        return list(self.loop.run_turn("go").events)

    def events(self, etype: str) -> list[Event]:
        return [e for e in self.session.log if e.type == etype]


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


# ---------------------------------------------------------------- H-2


def test_H2_initial_header_on_the_first_request() -> None:
    h = Harness()
    h.turn(Say("hi"))
    (header,) = h.events("request/header")
    assert header.data["reason"] == "initial"
    assert "startsSeries" not in header.data
    assert "system" not in header.data["header"]


def test_H2_unchanged_header_is_not_logged_again() -> None:
    h = Harness()
    h.turn(Say("one"))
    h.turn(Say("two"))
    assert len(h.events("request/header")) == 1
    assert h.adapter.requests[1].header_seq == h.events("request/header")[0].seq


def test_H2_resume_when_a_new_loop_continues_a_logged_session() -> None:
    h = Harness()
    h.turn(Say("one"))
    h.new_loop()
    h.turn(Say("two"))
    assert [e.data["reason"] for e in h.events("request/header")] == ["initial", "resume"]


def test_H2_change_on_a_header_change() -> None:
    h = Harness()
    h.turn(Say("one"))
    h.agent.config["temperature"] = 0.2
    h.turn(Say("two"))
    assert [e.data["reason"] for e in h.events("request/header")] == ["initial", "change"]
    assert h.adapter.requests[-1].header["config"]["temperature"] == 0.2


def test_H2_series_on_a_new_series_with_an_unchanged_header() -> None:
    h = Harness()
    h.new_loop(plugins=[CompactionPlugin(keep_last=1)])
    h.turn(Say("one"))
    h.turn(Say("two"))
    h.turn(Overflow(), Say("three"))  # compaction rewrites the surface -> new series
    reasons = [e.data["reason"] for e in h.events("request/header")]
    assert reasons == ["initial", "series"]
    assert h.adapter.requests[-1].starts_series


def test_H2_prompt_change_on_a_capable_route_needs_no_header() -> None:
    h = Harness()
    h.turn(Say("one"))
    h.prompt = "You are very careful."
    h.turn(Say("two"))
    assert len(h.events("request/header")) == 1
    # ... but on an incapable route the head is rewritten: a new series, logged
    h.prompt = "You are extremely careful."
    h.turn(Say("three", route="incapable"))
    assert [e.data["reason"] for e in h.events("request/header")] == ["initial", "series"]


# ---------------------------------------------------------------- H-3


def test_H3_tool_addition_and_removal_developer_messages() -> None:
    h = Harness()
    h.agent.add_tool(spec("read"), lambda a, c: "ok")
    h.turn(Say("one"))
    grep = h.agent.add_tool(spec("grep"), lambda a, c: "ok")
    h.turn(Say("two"))
    grep.remove()
    h.turn(Say("three"))
    headers = h.events("request/header")
    devs = h.events("developer/message")
    assert len(devs) == 2  # the initial header is the baseline: no update for "read"
    added, removed = devs
    assert added.data["message"]["content"] == [{"type": "tool-addition", "toolName": "grep"}]
    assert added.data["headerSeq"] == headers[1].seq
    assert removed.data["message"]["content"] == [{"type": "tool-removal", "toolName": "grep"}]
    assert "headerSeq" not in removed.data
    # additions never inline the schema; the header declares it
    assert all("tool" not in b for b in added.data["message"]["content"])
    assert [t["name"] for t in headers[1].data["header"]["tools"]] == ["grep", "read"]
    view = h.adapter.requests[1].tool_history
    assert [[t["name"] for t in u["additions"]] for u in view["updates"]] == [["grep"]]
    assert view["updates"][0]["messageId"] == added.data["message"]["id"]


def test_H3_changed_definition_with_the_same_names_has_no_update() -> None:
    h = Harness()
    reg = h.agent.add_tool(spec("read", "v1"), lambda a, c: "ok")
    h.turn(Say("one"))
    reg.remove()
    h.agent.add_tool(spec("read", "v2"), lambda a, c: "ok")
    h.turn(Say("two"))
    assert [e.data["reason"] for e in h.events("request/header")] == ["initial", "change"]
    assert h.events("developer/message") == []


# ---------------------------------------------------------------- H-4


def test_H4_request_context_only_when_it_changed() -> None:
    h = Harness()
    h.turn(Say("one"))
    h.turn(Say("two"))
    assert len(h.events("request/context")) == 1
    h.turn(Say("three", route="wide"))  # contextWindow changed
    h.turn(Say("four", route="wide"))
    h.turn(Say("five", route="incapable"))  # systemPromptUpdate changed
    contexts = [e.data for e in h.events("request/context")]
    assert [c.get("contextWindow") for c in contexts] == [200_000, 1_000_000, 200_000]
    assert [c.get("systemPromptUpdate") for c in contexts] == [
        "in-history",
        "in-history",
        "consolidate",
    ]
    h.new_loop()  # a resumed loop compares with the log, not with nothing
    h.turn(Say("six", route="incapable"))
    assert len(h.events("request/context")) == 3


# ---------------------------------------------------------------- F-2


def built_request() -> tuple[Session, Request]:
    agent = Agent()
    agent.prompt.add_section(Section("main", 0, "hello"))
    agent.add_tool(spec("read"), lambda a, c: "ok")
    session = agent.new_session()
    adapter = MockModelAdapter()
    route = adapter.prepare_call(RequestContext(1, 1, 1))

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

    commit(
        EventDraft(
            "user/message",
            {
                "id": "u1",
                "role": "user",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "user"},
            },
            surface_op="append",
        )
    )
    tools = [dict(t) for t in agent.assemble().tools]
    request = build_request(
        session,
        RequestState.from_session(session),
        route,
        tools,
        commit=commit,
        new_id=lambda k: f"{k}-x",
        starts_series=False,
        turn=1,
        step=1,
        attempt=1,
        stream="s",
    )
    return session, request


def test_F2_request_is_frozen_end_to_end() -> None:
    _, request = built_request()
    with pytest.raises(TypeError):
        request.messages.append({"id": "evil", "role": "user", "content": []})
    with pytest.raises(TypeError):
        request.messages[0]["content"].append({"type": "text", "text": "evil"})
    with pytest.raises(TypeError):
        request.header["config"]["model"] = "other"
    with pytest.raises(TypeError):
        request.header["tools"][0]["parameters"]["x"] = 1
    with pytest.raises(TypeError):
        request.tool_history["updates"].append({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.messages = []  # type: ignore[misc]
    request.cancel.cancel()  # the one live part
    assert request.cancel.cancelled


def test_F2_request_messages_keep_identity_and_do_not_follow_the_log() -> None:
    session, request = built_request()
    live = session.derive_messages()
    assert all(a is b for a, b in zip(request.messages, live, strict=True))
    session.append(
        make_event(
            "user/message",
            session.next_seq,
            {"id": "u2", "role": "user", "content": [], "source": {"kind": "user"}},
            surface_op="append",
        )
    )
    assert len(request.messages) == 1 and len(session.derive_messages()) == 2


def test_F2_header_of_is_canonical() -> None:
    adapter = MockModelAdapter(routes={"default": MockRoute(defaults={})})
    route = adapter.prepare_call(RequestContext(1, 1, 1))
    assert header_of(route, []) == {"config": {"provider": "mock", "model": "mock-1"}}


def test_requests_match_the_log_after_retries_and_route_switches() -> None:
    h = Harness()
    h.agent.add_tool(spec("read"), lambda a, c: "ok")
    h.turn(Fail(), Say("one", route="other"))
    h.turn(Say("two", route="incapable"))
    assert request_mismatches(h.adapter.requests, list(h.session.log)) == []


def test_D4_a_persisted_header_with_tools_of_any_shape_names_only_its_named_tools() -> None:
    # the fold loads such a header (as the runtime does); the agent resuming on
    # it diffs names without failing
    from processor.agent.request import tool_names

    config = {"provider": "p", "model": "m"}
    tools: object
    for tools in ("x", {"read": {}}, [1, {"description": "no name"}, {"name": 3}]):
        assert tool_names({"config": config, "tools": tools}) == []
    assert tool_names({"config": config, "tools": [{"name": "read"}, "x"]}) == ["read"]
    assert tool_names(None) == []
