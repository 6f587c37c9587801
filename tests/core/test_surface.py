"""Rules E (envelope), D (data checks), S (surface planning) and M (message projections)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from processor.core.builder import LogBuilder, text, tool_def
from processor.core.defaults import default_message_projections
from processor.core.errors import SessionError
from processor.core.events import Event, make_event, parse_event
from processor.core.message_projections import MessageProjectionRegistry
from processor.core.surface import (
    AppendPlan,
    LogOnlyPlan,
    ReplacePlan,
    SurfaceManager,
    SurfaceState,
    commit_plan,
    fold_surface,
    plan_event,
)


def fold(events: list[Event], registry: MessageProjectionRegistry | None = None) -> SurfaceState:
    state = SurfaceState()
    for ev in events:
        commit_plan(state, ev, plan_event(state, ev, registry))
    return state


def rejects(
    events: list[Event], rule: str, fragment: str, registry: MessageProjectionRegistry | None = None
) -> SessionError:
    with pytest.raises(SessionError) as info:
        fold(events, registry)
    err = info.value
    assert err.rule == rule, str(err)
    assert fragment in str(err), str(err)
    assert str(err).startswith(f"seq {events[-1].seq}: ") or err.seq is None
    return err


CFG = {"provider": "mock", "model": "mock-1"}


def base() -> LogBuilder:
    b = LogBuilder()
    b.system("You are helpful.")  # 0
    b.turn_start()  # 1
    b.user("hello")  # 2
    return b


# ------------------------------------------------------------------ envelope (E)


def test_E1_unknown_envelope_key_is_refused() -> None:
    with pytest.raises(SessionError, match=r"unknown envelope key\(s\): extra \(E-1\)"):
        parse_event({"type": "turn/start", "seq": 0, "time": 1, "data": {}, "extra": 1})


def test_E1_missing_envelope_key_is_refused() -> None:
    with pytest.raises(SessionError, match="missing envelope key.*time"):
        parse_event({"type": "turn/start", "seq": 0, "data": {}})


def test_E2_seq_must_be_a_non_negative_integer() -> None:
    for bad in (-1, 1.5, "1", True, 2**53, -0.0):
        with pytest.raises(SessionError, match="E-2"):
            parse_event({"type": "turn/start", "seq": bad, "time": 1, "data": {}})


def test_E3_data_must_be_plain_json() -> None:
    with pytest.raises(SessionError, match="non-finite number.*E-3"):
        make_event("turn/start", 0, {"turn": float("nan")})
    with pytest.raises(SessionError, match="E-3"):
        make_event("turn/start", 0, {"turn": object()})


def test_E4_unknown_type_needs_ignorable() -> None:
    b = base()
    b.add_raw("vendor/thing", {"x": 1})
    rejects(b.events, "E-4", "unknown event type 'vendor/thing'")


def test_E4_ignorable_unknown_type_is_kept_and_ignored() -> None:
    b = base()
    b.add_raw("vendor/thing", {"x": 1}, ignorable=True, surfaceOp={"whatever": 1})
    state = fold(b.events)
    assert state.nodes == [0, 2] and state.next_seq == 4


def test_E5_log_only_type_must_not_carry_surface_op() -> None:
    with pytest.raises(SessionError, match="turn/start must not carry surfaceOp.*E-5"):
        make_event("turn/start", 0, {"turn": 1}, surface_op="append")
    with pytest.raises(SessionError, match="sourceEventSeqs.*E-5"):
        make_event("tool/call", 0, {}, source_event_seqs=[0])


# ------------------------------------------------------------------ data checks (D)


def test_D1_developer_role_only_in_developer_message() -> None:
    b = base()
    b.add_raw(
        "user/message",
        {"id": "x", "role": "developer", "content": [], "source": {"kind": "user"}},
        surfaceOp="append",
    )
    rejects(b.events, "D-1", "developer/message type and role developer must occur together")
    b = base()
    b.add_raw(
        "developer/message",
        {"message": {"id": "x", "role": "user", "content": [], "source": {"kind": "user"}}},
        surfaceOp="append",
    )
    rejects(b.events, "D-1", "occur together")


def test_D2_tool_blocks_only_in_developer_messages() -> None:
    b = base()
    b.add_raw(
        "user/message",
        {
            "id": "x",
            "role": "user",
            "source": {"kind": "user"},
            "content": [{"type": "tool-removal", "toolName": "a"}],
        },
        surfaceOp="append",
    )
    rejects(b.events, "D-2", "only allowed in developer messages")


def test_D2_tool_block_needs_tool_name() -> None:
    b = base()
    b.add_raw(
        "developer/message",
        {
            "message": {
                "id": "x",
                "role": "developer",
                "source": {"kind": "tool-update"},
                "content": [{"type": "tool-removal"}],
            }
        },
        surfaceOp="append",
    )
    rejects(b.events, "D-2", "needs a non-empty toolName")


def test_D2_tool_addition_must_not_inline_definition() -> None:
    b = base()
    h = b.header([tool_def("grep")])
    b.add_raw(
        "developer/message",
        {
            "headerSeq": h.seq,
            "message": {
                "id": "x",
                "role": "developer",
                "source": {"kind": "tool-update"},
                "content": [
                    {"type": "tool-addition", "toolName": "grep", "tool": tool_def("grep")}
                ],
            },
        },
        surfaceOp="append",
    )
    rejects(b.events, "D-2", "must not inline a tool definition")


def test_D3_additions_need_header_seq() -> None:
    b = base()
    b.header([tool_def("grep")])
    b.tool_update(None, added=["grep"])
    raw = b.events[-1].to_json()
    data = dict(raw["data"])
    del data["headerSeq"]
    b.events[-1] = parse_event({**raw, "data": data})
    rejects(b.events, "D-3", "needs headerSeq")


def test_D3_header_seq_only_with_additions() -> None:
    b = base()
    h = b.header([tool_def("grep")])
    b.add_raw(
        "developer/message",
        {
            "headerSeq": h.seq,
            "message": {
                "id": "x",
                "role": "developer",
                "source": {"kind": "tool-update"},
                "content": [{"type": "tool-removal", "toolName": "a"}],
            },
        },
        surfaceOp="append",
    )
    rejects(b.events, "D-3", "only allowed with tool additions")


def test_D3_header_seq_must_point_at_request_header_with_the_tool() -> None:
    b = base()
    b.tool_update(2, added=["grep"])
    rejects(b.events, "D-3", "headerSeq 2 is not a request/header")
    b = base()
    h = b.header([tool_def("find")])
    b.tool_update(h.seq, added=["grep"])
    rejects(b.events, "D-3", "exactly one tool 'grep', found 0")
    b = base()
    h = b.header([tool_def("grep"), tool_def("grep")])
    b.tool_update(h.seq, added=["grep"])
    rejects(b.events, "D-3", "found 2")
    b = base()
    b.tool_update(99, added=["grep"])
    rejects(b.events, "D-3", "must be an earlier seq")


def test_D3_declared_tool_needs_description_parameters_and_true_defer() -> None:
    for tool, frag in (
        ({"name": "grep", "parameters": {}}, "string description"),
        ({"name": "grep", "description": "d", "parameters": []}, "object parameters"),
        (
            {"name": "grep", "description": "d", "parameters": {}, "deferLoading": False},
            "deferLoading must be true",
        ),
    ):
        b = base()
        h = b.header([tool])
        b.tool_update(h.seq, added=["grep"])
        rejects(b.events, "D-3", frag)


def test_D4_header_system_and_empty_optionals_are_refused() -> None:
    for header, frag in (
        ({"config": CFG, "system": "x"}, "header.system is refused"),
        ({"config": CFG, "tools": []}, "tools: [] is refused"),
        ({"config": CFG, "adapterDefaults": {}}, "adapterDefaults: {} is refused"),
        ({"tools": [tool_def("a")]}, "must name a provider and a model"),
    ):
        b = base()
        b.add_raw("request/header", {"header": header, "reason": "initial"})
        rejects(b.events, "D-4", frag)
    b = base()
    b.add_raw("request/header", {"header": {"config": CFG}, "reason": "because"})
    rejects(b.events, "D-4", "reason must be one of")


def test_D5_tool_error_requires_is_error() -> None:
    b = base()
    b.tool_result("c1", "boom", error={"name": "E", "code": "x"})
    fold(b.events)  # builder sets isError
    raw = b.events[-1].to_json()
    msg = {k: v for k, v in raw["data"]["message"].items() if k != "isError"}
    b.events[-1] = parse_event({**raw, "data": {**raw["data"], "message": msg}})
    rejects(b.events, "D-5", "requires message.isError === true")


def test_D6_surface_event_needs_well_formed_message() -> None:
    cases: list[tuple[str, Any, str]] = [
        ("assistant/message", {"message": "hi"}, "lacks an identified message"),
        (
            "assistant/message",
            {"message": {"role": "assistant", "content": []}},
            "lacks an identified message",
        ),
        (
            "assistant/message",
            {"message": {"id": "a", "role": "user", "content": []}},
            "role must be 'assistant'",
        ),
        (
            "tool/result",
            {
                "message": {
                    "id": "a",
                    "role": "tool",
                    "content": "x",
                    "source": {"kind": "tool", "callId": "c"},
                }
            },
            "content must be a list",
        ),
        ("user/message", [1], "lacks an identified message"),
    ]
    for etype, data, frag in cases:
        b = base()
        b.add_raw(etype, data, surfaceOp="append")
        rejects(b.events, "D-6", frag)
    b = base()
    b.add_raw("turn/end", [1])  # log-only data may be any JSON value, as in the runtime
    assert fold(b.events).next_seq == 4


# ------------------------------------------------------------------ surface (S)


def test_S1_seq_must_be_contiguous() -> None:
    b = base()
    b.next_seq = 5
    b.user("late")
    rejects(b.events, "S-1", "seq 5 is not contiguous; expected 3")


@pytest.mark.parametrize(
    "op",
    [
        None,
        [1],
        "prepend",
        {"op": "replace", "startSeq": 0},
        {"op": "replace", "startSeq": 0, "endSeq": 0, "x": 1},
        {"op": "replace", "startSeq": -1, "endSeq": 0},
        {"op": "replace", "startSeq": 0, "endSeq": 3},
    ],
)
def test_S2_surface_op_must_be_append_or_exact_replace(op: Any) -> None:
    b = base()
    b.add_raw("user/message", b.message("user", [text("x")]), surfaceOp=op)
    rejects(b.events, "S-2", "")


def test_S2_surface_event_without_op_is_an_error() -> None:
    b = base()
    b.add_raw("user/message", b.message("user", [text("x")]))
    rejects(b.events, "S-2", "user/message requires surfaceOp")


@pytest.mark.parametrize(
    "sources,frag",
    [
        ([], "non-empty array"),
        ([1, 1], "must not repeat"),
        ([9], "earlier seqs"),
        (["1"], "non-negative integers"),
        ({"a": 1}, "non-empty array"),
        # the planner's one-pass check must refuse what the rule-ordered checks refuse
        ([True], "non-negative integers"),
        ([-1], "non-negative integers"),
        ([1.5], "non-negative integers"),  # 1.0 is the seq 1 (S-3 test in test_runtime_checks)
        ([0, 2**53], "non-negative integers"),
        ([0, 1, 0], "must not repeat"),
        ([0, 2, 1, 2], "must not repeat"),
        ([0, 2, 99], "earlier seqs"),
    ],
)
def test_S3_source_event_seqs_shape(sources: Any, frag: str) -> None:
    b = base()
    b.user("x", sources=sources)
    rejects(b.events, "S-3", frag)


def test_S3_assistant_message_never_carries_sources() -> None:
    b = base()
    b.add_raw(
        "assistant/message",
        {"turn": 1, "step": 1, "stream": [], "message": b.message("assistant", [])},
        surfaceOp="append",
        sourceEventSeqs=[2],
    )
    rejects(b.events, "S-3", "assistant/message must not carry sourceEventSeqs")


def test_S3_sources_need_not_be_surface_nodes() -> None:
    b = base()
    call = b.tool_call("c1", "grep", {})
    b.tool_result("c1", "found", call_seq=call.seq)
    assert fold(b.events).nodes == [0, 2, 4]


def test_S4_replace_endpoints_must_be_current_nodes() -> None:
    b = base()
    b.summary("sum", 1, 2, [1, 2])
    rejects(b.events, "S-4", "endpoint 1 is not a current surface node")


def test_S4_replace_uses_identity_not_index() -> None:
    b = base()
    b.assistant("a")  # 3
    b.summary("sum", 2, 3, [2, 3])  # 4 -> [0, 4]
    b.user("u")  # 5 -> [0, 4, 5]
    b.summary("sum2", 4, 5, [4, 5])  # nodes identified by seq
    assert fold(b.events).nodes == [0, 6]
    b = base()
    b.assistant("a")
    b.summary("sum", 3, 2, [2, 3])
    rejects(b.events, "S-4", "start 3 comes after end 2")


def test_S4_every_shadowed_node_must_be_cited() -> None:
    b = base()
    b.turn_start()  # 3 (log only)
    b.assistant("a")  # 4
    b.user("b")  # 5
    b.summary("sum", 2, 5, [2, 5])
    rejects(b.events, "S-4", "missing 4")
    b.events.pop()
    b.next_seq -= 1
    b.add_raw(
        "user/message",
        b.message("user", [text("s")]),
        surfaceOp={"op": "replace", "startSeq": 2, "endSeq": 5},
    )
    rejects(b.events, "S-4", "missing 2, 4, 5")


def test_S5_tool_result_replace_changes_content_only() -> None:
    b = base()
    call = b.tool_call("c1", "read", {})
    res = b.tool_result("c1", "x" * 100, call_seq=call.seq)
    b.tool_result("c1", "[truncated]", like=res, replace=(res.seq, res.seq))
    state = fold(b.events)
    assert state.nodes == [0, 2, 5]
    for path, value in (
        ("source", {"kind": "tool", "callId": "c1", "x": 1}),
        ("isError", True),
        ("id", "other"),
    ):
        b2 = base()
        call = b2.tool_call("c1", "read", {})
        res = b2.tool_result("c1", "x", call_seq=call.seq)
        raw = b2.envelope(
            "tool/result",
            {**res.data, "message": {**res.data["message"], path: value}},
            surfaceOp={"op": "replace", "startSeq": res.seq, "endSeq": res.seq},
            sourceEventSeqs=[res.seq],
        )
        b2.add(raw)
        rejects(b2.events, "S-5", f"message.{path} differs")
    b3 = base()
    call = b3.tool_call("c1", "read", {})
    res = b3.tool_result("c1", "x", call_seq=call.seq)
    b3.add(
        b3.envelope(
            "tool/result",
            {**res.data, "turn": 7},
            surfaceOp={"op": "replace", "startSeq": res.seq, "endSeq": res.seq},
            sourceEventSeqs=[res.seq],
        )
    )
    rejects(b3.events, "S-5", "data.turn differs")


def test_S5_tool_result_replace_shadows_one_tool_result() -> None:
    b = base()
    call = b.tool_call("c1", "read", {})
    res = b.tool_result("c1", "x", call_seq=call.seq)
    b.add(
        b.envelope(
            "tool/result",
            res.data,
            sourceEventSeqs=[2, res.seq],
            surfaceOp={"op": "replace", "startSeq": 2, "endSeq": res.seq},
        )
    )
    rejects(b.events, "S-5", "exactly one node, not 2")
    b = base()
    b.tool_result("c1", "y", replace=(2, 2), call_seq=2)
    rejects(b.events, "S-5", "must shadow a tool/result, not user/message")


def test_S6_system_head_only_replaced_by_system_message() -> None:
    b = base()
    b.summary("sum", 0, 2, [0, 2])
    rejects(b.events, "S-6", "system head")
    b = base()
    b.system("new prompt", replace=(0, 2), sources=[0, 2])
    rejects(b.events, "S-6", "covering exactly that node")
    b = base()
    b.system("new prompt", replace=(0, 0), sources=[0])
    assert fold(b.events).nodes == [3, 2]


def test_S6_later_system_nodes_are_unprotected() -> None:
    b = base()
    b.system("appended prompt")  # 3
    b.summary("sum", 2, 3, [2, 3])
    assert fold(b.events).nodes == [0, 4]
    b = LogBuilder()
    b.user("first")
    b.system("sys")
    b.summary("sum", 0, 1, [0, 1])  # head is not a system message: no protection
    assert fold(b.events).nodes == [2]


def test_S7_append_and_replace_generations() -> None:
    b = base()
    b.assistant("a")
    state = fold(b.events)
    assert (state.replace_generation, state.content_generation) == (0, 0)
    b.summary("sum", 2, 3, [2, 3])
    state = fold(b.events)
    assert state.nodes == [0, 4]
    assert (state.replace_generation, state.content_generation) == (1, 1)


def test_S8_spec_example() -> None:
    b = LogBuilder()
    b.turn_start()  # 0
    b.step_start()  # 1
    b.user("two")  # 2
    b.step_end()  # 3
    b.user("four")  # 4
    b.step_start()  # 5
    b.step_end()  # 6
    b.assistant("seven")  # 7
    b.summary("eight", 2, 4, [2, 4])  # 8
    fold_ = fold_surface(b.events)
    assert fold_.nodes == (8, 7)
    assert [r.to_json() for r in fold_.replacements] == [
        {"seq": 8, "startSeq": 2, "endSeq": 4, "shadowed": [2, 4]}
    ]


def test_S9_staged_plan_is_reused_for_the_same_candidate() -> None:
    b = base()
    manager = SurfaceManager()
    for ev in b.events:
        manager.commit(ev)
    candidate = make_event(
        "user/message",
        3,
        {"id": "u9", "role": "user", "content": [], "source": {"kind": "user"}},
        surface_op="append",
    )
    plan = manager.validate_next(candidate)
    assert isinstance(plan, AppendPlan) and manager.nodes == [0, 2]  # nothing touched
    assert manager.commit(candidate) is plan
    # a different object at the same seq is re-planned, not trusted
    other = make_event("turn/end", 4, {"turn": 1, "reason": "x"})
    manager.validate_next(
        make_event(
            "user/message",
            4,
            {"id": "u", "role": "user", "source": {"kind": "user"}, "content": []},
            surface_op="append",
        )
    )
    assert isinstance(manager.commit(other), LogOnlyPlan)
    assert manager.nodes == [0, 2, 3]


def test_S9_generations_count_rewrites_not_events() -> None:
    b = base()
    for i in range(5):
        b.user(f"u{i}")
    state = fold(b.events)
    assert state.content_generation == 0 and state.replace_generation == 0


def test_replace_plan_records_shadowed_slice() -> None:
    b = base()
    b.assistant("a")
    state = fold(b.events)
    ev = b.summary("sum", 2, 3, [2, 3])
    plan = plan_event(state, ev)
    assert isinstance(plan, ReplacePlan) and plan.shadowed == (2, 3)
    assert state.nodes == [0, 2, 3]  # planning changes nothing


# ------------------------------------------------------------------ message projections (M)


def image_log() -> LogBuilder:
    b = base()
    b.add_raw(
        "user/message",
        {
            "id": "img",
            "role": "user",
            "source": {"kind": "user"},
            "content": [text("look"), {"type": "image", "mediaType": "image/png", "data": "AAAA"}],
        },
        surfaceOp="append",
    )  # 3
    return b


def offload(b: LogBuilder, targets: list[dict[str, Any]]) -> Event:
    return b.add_raw("image/offload", {"targets": targets})


def test_M1_projection_keeps_identity_and_membership() -> None:
    class Bad:
        type = "vendor/rewrite"

        def project(self, event: Event, ctx: Any) -> dict[int, Any]:
            return {2: {"id": "changed", "role": "user", "content": []}}

    class Outside:
        type = "vendor/rewrite"

        def project(self, event: Event, ctx: Any) -> dict[int, Any]:
            return {1: {"id": "x", "role": "user", "content": []}}

    for proj, frag in ((Bad(), "keep the identity"), (Outside(), "not a surface node")):
        b = base()
        b.add_raw("vendor/rewrite", {})
        rejects(b.events, "M-1", frag, MessageProjectionRegistry([proj]))


def test_M1_projection_does_not_mutate_inputs() -> None:
    b = image_log()
    before = copy.deepcopy(b.events[3].to_json())
    offload(b, [{"seq": 3, "imageIndexes": [0]}])
    fold(b.events, default_message_projections())
    assert b.events[3].to_json() == before


def test_M2_projection_plan_overrides_and_bumps_content_generation() -> None:
    b = image_log()
    offload(b, [{"seq": 3, "imageIndexes": [0]}])
    state = fold(b.events, default_message_projections())
    assert state.nodes == [0, 2, 3]
    assert state.content_generation == 1 and state.replace_generation == 0
    assert state.overrides[3]["content"][1] == {
        "type": "image",
        "mediaType": "image/png",
        "data": "AAAA",
        "offloaded": True,
    }
    assert state.overrides[3]["id"] == "img"


def test_M2_projection_is_checked_before_surface_op() -> None:
    class Rewrite:
        type = "user/message"  # a plugin may even claim a surface type

        def project(self, event: Event, ctx: Any) -> dict[int, Any]:
            return {}

    b = LogBuilder()
    b.system("sys")
    b.add_raw("user/message", {"id": "q", "role": "user", "content": []})  # no surfaceOp
    state = fold(b.events, MessageProjectionRegistry([Rewrite()]))  # no S-2 error
    assert state.nodes == [0] and state.content_generation == 1


def test_M3_unregistered_message_projection_type_is_an_error() -> None:
    b = image_log()
    offload(b, [{"seq": 3, "imageIndexes": [0]}])
    rejects(b.events, "M-3", "image/offload requires a message projection")


def test_M4_duplicate_registration_is_an_error() -> None:
    registry = default_message_projections()
    from processor.core.image_offload import ImageOffload

    with pytest.raises(SessionError, match="M-4"):
        registry.register(ImageOffload())


def test_M4_removed_projection_fails_later_appends() -> None:
    registry = default_message_projections()
    b = image_log()
    offload(b, [{"seq": 3, "imageIndexes": [0]}])
    manager = SurfaceManager(registry)
    for ev in b.events:
        manager.commit(ev)
    registry.unregister("image/offload")
    with pytest.raises(SessionError, match="removed after this session"):
        manager.commit(b.user("more"))


@pytest.mark.parametrize(
    "entries,frag",
    [
        ([], "nonempty targets array"),
        ([{"seq": 3, "imageIndexes": [1]}], "does not exist"),
        ([{"seq": 1, "imageIndexes": [0]}], "is not a current surface node"),
        ([{"seq": 0, "imageIndexes": [0]}], "must be user/message or tool/result"),
        ([{"seq": 3, "imageIndexes": []}], "seq and nonempty imageIndexes"),
        ([{"seq": 3, "imageIndexes": [0], "x": 1}], "seq and nonempty imageIndexes"),
        ([{"seq": 3, "imageIndexes": [0, 0]}], "strictly increasing"),
        ([{"seq": 3, "imageIndexes": [0]}, {"seq": 3, "imageIndexes": [0]}], "duplicate target"),
    ],
)
def test_M5_image_offload_validates_whole_payload(entries: list[Any], frag: str) -> None:
    b = image_log()
    offload(b, entries)
    rejects(b.events, "M-5", frag, default_message_projections())
