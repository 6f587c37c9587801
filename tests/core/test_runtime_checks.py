"""The runtime's load checks, accept and refuse side (see docs/runtime-load-checks.md).

The invalid corpus (tests/corpus/invalid) holds one refused log per check; here
are the cases where our earlier rules refused what the runtime accepts, and the
dialect rules a file header selects.
"""

from __future__ import annotations

from typing import Any

import pytest

from processor.core.builder import LogBuilder, text
from processor.core.errors import SessionError
from processor.core.events import KNOWN_TYPES, LOG_ONLY_TYPES, parse_event
from processor.core.session import Session


def fold(events: list[Any], dialect: int | None = None) -> Session:
    return Session.fold(events, dialect=dialect)


def base(form: int = 4) -> LogBuilder:
    b = LogBuilder(form=form)
    b.system("s")
    b.turn_start()
    b.user("hi")
    return b


def test_E4_every_vocabulary_type_is_known_without_ignorable() -> None:
    assert len(KNOWN_TYPES) == 60 and "todo/write" in KNOWN_TYPES
    for etype in sorted(LOG_ONLY_TYPES - {"request/header", "assistant/attempt"}):
        b = base()
        b.add_raw(etype, {"any": "payload"})
        assert fold(b.events).next_seq == 4, etype


def test_E4_only_types_outside_the_vocabulary_need_ignorable() -> None:
    b = base()
    b.add_raw("vendor/thing", {})
    with pytest.raises(SessionError, match="E-4"):
        fold(b.events)


def test_D6_log_only_data_may_be_any_json_value() -> None:
    for data in (None, 3, "text", [1, 2], True):
        b = base()
        b.add_raw("todo/write", data)
        b.add_raw("turn/end", data)
        assert fold(b.events).next_seq == 5


def test_E2_ignorable_is_absent_or_true() -> None:
    for flag in (False, None, 1, "true"):
        with pytest.raises(SessionError, match="ignorable must be absent or true.*E-2"):
            parse_event({"type": "x/y", "seq": 0, "time": 0, "data": {}, "ignorable": flag})
    assert (
        parse_event({"type": "x/y", "seq": 0, "time": 0, "data": {}, "ignorable": True}).ignorable
        is True
    )


def test_E2_seq_and_time_are_javascript_safe_integers() -> None:
    ok = parse_event({"type": "turn/start", "seq": 3.0, "time": -5, "data": {}})
    assert (ok.seq, type(ok.seq), ok.time) == (3, int, -5)  # a double that is an integer
    for seq in (2**53, -1, 1.5, -0.0, True):
        with pytest.raises(SessionError, match="E-2"):
            parse_event({"type": "turn/start", "seq": seq, "time": 0, "data": {}})
    for time in (2**53, -(2**53), 0.5):
        with pytest.raises(SessionError, match="E-2"):
            parse_event({"type": "turn/start", "seq": 0, "time": time, "data": {}})
    assert parse_event({"type": "turn/start", "seq": 2**53 - 1, "time": 0, "data": {}})


def test_D6_tool_result_in_either_released_form_without_a_header() -> None:
    for form in (3, 4):
        b = base(4)
        call = b.tool_call("c1", "read", "{}")
        b.tool_result("c1", "ok", call_seq=call.seq, form=form)
        assert fold(b.events).surface.nodes[-1] == 4


def test_D6_a_file_header_selects_one_form() -> None:
    for form, dialect, ok in ((4, 4, True), (3, 3, True), (3, 4, False), (4, 3, False)):
        b = base(dialect)
        call = b.tool_call("c1", "read", "{}")
        b.tool_result("c1", "ok", call_seq=call.seq, form=form)
        if ok:
            fold(b.events, dialect)
        else:
            with pytest.raises(SessionError, match="D-6"):
                fold(b.events, dialect)


def test_D6_v3_wrapper_must_hold_one_tool_result_block_answering_the_call() -> None:
    b = base()
    b.add_raw(
        "tool/result",
        {
            "turn": 1,
            "step": 0,
            "message": b.message(
                "user",
                [{"type": "tool-result", "toolCallId": "c2", "content": [text("x")]}],
                source={"kind": "tool", "callId": "c1"},
            ),
        },
        surfaceOp="append",
    )
    with pytest.raises(SessionError, match="toolCallId must equal source.callId.*D-6"):
        fold(b.events)


def test_D6_every_message_needs_a_source_kind() -> None:
    for source in (None, {}, {"kind": ""}, "user"):
        b = base()
        message = b.message("user", [text("x")])
        message["source"] = source
        b.add_raw("user/message", message, surfaceOp="append")
        with pytest.raises(SessionError, match="source must be an object.*D-6"):
            fold(b.events)


def test_D4_request_header_load_checks() -> None:
    cfg = {"provider": "p", "model": "m"}
    accepted = [
        {"header": {"config": cfg}, "reason": "initial"},
        {"header": {"config": cfg}, "reason": "series", "startsSeries": True},
        {
            "header": {
                "config": {**cfg, "maxTokens": 9, "reasoningEffort": "high"},
                "adapterDefaults": {"maxTokens": True, "reasoningEffort": True},
            },
            "reason": "change",
        },
    ]
    refused = [
        {"header": {"config": {"provider": "p"}}, "reason": "initial"},
        {"header": {"config": {**cfg, "provider": ""}}, "reason": "initial"},
        {"header": {"config": cfg}, "reason": "initial", "startsSeries": False},
        {"header": {"config": cfg, "adapterDefaults": {"maxTokens": True}}, "reason": "initial"},
        {
            "header": {
                "config": {**cfg, "temperature": 1},
                "adapterDefaults": {"temperature": True},
            },
            "reason": "initial",
        },
        {"header": {"config": {**cfg, "reasoningEffort": 3}}, "reason": "initial"},
    ]
    for data in accepted:
        b = base()
        b.add_raw("request/header", data)
        fold(b.events)
    for data in refused:
        b = base()
        b.add_raw("request/header", data)
        with pytest.raises(SessionError, match="D-4"):
            fold(b.events)


def test_D7_assistant_settlement_fields() -> None:
    b = base()
    b.add_raw("assistant/attempt", {"turn": 1, "step": 0, "stream": []})
    fold(b.events)
    for data in (
        {"turn": 1, "step": 0},
        {"turn": -1, "step": 0, "stream": []},
        {"turn": 1, "step": 2**53, "stream": []},
        [1],
    ):
        b = base()
        b.add_raw("assistant/attempt", data)
        with pytest.raises(SessionError, match="D-7"):
            fold(b.events)


def _plugin_system(b: LogBuilder, role: str) -> dict[str, Any]:
    message = b.message(role, [text("prompt")])
    message["source"] = {"kind": "plugin", "plugin": "@deepseek-ai/dsh-system-prompt"}
    return {"turn": 1, "step": 1, "message": message}


def test_D6_headerless_v3_system_message_role_is_not_checked() -> None:
    """Issue 36 item 4: the runtime's Session load path checks no system/message role
    (core/session/src/index.ts, assertMessageEventShape returns for it); only its v3 file
    reader (session-format-v2-to-v3/src/payload.ts, assertSystem) and the v4 rules do.  A
    header-less log's v3-form system message with another role is read; we refused it."""
    for role in ("user", "assistant", "tool"):
        b = LogBuilder(form=3)
        b.add_raw("system/message", _plugin_system(b, role), surfaceOp="append")
        b.user("hi")
        assert fold(b.events).next_seq == 2, role
    # D-1 still pairs the developer role with developer/message
    b = LogBuilder(form=3)
    b.add_raw("system/message", _plugin_system(b, "developer"), surfaceOp="append")
    with pytest.raises(SessionError, match="D-1"):
        fold(b.events)
    # a v3 file (its reader) and the v4 form keep the role check
    for dialect in (3, None):
        b = LogBuilder(form=3)
        data = _plugin_system(b, "user")
        if dialect is None:
            data["message"]["source"] = {"kind": "system-prompt"}
        b.add_raw("system/message", data, surfaceOp="append")
        with pytest.raises(SessionError, match="role must be 'system'.*D-6"):
            fold(b.events, dialect)


def test_D7_ignorable_attempt_is_opaque() -> None:
    """Issue 36 item 5: a known log-only type marked ``ignorable: true`` is read without
    its settlement fields (the runtime accepts ``assistant/attempt`` lacking turn, step and
    stream when it is ignorable); without the mark D-7 still refuses it."""
    for data in ({}, {"turn": -1}, None, [1]):
        b = base()
        b.add_raw("assistant/attempt", data, ignorable=True)
        assert fold(b.events).next_seq == 4
        b = base()
        b.add_raw("assistant/attempt", data)
        with pytest.raises(SessionError, match="D-7"):
            fold(b.events)


def test_S2_S3_integral_float_seqs_are_the_integers_the_runtime_reads() -> None:
    # JSON 0.0 is the seq 0 to the runtime (a double): replace and source seqs
    # load, and the event holds the integers, as the runtime would write them
    b = base(4)
    b.user("one")
    first = b.events[-1].seq
    raw: dict[str, Any] = {
        "type": "user/message",
        "seq": b.next_seq,
        "time": 1,
        "data": b.message("user", [text("summary")], source={"kind": "compaction"}),
        "surfaceOp": {"op": "replace", "startSeq": float(first), "endSeq": float(first)},
        "sourceEventSeqs": [float(first)],
    }
    event = parse_event(raw)
    assert event.surface_op == {"op": "replace", "startSeq": first, "endSeq": first}
    assert type(event.surface_op["startSeq"]) is int
    assert event.source_event_seqs == [first] and type(event.source_event_seqs[0]) is int
    b.add(raw)
    s = Session.fold(b.events)
    assert [m["content"][0]["text"] for m in s.derive_messages()][-1] == "summary"
    for bad in (1.5, -1.0):
        with pytest.raises(SessionError, match="S-2"):
            Session.fold(
                [
                    *b.events[:-1],
                    parse_event({**raw, "surfaceOp": {**raw["surfaceOp"], "startSeq": bad}}),
                ]
            )


@pytest.mark.parametrize(
    "tools", ["x", {"read": {}}, [1], [{"description": "no name"}], [{"name": 3}]]
)
def test_D4_header_tools_of_any_shape_but_empty_or_null_load(tools: Any) -> None:
    # the runtime's load path (assertCurrentLlmShape) does not look at tools;
    # only [] is refused (and null breaks its canonicalHeader)
    from processor.core.builtin import default_registry
    from processor.core.defaults import default_message_projections

    b = base(4)
    header = {"config": {"provider": "mock", "model": "m"}, "tools": tools}
    b.add_raw("request/header", {"header": header, "reason": "initial"})
    s = Session.fold(
        b.events, projections=default_registry(), message_projections=default_message_projections()
    )
    assert s.projections.view_of("toolHistory")["tools"] == []  # only named tools are declared
    # an addition against such a header finds no tool (D-3), as the runtime's does
    b.tool_update(b.events[-1].seq, added=["read"])
    with pytest.raises(SessionError, match="D-3"):
        Session.fold(b.events)
    refused: list[Any] | None
    for refused in ([], None):
        c = base(4)
        c.add_raw(
            "request/header",
            {"header": {**header, "tools": refused}, "reason": "initial"},
        )
        with pytest.raises(SessionError, match="D-4"):
            Session.fold(c.events)
