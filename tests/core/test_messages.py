"""Rule G: deriving model messages and the transcript."""

from __future__ import annotations

import pytest

from processor.core.builder import LogBuilder
from processor.core.defaults import default_message_projections
from processor.core.messages import DerivedMessages, derive_event_message
from processor.core.session import Session
from processor.core.surface import fold_surface


def session(b: LogBuilder) -> Session:
    return Session.fold(b.events, message_projections=default_message_projections())


def test_G1_derive_event_message_per_type() -> None:
    b = LogBuilder()
    sys_empty = b.system("")
    user = b.user("hi")
    asst_empty = b.assistant("")
    asst = b.assistant("answer")
    call = b.tool_call("c1", "read", {})
    res = b.tool_result("c1", "out", call_seq=call.seq)
    assert derive_event_message(sys_empty) is None  # empty head keeps its node, no message
    assert derive_event_message(user) is user.data
    assert derive_event_message(asst_empty) is None
    assert derive_event_message(asst) is asst.data["message"]
    assert derive_event_message(call) is None
    assert derive_event_message(res) is res.data["message"]
    override = {"id": user.data["id"], "role": "user", "content": [], "source": {"kind": "user"}}
    assert derive_event_message(user, {user.seq: override}) is override  # projection wins
    s = session(b)
    assert s.surface.nodes == [0, 1, 2, 3, 5]
    assert [m["id"] for m in s.derive_messages()] == [
        user.data["id"],
        asst.data["message"]["id"],
        res.data["message"]["id"],
    ]


def test_G2_cache_extends_on_append_and_rebuilds_on_rewrite() -> None:
    b = LogBuilder()
    b.system("s")
    b.user("a")
    s = session(b)
    first = s.derive_messages()
    again = s.derive_messages()
    assert first == again and first is not again  # a fresh list each call
    assert all(x is y for x, y in zip(first, again, strict=True))  # shared messages
    derived = s._derived
    s.append(b.user("b"))
    assert derived._nodes_done == 2
    s.derive_messages()
    assert derived._nodes_done == 3  # only the new tail node was derived
    s.append(b.summary("sum", 1, 2, [1, 2]))
    assert [m["content"][0]["text"] for m in s.derive_messages()] == ["s", "sum"]


def test_G2_messages_are_immutable() -> None:
    b = LogBuilder()
    b.user("a")
    message = session(b).derive_messages()[0]
    with pytest.raises(TypeError):
        message["content"] = []
    with pytest.raises(TypeError):
        message["content"].append({"type": "text", "text": "x"})


def test_G2_cache_is_dropped_when_generation_changes() -> None:
    b = LogBuilder()
    b.user("a")
    b.add_raw(
        "user/message",
        {
            "id": "img",
            "role": "user",
            "source": {"kind": "user"},
            "content": [{"type": "image", "data": "AA"}],
        },
        surfaceOp="append",
    )
    s = session(b)
    cache = DerivedMessages()
    assert cache.derive(s.surface.state)[1]["content"][0]["type"] == "image"
    s.append(b.add_raw("image/offload", {"targets": [{"seq": 1, "imageIndexes": [0]}]}))
    assert cache.derive(s.surface.state)[1]["content"][0]["offloaded"] is True


def test_G3_derivation_never_wraps_content() -> None:
    b = LogBuilder()
    ctx = b.user("<context>as the producer framed it</context>", source={"kind": "runtime-context"})
    assert session(b).derive_messages() == [ctx.data]


def test_G4_transcript_survives_compaction() -> None:
    b = LogBuilder()
    b.system("s")
    b.user("question")
    b.assistant("answer")
    b.summary("summary", 1, 2, [1, 2])
    s = session(b)
    assert [m["content"][0]["text"] for m in s.derive_messages()] == ["s", "summary"]
    assert [e["seq"] for e in s.transcript()] == [0, 1, 2]  # the replacement is not appended
    assert s.transcript()[1]["message"]["content"][0]["text"] == "question"


def test_G5_fold_surface_reports_nodes_replacements_and_projections() -> None:
    b = LogBuilder()
    b.system("s")
    b.add_raw(
        "user/message",
        {
            "id": "img",
            "role": "user",
            "source": {"kind": "user"},
            "content": [{"type": "image", "data": "AA"}],
        },
        surfaceOp="append",
    )
    b.user("q")
    b.add_raw("image/offload", {"targets": [{"seq": 1, "imageIndexes": [0]}]})
    b.summary("sum", 2, 2, [2])
    folded = fold_surface(b.events, default_message_projections())
    assert folded.nodes == (0, 1, 4)
    assert [r.to_json() for r in folded.replacements] == [
        {"seq": 4, "startSeq": 2, "endSeq": 2, "shadowed": [2]}
    ]
    assert folded.projected[1]["content"][0] == {"type": "image", "data": "AA", "offloaded": True}
    assert (folded.replace_generation, folded.content_generation) == (1, 2)
