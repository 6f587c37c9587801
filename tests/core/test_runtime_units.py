"""The runtime's own domain units (title, titleInput, todos, plan) and image/offload (M-5)."""

from __future__ import annotations

from typing import Any

import pytest

from processor.core.builder import LogBuilder, text
from processor.core.builtin import default_registry
from processor.core.builtin.runtime_units import _is_prompt, _prompt_text
from processor.core.defaults import default_message_projections
from processor.core.session import Session


def session(b: LogBuilder) -> Session:
    return Session.fold(
        b.events, projections=default_registry(), message_projections=default_message_projections()
    )


def test_P1_title_is_the_last_session_title() -> None:
    b = LogBuilder()
    b.system("s")
    s = session(b)
    assert s.projections.view_of("title") is None
    s.append(
        b.add_raw(
            "session/title", {"title": "First", "messageSeqs": [], "source": {"kind": "fallback"}}
        )
    )
    s.append(
        b.add_raw(
            "session/title", {"title": "Better", "messageSeqs": [], "source": {"kind": "user"}}
        )
    )
    assert s.projections.view_of("title") == "Better"
    s.projections.drain_view_changes()
    s.append(b.add_raw("session/title", {"title": "Better"}))
    assert "title" not in s.projections.drain_view_changes()  # unchanged: not republished


def test_title_input_counts_human_prompts_only() -> None:
    b = LogBuilder()
    b.system("s")
    b.user("  ")  # blank: not eligible
    b.user("first question")
    b.user("from a tool", source={"kind": "runtime-context"})
    b.user("second")
    state = session(b).projections.state_of("titleInput")
    assert state == {"first": {"seq": 2, "text": "first question"}, "count": 2, "lastSeq": 4}


def test_title_input_counts_later_prompts_by_their_non_blank_text() -> None:
    # after the first prompt only whether a text is non-blank is asked
    # (_is_prompt): it must judge as the joined text did
    b = LogBuilder()
    b.system("s")
    b.user("first")
    b.user(" \n\t")  # blank: not counted
    blocks = b.message("user", [text("  "), {"type": "image", "url": "x"}, text(" two ")])
    b.add_raw(
        "user/message", blocks, surfaceOp="append"
    )  # the second text block is not blank: counted
    b.add_raw("user/message", b.message("user", [text(""), text("\u2003")]), surfaceOp="append")
    state = session(b).projections.state_of("titleInput")
    assert state == {"first": {"seq": 1, "text": "first"}, "count": 2, "lastSeq": 3}


@pytest.mark.parametrize(
    "content",
    [
        [],
        [text("")],
        [text(" "), text("\n")],
        [text(" "), text("x")],
        [{"type": "text"}, text("y")],
        [{"type": "text", "text": 3}],
        [{"type": "image"}, text(" z ")],
        ["not a block", text("\u00a0")],
    ],
)
@pytest.mark.parametrize("kind", ["user", "runtime-context"])
def test_is_prompt_agrees_with_prompt_text(content: list[Any], kind: str) -> None:
    b = LogBuilder()
    message = b.message("user", content)
    message["source"] = {"kind": kind}
    event = b.add_raw("user/message", message)
    assert _is_prompt(event) is (_prompt_text(event) is not None)


def test_P1_todos_last_write_wins_and_turn_start_clears() -> None:
    b = LogBuilder()
    b.system("s")
    b.turn_start()
    b.add_raw("todo/write", {"todos": [{"content": "a", "status": "pending", "extra": 1}]})
    s = session(b)
    assert s.projections.view_of("todos") == [{"content": "a", "status": "pending"}]
    s.append(b.turn_end())
    assert s.projections.view_of("todos") == [{"content": "a", "status": "pending"}]
    s.append(b.turn_start())
    assert s.projections.view_of("todos") is None
    s.append(b.add_raw("todo/write", {"todos": [{"content": "b", "status": "bogus"}]}))
    assert s.projections.view_of("todos") is None  # not the runtime's shape: state kept


def test_plan_mode_follows_command_and_mode_events() -> None:
    b = LogBuilder()
    b.system("s")
    s = session(b)
    assert s.projections.view_of("plan") == {"active": False, "pending": False}
    s.append(b.add_raw("command/run", {"name": "plan", "commandId": "c1", "args": ""}))
    assert s.projections.view_of("plan") == {"active": False, "pending": True}
    s.append(b.add_raw("command/done", {"commandId": "c1", "kind": "success"}))
    assert s.projections.view_of("plan") == {"active": False, "pending": True}
    s.append(b.add_raw("plan/mode", {"active": True}))
    assert s.projections.view_of("plan") == {"active": True, "pending": False}
    s.append(b.header())
    assert s.projections.state_of("plan")["activeAtLastHeader"] is True


def test_M5_offload_reaches_images_inside_a_v3_tool_result() -> None:
    for form in (3, 4):
        b = LogBuilder(form=form)
        b.system("s")
        call = b.tool_call("c1", "shot", "{}")
        res = b.tool_result("c1", "here", call_seq=call.seq)
        raw = res.to_json()
        b.events.pop()
        b.next_seq -= 1
        image = {"type": "image", "mediaType": "image/png", "data": "AA"}
        message = {**raw["data"]["message"]}
        if form == 3:
            block = message["content"][0]
            message["content"] = [{**block, "content": [*block["content"], image]}]
        else:
            message["content"] = [*message["content"], image]
        b.add({**raw, "data": {**raw["data"], "message": message}})
        b.add_raw("image/offload", {"targets": [{"seq": 2, "imageIndexes": [0]}]})
        s = session(b)
        out = s.derive_messages()[-1]
        blocks = out["content"][0]["content"] if form == 3 else out["content"]
        assert blocks[-1] == {**image, "offloaded": True}
        assert out["id"] == raw["data"]["message"]["id"]
        assert s.transcript()[-1]["message"] == message  # G-4: as it was seen


def test_M5_offload_counts_images_depth_first_including_offloaded_ones() -> None:
    b = LogBuilder()
    b.system("s")
    img = {"type": "image", "data": "AA"}
    b.add_raw("user/message", b.message("user", [img, text("t"), img, img]), surfaceOp="append")
    b.add_raw("image/offload", {"targets": [{"seq": 1, "imageIndexes": [1]}]})
    b.add_raw("image/offload", {"targets": [{"seq": 1, "imageIndexes": [0, 2]}]})
    content = session(b).derive_messages()[-1]["content"]
    assert [c.get("offloaded") for c in content] == [True, None, True, True]


def test_M5_integral_float_seqs_and_indexes_are_integers() -> None:
    # the runtime reads JSON numbers as doubles: 1.0 is the seq and index 1
    b = LogBuilder()
    b.system("s")
    img = {"type": "image", "data": "AA"}
    b.add_raw("user/message", b.message("user", [img, img]), surfaceOp="append")
    b.add_raw("image/offload", {"targets": [{"seq": 1.0, "imageIndexes": [0, 1.0]}]})
    content = session(b).derive_messages()[-1]["content"]
    assert [c.get("offloaded") for c in content] == [True, True]
