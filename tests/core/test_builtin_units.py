"""The built-in units (docs/session-semantics.md §6) and rules H-1 and H-5 (§9)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from processor.core.builder import LogBuilder, tool_def
from processor.core.builtin import BUILTIN_UNITS, default_registry, register_builtins
from processor.core.builtin.inbox import INBOX
from processor.core.builtin.request_header import REQUEST_HEADER
from processor.core.builtin.session_stats import SESSION_STATS
from processor.core.builtin.tool_history import TOOL_HISTORY
from processor.core.builtin.turn_boundary import TURN_BOUNDARY
from processor.core.errors import ProjectionError
from processor.core.events import Event, make_event
from processor.core.frozen import thaw
from processor.core.header import canonical_header, header_equals
from processor.core.projections import (
    ProjectionDefinition,
    ProjectionRegistry,
    restore,
    restore_floor,
)
from processor.core.session import Session

HEADER: dict[str, Any] = {}


def fold(definition: ProjectionDefinition, events: list[Event]) -> Any:
    state = definition.init(HEADER, 0)
    for event in events:
        state = definition.apply(state, event)
    definition.validate_state(state)
    return state


def view(definition: ProjectionDefinition, events: list[Event]) -> Any:
    assert definition.wire is not None
    out = definition.wire.view(fold(definition, events))
    definition.wire.validate_view(out)
    return out


def session(b: LogBuilder) -> Session:
    """Fold through the real session (surface planner and data checks D-1..D-6)."""
    return Session.fold(b.events, projections=default_registry())


# ------------------------------------------------------------------ the set


def test_builtin_units_have_valid_init_states() -> None:
    assert [u.key for u in BUILTIN_UNITS] == [
        "turnBoundary",
        "toolHistory",
        "requestHeader",
        "sessionStats",
        "inbox",
        "title",
        "titleInput",
        "todos",
        "plan",
        "goal",
        "tokenUsage",
    ]
    for unit in BUILTIN_UNITS:
        assert (unit.wire is None) == (unit.key == "titleInput")
        state = unit.init(HEADER, 0)
        unit.validate_state(state)
        if unit.wire is not None:
            unit.wire.validate_view(unit.wire.view(state))
        orjson.dumps(state)  # plain JSON


def test_register_builtins_returns_releasable_registrations() -> None:
    registry = ProjectionRegistry()
    first = register_builtins(registry)
    second = register_builtins(registry)  # P-2: same versions add references
    assert all(registry.refs(u.key) == 2 for u in BUILTIN_UNITS)
    for reg in first + second:
        reg.release()
    assert registry.definitions() == []


def test_builtin_units_keep_identity_for_irrelevant_events() -> None:
    """P-1 for every built-in: an event it does not read returns the same object."""
    noise = [
        make_event("request/context", 0, {"provider": "p", "model": "m"}),
        make_event("llm/retry-started", 1, {}),
        make_event("session/end-seed", 2, {}),
    ]
    for unit in BUILTIN_UNITS:
        state = unit.init(HEADER, 0)
        for event in noise:
            assert unit.apply(state, event) is state, unit.key


def test_builtin_states_restore_through_json_checkpoints() -> None:
    b = LogBuilder()
    b.system("s")
    h = b.header([tool_def("read")])
    b.turn_start()
    b.step_start()
    b.user("hi")
    b.assistant("yo", usage={"inputTokens": 3})
    b.header([tool_def("read"), tool_def("grep")], reason="change")
    b.tool_update(h.seq + 5, added=["grep"])
    b.add_raw(
        "agent/inbox/spliced",
        {
            "target": "next-step",
            "start": 0,
            "inserted": [{"id": "in-1", "role": "user", "content": [], "source": {"kind": "user"}}],
        },
    )
    b.step_end()
    b.turn_end()
    registry = default_registry()
    events = b.events
    for k in range(len(events) + 1):
        cp = orjson.loads(
            orjson.dumps(Session.fold(events[:k], projections=registry).projections.checkpoint())
        )
        floor = restore_floor(registry, cp)
        assert floor is not None
        result = restore(registry, HEADER, cp, events[floor:], floor)
        assert result.snapshot == Session.fold(events, projections=registry).projections.snapshot()


# ------------------------------------------------------------------ turnBoundary


def test_turn_boundary_tracks_open_turn_and_last_step_boundary() -> None:
    b = LogBuilder()
    ts = b.turn_start()
    s1 = b.step_start()
    assert view(TURN_BOUNDARY, b.events) == {
        "openTurnStartSeq": ts.seq,
        "lastStepStartSeq": s1.seq,
        "lastStepBoundary": {"kind": "start", "seq": s1.seq, "turn": 1, "step": 1},
        "lastTurn": 1,
    }
    e1 = b.step_end()
    b.turn_end()
    assert view(TURN_BOUNDARY, b.events) == {
        "openTurnStartSeq": None,
        "lastStepStartSeq": s1.seq,
        "lastStepBoundary": {"kind": "end", "seq": e1.seq, "turn": 1, "step": 1},
        "lastTurn": 1,
    }


def test_turn_boundary_turn_end_without_open_turn_keeps_identity() -> None:
    state = TURN_BOUNDARY.init(HEADER, 0)
    assert (
        TURN_BOUNDARY.apply(state, make_event("turn/end", 0, {"turn": 1, "reason": "x"})) is state
    )


def test_turn_boundary_validator_rejects_bad_rows() -> None:
    for bad in (
        {},
        {
            "openTurnStartSeq": "x",
            "lastStepStartSeq": None,
            "lastStepBoundary": None,
            "lastTurn": None,
        },
        {
            "openTurnStartSeq": None,
            "lastStepStartSeq": None,
            "lastStepBoundary": {"kind": "middle", "seq": 1},
            "lastTurn": None,
        },
    ):
        with pytest.raises(ValueError):
            TURN_BOUNDARY.validate_state(bad)


# ------------------------------------------------------------------ requestHeader


def test_request_header_is_the_canonical_last_header() -> None:
    b = LogBuilder()
    assert view(REQUEST_HEADER, b.events) is None
    b.header([tool_def("read")])
    h = b.add_raw(
        "request/header",
        {
            "header": {"config": {"model": "m"}, "adapterDefaults": {"cache": False}},
            "reason": "change",
        },
    )
    assert view(REQUEST_HEADER, b.events) == {
        "seq": h.seq,
        "reason": "change",
        "header": {"config": {"model": "m"}},
    }


# ------------------------------------------------------------------ sessionStats


def test_session_stats_counts_events_and_sums_usage() -> None:
    b = LogBuilder()
    b.system("s")
    b.turn_start()
    b.step_start()
    b.user("u")
    b.attempt()
    b.add_raw("llm/retry", {})
    call = b.tool_call("c1", "read", {})
    b.assistant("a", usage={"inputTokens": 10, "outputTokens": 3})
    b.add_raw(
        "assistant/message",
        {
            "turn": 1,
            "step": 1,
            "stream": [],
            "usage": {"inputTokens": 5, "cost": 0.5, "cached": True, "detail": {"x": 1}},
            "message": {
                "id": "a-x",
                "role": "assistant",
                "content": [],
                "source": {"kind": "model", "provider": "p", "model": "m"},
            },
        },
        surfaceOp="append",
    )
    bad = b.tool_result("c1", "boom", call_seq=call.seq, error={"name": "read", "code": "E"})
    b.tool_result("c1", "short", like=bad, replace=(bad.seq, bad.seq))  # S-5 rewrite
    stats = session(b).projections.view_of("sessionStats")
    assert stats == {
        "turns": 1,
        "steps": 1,
        "toolCalls": 1,
        "toolErrors": 1,
        "attempts": 1,
        "retries": 1,
        "replacements": 1,
        "messages": {"system": 1, "user": 1, "assistant": 2, "tool": 1},
        "usage": {"inputTokens": 15, "outputTokens": 3, "cost": 0.5},
    }


def test_session_stats_rejects_malformed_rows() -> None:
    good = thaw(SESSION_STATS.init(HEADER, 0))
    SESSION_STATS.validate_state(good)
    for bad in ({**good, "turns": -1}, {**good, "usage": {"x": "1"}}, {"turns": 0}):
        with pytest.raises(ValueError):
            SESSION_STATS.validate_state(bad)


# ------------------------------------------------------------------ inbox


def splice(
    seq: int, *ids: str, target: str = "next-turn", start: int = 0, removed: int = 0
) -> Event:
    data: dict[str, Any] = {
        "target": target,
        "start": start,
        "inserted": [
            {"id": i, "role": "user", "content": [], "source": {"kind": "user"}} for i in ids
        ],
    }
    if removed:
        data["removedCount"] = removed
    return make_event("agent/inbox/spliced", seq, data)


def ids(state: Any, target: str) -> list[str]:
    return [m["id"] for m in state[target]]


def test_inbox_folds_the_runtime_splices_into_two_queues() -> None:
    events = [
        splice(0, "a", "b"),
        splice(1, "c", target="next-step"),
        make_event("turn/start", 2, {"turn": 1}),
        splice(3, start=0, removed=1),  # the turn claims "a"
        splice(4, "z", start=1),
    ]  # "z" after "b"
    state = view(INBOX, events)
    assert (ids(state, "next-turn"), ids(state, "next-step")) == (["b", "z"], ["c"])


def test_P1_inbox_keeps_its_state_for_malformed_or_empty_splices() -> None:
    state = fold(INBOX, [splice(0, "a")])
    for event in (
        make_event("agent/inbox/spliced", 1, {"target": "later", "start": 0, "inserted": []}),
        make_event("agent/inbox/spliced", 1, {"target": "next-turn"}),
        make_event("agent/inbox/spliced", 1, ["not", "an", "object"]),
        splice(1, start=0, removed=2),  # removes past the queue's end
        splice(1, "x", start=5),
        splice(1, start=1),  # changes nothing
        make_event("turn/start", 1, {"turn": 1}),
    ):
        assert INBOX.apply(state, event) is state


def test_inbox_through_a_session() -> None:
    b = LogBuilder()
    b.add(splice(0, "in-1", target="next-step").to_json())
    s = session(b)
    assert ids(s.projections.state_of("inbox"), "next-step") == ["in-1"]
    s.append(splice(s.next_seq, start=0, removed=1, target="next-step"))
    assert s.projections.view_of("inbox") == {"next-turn": [], "next-step": []}


# ------------------------------------------------------------------ H-1


def test_H1_canonical_header_keeps_known_true_markers_and_non_empty_tools() -> None:
    assert canonical_header(
        {"config": {"model": "m"}, "adapterDefaults": {"a": False}, "tools": []}
    ) == {"config": {"model": "m"}}
    # kept as given once a known marker is true; an unknown marker never keeps it
    assert canonical_header(
        {
            "config": {},
            "adapterDefaults": {"maxTokens": True, "b": False},
            "tools": [tool_def("x")],
            "extra": 1,
        }
    ) == {
        "config": {},
        "adapterDefaults": {"maxTokens": True, "b": False},
        "tools": [tool_def("x")],
    }
    assert "adapterDefaults" not in canonical_header({"config": {}, "adapterDefaults": {"a": True}})
    raw = {"config": {"model": "m"}, "tools": [tool_def("x")]}
    canonical_header(raw)
    assert raw == {"config": {"model": "m"}, "tools": [tool_def("x")]}  # input untouched


def test_H1_header_equals_compares_config_field_by_field() -> None:
    a = {
        "config": {
            "provider": "p",
            "model": "m",
            "reasoningEffort": "low",
            "temperature": 0.5,
            "maxTokens": 100,
            "stop": ["x", "y"],
        }
    }
    assert header_equals(a, {"config": dict(reversed(list(a["config"].items())))})
    for field, value in (
        ("provider", "q"),
        ("model", "n"),
        ("reasoningEffort", "high"),
        ("temperature", 0.7),
        ("maxTokens", 200),
    ):
        assert not header_equals(a, {"config": {**a["config"], field: value}}), field
    assert not header_equals({"config": {"maxTokens": 1}}, {"config": {"maxTokens": True}})
    assert header_equals({"config": {"maxTokens": 1}}, {"config": {"maxTokens": 1.0}})
    assert header_equals({"config": {"model": "m", "other": 1}}, {"config": {"model": "m"}})
    # JavaScript ===: null is not undefined
    assert not header_equals({"config": {"temperature": None}}, {"config": {}})


def test_H1_header_equals_stop_element_wise_and_empty_is_not_absent() -> None:
    base = {"config": {"stop": ["x", "y"]}}
    assert not header_equals(base, {"config": {"stop": ["y", "x"]}})
    assert not header_equals(base, {"config": {"stop": ["x"]}})
    assert not header_equals(base, {"config": {"stop": ["x", "y", "z"]}})
    assert not header_equals({"config": {}}, {"config": {"stop": []}})
    assert header_equals({"config": {"stop": []}}, {"config": {"stop": []}})


def test_H1_header_equals_flags_and_tools_in_order_by_their_json_text() -> None:
    a: dict[str, Any] = {"config": {"model": "m"}, "tools": [tool_def("a"), tool_def("b")]}
    assert header_equals(a, {**a, "adapterDefaults": {"maxTokens": False, "f": True}})
    assert not header_equals(a, {**a, "adapterDefaults": {"maxTokens": True}})
    assert not header_equals(a, {**a, "tools": [tool_def("b"), tool_def("a")]})
    assert not header_equals(a, {**a, "tools": [tool_def("a")]})
    reordered = [dict(reversed(list(t.items()))) for t in a["tools"]]
    assert not header_equals(a, {**a, "tools": reordered})  # key order is part of the prefix
    assert not header_equals(a, {**a, "tools": [tool_def("a", "other"), tool_def("b")]})
    one = {"config": {}, "tools": [{"name": "t", "inputSchema": {"maximum": 1}}]}
    assert header_equals(
        one, {"config": {}, "tools": [{"name": "t", "inputSchema": {"maximum": 1.0}}]}
    )


# ------------------------------------------------------------------ H-5


def history(b: LogBuilder) -> Any:
    return session(b).projections.view_of("toolHistory")


def test_H5_additions_resolve_from_their_header_and_removal_keeps_declaration() -> None:
    b = LogBuilder()
    b.system("s")
    h0 = b.header([tool_def("read")])
    h1 = b.header([tool_def("read"), tool_def("grep")], reason="change")
    d1 = b.tool_update(h1.seq, added=["grep"])
    h2 = b.header([tool_def("grep")], reason="change")
    d2 = b.tool_update(h2.seq, removed=["read"])
    s = session(b)
    assert s.projections.view_of("toolHistory") == {
        "baselineSeq": h0.seq,
        "tools": [tool_def("read")],
        "updates": [
            {
                "seq": d1.seq,
                "messageId": d1.data["message"]["id"],
                "added": [tool_def("grep")],
                "removed": [],
            },
            {
                "seq": d2.seq,
                "messageId": d2.data["message"]["id"],
                "added": [],
                "removed": ["read"],
            },
        ],
    }
    state = s.projections.state_of("toolHistory")
    assert state["declared"]["read"] == tool_def("read")  # removal never erases it
    assert state["available"] == ["grep"]


def test_H5_developer_message_without_tool_blocks_is_an_empty_update() -> None:
    """The runtime appends an update for every developer message (issue 17 item 12)."""
    b = LogBuilder()
    b.system("s")
    h0 = b.header([tool_def("read")])
    dev = b.add_raw(
        "developer/message",
        {
            "turn": 0,
            "step": 0,
            "message": {
                "id": "note-1",
                "role": "developer",
                "source": {"kind": "plugin"},
                "content": [{"type": "text", "text": "heads up"}],
            },
        },
        surfaceOp="append",
    )
    assert history(b) == {
        "baselineSeq": h0.seq,
        "tools": [tool_def("read")],
        "updates": [{"seq": dev.seq, "messageId": "note-1", "added": [], "removed": []}],
    }


def test_H5_redeclaration_compares_the_json_text() -> None:
    """Key order makes a new definition (a new series); 1 and 1.0 do not."""

    def tool(schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": "t", "description": "d", "parameters": schema}

    b = LogBuilder()
    b.system("s")
    h0 = b.header([tool({"type": "object", "maxItems": 1})])
    b.header([tool({"type": "object", "maxItems": 1.0})], reason="change")
    assert history(b)["baselineSeq"] == h0.seq
    h2 = b.header([tool({"maxItems": 1, "type": "object"})], reason="change")
    assert history(b)["baselineSeq"] == h2.seq


def test_H5_missing_addition_in_its_header_is_an_error() -> None:
    """D-3 would refuse this on append; the unit must not trust that it ran."""
    h = make_event(
        "request/header",
        0,
        {"header": {"config": {}, "tools": [tool_def("read")]}, "reason": "initial"},
    )
    for header_seq, name in ((0, "grep"), (7, "read"), (None, "read")):
        dev = make_event(
            "developer/message",
            1,
            {
                "turn": 0,
                "step": 0,
                "headerSeq": header_seq,
                "message": {
                    "id": "d",
                    "role": "developer",
                    "content": [{"type": "tool-addition", "toolName": name}],
                },
            },
            surface_op="append",
        )
        with pytest.raises(ProjectionError) as err:
            fold(TOOL_HISTORY, [h, dev])
        assert err.value.rule == "H-5" and err.value.seq == 1


def test_H5_new_series_on_series_reason_starts_series_or_redefinition() -> None:
    for kwargs, tools in (
        ({"reason": "series"}, [tool_def("read")]),
        ({"reason": "change", "starts_series": True}, [tool_def("read")]),
        ({"reason": "change"}, [tool_def("read", "a new schema")]),
    ):
        b = LogBuilder()
        b.system("s")
        h0 = b.header([tool_def("read"), tool_def("grep")])
        b.tool_update(None, removed=["grep"])
        h = b.header(tools, **kwargs)
        got = history(b)
        assert got == {"baselineSeq": h.seq, "tools": tools, "updates": []}, kwargs
        assert h.seq != h0.seq


def test_H5_removed_tool_coming_back_redefined_starts_a_new_series() -> None:
    b = LogBuilder()
    b.system("s")
    b.header([tool_def("read"), tool_def("grep")])
    b.tool_update(None, removed=["grep"])
    b.header([tool_def("read")], reason="change")
    h = b.header([tool_def("read"), tool_def("grep", "v2")], reason="change")
    assert history(b)["baselineSeq"] == h.seq


def test_H5_plain_change_keeps_the_baseline_and_sets_active_tools() -> None:
    b = LogBuilder()
    b.system("s")
    h0 = b.header([tool_def("read")])
    h1 = b.header([tool_def("read")], reason="resume", model="other")
    s = session(b)
    state = s.projections.state_of("toolHistory")
    assert state["series"]["baselineSeq"] == h0.seq and state["activeSeq"] == h1.seq


def test_H5_old_logs_without_updates_fall_back_to_active_tools() -> None:
    b = LogBuilder()
    b.system("s")
    b.header([tool_def("read")])
    h1 = b.header([tool_def("read"), tool_def("grep")], reason="change")  # no developer update
    got = history(b)
    assert got["tools"] == [tool_def("read"), tool_def("grep")] and got["updates"] == []
    b.tool_update(h1.seq, added=["grep"])  # names agree again: back to the series view
    assert history(b)["tools"] == [tool_def("read")]
    assert [u["added"] for u in history(b)["updates"]] == [[tool_def("grep")]]


def test_H5_view_keeps_its_identity_when_nothing_visible_changed() -> None:
    """P-1 for toolHistory: a resume header with the same tools republishes nothing."""
    b = LogBuilder()
    b.system("s")
    b.header([tool_def("read")])
    s = session(b)
    before = s.projections.view_of("toolHistory")
    s.projections.drain_view_changes()
    s.append(
        make_event(
            "request/header",
            s.next_seq,
            {
                "header": {"config": {"provider": "p", "model": "x"}, "tools": [tool_def("read")]},
                "reason": "resume",
            },
        )
    )
    assert s.projections.view_of("toolHistory") is before
    assert "toolHistory" not in s.projections.drain_view_changes()
    # the same for the fallback view of an old log
    s.append(
        make_event(
            "request/header",
            s.next_seq,
            {
                "header": {
                    "config": {"provider": "p", "model": "x"},
                    "tools": [tool_def("read"), tool_def("grep")],
                },
                "reason": "change",
            },
        )
    )
    fallback = s.projections.view_of("toolHistory")
    s.append(
        make_event(
            "request/header",
            s.next_seq,
            {
                "header": {
                    "config": {"provider": "p", "model": "y"},
                    "tools": [tool_def("read"), tool_def("grep")],
                },
                "reason": "resume",
            },
        )
    )
    assert s.projections.view_of("toolHistory") is fallback


def test_H5_state_and_view_are_plain_json() -> None:
    b = LogBuilder()
    b.system("s")
    h = b.header([tool_def("read"), tool_def("grep")])
    b.tool_update(h.seq, removed=["grep"])
    s = session(b)
    state = s.projections.state_of("toolHistory")
    assert orjson.loads(orjson.dumps(state)) == thaw(state)
    TOOL_HISTORY.validate_state(orjson.loads(orjson.dumps(state)))
    with pytest.raises(ValueError):
        TOOL_HISTORY.validate_state({**thaw(state), "available": [1]})


def test_H_5_redefinition_judged_by_js_text_not_python_equality() -> None:
    """The orjson fast path of the redefinition test keeps JSON.stringify's answer."""
    from processor.core.builtin.tool_history import _same_tool
    from processor.core.frozen import freeze

    tool = freeze({"name": "t", "n": 1, "d": {"a": 1, "b": 2}})
    assert _same_tool(tool, freeze({"name": "t", "n": 1, "d": {"a": 1, "b": 2}}))
    assert _same_tool(tool, freeze({"name": "t", "n": 1.0, "d": {"a": 1, "b": 2}}))  # JS: 1
    assert not _same_tool(tool, freeze({"name": "t", "n": True, "d": {"a": 1, "b": 2}}))
    assert not _same_tool(tool, freeze({"name": "t", "n": 1, "d": {"b": 2, "a": 1}}))  # order
    assert not _same_tool(tool, freeze({"name": "t", "n": 2, "d": {"a": 1, "b": 2}}))
    assert _same_tool(freeze({"n": 2**70}), freeze({"n": 2**70}))  # beyond orjson: js_json
