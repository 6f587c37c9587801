"""Rule R: runtime-context and system-prompt projections (docs/session-semantics.md §8)."""

from __future__ import annotations

import itertools
from typing import Any

from processor.agent.adapters import RequestContext
from processor.agent.adapters.mock import Fail, MockModelAdapter, MockRoute, Overflow, Say
from processor.agent.context import (
    EventDraft,
    RuntimeContextProjection,
    SystemPromptProjection,
    message_text,
)
from processor.agent.loop import Agent, CompactionPlugin, RouteUnavailable, StepLoop
from processor.agent.prompt import (
    RUNTIME_CONTEXT_CLEARED,
    ContextSection,
    RenderedContext,
    RenderedContextSection,
    Section,
)
from processor.core.events import Event, make_event
from processor.core.session import Session

# ---------------------------------------------------------------- helpers

_ids = itertools.count(1)


def new_id(kind: str) -> str:
    return f"{kind}-{next(_ids)}"


def commit(session: Session, draft: EventDraft) -> Event:
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


def rendered(**sections: str) -> RenderedContext:
    return RenderedContext(tuple(RenderedContextSection(n, t) for n, t in sections.items()))


def system_texts(session: Session) -> list[str]:
    """Texts of the system nodes on the surface, in surface order."""
    state = session.surface.state
    return [
        message_text(state.message_of(s))
        for s in state.nodes
        if state.node_events[s].type == "system/message"
    ]


def wire_system(session: Session) -> list[str]:
    return [message_text(m) for m in session.derive_messages() if m["role"] == "system"]


def ctx_messages(events: list[Event]) -> list[Event]:
    return [
        e
        for e in events
        if e.type == "user/message" and e.data["source"].get("kind") == "runtime-context"
    ]


class Dynamic:
    """Mutable prompt/context texts behind dynamic sections."""

    def __init__(self, prompt: str = "You are careful.", context: str = "") -> None:
        self.prompt = prompt
        self.context = context
        self.assembles = 0

    def agent(self) -> Agent:
        agent = Agent()

        def prompt_text(_ctx: Any) -> str:
            self.assembles += 1
            return self.prompt

        agent.prompt.add_section(Section("main", 0, prompt_text, interpolate=False))
        agent.prompt.add_context(ContextSection("env", 0, lambda _ctx: self.context))
        return agent


ROUTES = {
    "default": MockRoute(),
    "capable": MockRoute(),
    "incapable": MockRoute(in_history_system_prompt=False, tool_updates=False),
}


def run(
    dyn: Dynamic,
    turns: list[list[Any]],
    *,
    plugins: Any = (),
    session: Session | None = None,
    adapter: MockModelAdapter | None = None,
) -> tuple[Session, MockModelAdapter]:
    agent = dyn.agent()
    session = session if session is not None else agent.new_session()
    adapter = adapter if adapter is not None else MockModelAdapter(routes=ROUTES)
    loop = StepLoop(agent, session, adapter, plugins=plugins)
    for items in turns:
        adapter.push(*items)
        loop.run_turn("hello")
    return session, adapter


# ----------------------------------------------------------------


def test_R1_cleared_text_when_context_goes_empty() -> None:
    session = Agent().new_session()
    proj = RuntimeContextProjection()
    state = session.surface.state
    first = proj.project(rendered(env="cwd: /a"), state, new_id)
    assert first is not None
    proj.observe(commit(session, first), state)
    cleared = proj.project(rendered(), state, new_id)
    assert cleared is not None
    assert message_text(cleared.message) == RUNTIME_CONTEXT_CLEARED
    proj.observe(commit(session, cleared), state)
    # already cleared: no second CLEARED message
    assert proj.project(rendered(), state, new_id) is None


def test_R1_nothing_when_empty_and_never_sent() -> None:
    session = Agent().new_session()
    assert RuntimeContextProjection().project(rendered(), session.surface.state, new_id) is None


def test_R1_unchanged_context_is_not_resent_changed_is() -> None:
    session = Agent().new_session()
    proj = RuntimeContextProjection()
    state = session.surface.state
    draft = proj.project(rendered(env="cwd: /a"), state, new_id)
    assert draft is not None
    proj.observe(commit(session, draft), state)
    assert proj.project(rendered(env="cwd: /a"), state, new_id) is None
    changed = proj.project(rendered(env="cwd: /b"), state, new_id)
    assert changed is not None and "cwd: /b" in message_text(changed.message)


def test_R1_restore_scans_newest_first_for_a_surviving_snapshot() -> None:
    dyn = Dynamic(context="cwd: /a")
    session, _ = run(dyn, [[Say("one")]])
    restored = RuntimeContextProjection()
    restored.restore(list(session.log), session.surface.state)
    assert restored.retained is not None
    assert proj_none(restored, session, "cwd: /a")
    # a new loop over the same log does not resend the unchanged snapshot
    run(dyn, [[Say("two")]], session=session)
    assert len(ctx_messages(list(session.log))) == 1


def compact_all(session: Session) -> Event:
    """Replace every surface node after the first with one summary (a compaction)."""
    nodes = list(session.surface.state.nodes)[1:]
    return commit(
        session,
        EventDraft(
            "user/message",
            {
                "id": new_id("user"),
                "role": "user",
                "source": {"kind": "compaction"},
                "content": [{"type": "text", "text": "summary"}],
            },
            surface_op={"op": "replace", "startSeq": nodes[0], "endSeq": nodes[-1]},
            source_event_seqs=nodes,
        ),
    )


def test_R1_cleared_after_a_compaction_shadowed_the_snapshot() -> None:
    """Issue 17 item 4: a snapshot existed, a compaction shadowed it, the context is now
    empty: the runtime sends CLEARED (the summary may still carry the old snapshot), where
    we used to send nothing."""
    session = Agent().new_session()
    user(session, "q")
    proj = RuntimeContextProjection()
    state = session.surface.state
    first = proj.project(rendered(env="cwd: /a"), state, new_id)
    assert first is not None
    proj.observe(commit(session, first), state)
    proj.observe(compact_all(session), state)
    assert proj.retained is None and proj.ever_sent
    cleared = proj.project(rendered(), state, new_id)
    assert cleared is not None and message_text(cleared.message) == RUNTIME_CONTEXT_CLEARED
    # the same after a restore from the log (a resumed loop)
    restored = RuntimeContextProjection()
    restored.restore(list(session.log), state)
    again = restored.project(rendered(), state, new_id)
    assert again is not None and message_text(again.message) == RUNTIME_CONTEXT_CLEARED


def test_R1_restore_finds_an_older_surviving_snapshot_with_the_same_text() -> None:
    """Issue 17 item 5: the newest snapshot is shadowed but an older one with the same
    text is still on the surface: the runtime keeps scanning past the shadowed one, finds
    the older one and sends nothing; we used to stop at the newest and resend."""
    session = Agent().new_session()
    user(session, "q")
    proj = RuntimeContextProjection()
    state = session.surface.state
    for text in ("cwd: /a", "cwd: /b"):
        draft = proj.project(rendered(env=text), state, new_id)
        assert draft is not None
        proj.observe(commit(session, draft), state)
    # shadow only the newest snapshot (cwd: /b), keep the older one (cwd: /a)
    newest = list(state.nodes)[-1]
    commit(
        session,
        EventDraft(
            "user/message",
            {
                "id": new_id("user"),
                "role": "user",
                "source": {"kind": "compaction"},
                "content": [{"type": "text", "text": "summary"}],
            },
            surface_op={"op": "replace", "startSeq": newest, "endSeq": newest},
            source_event_seqs=[newest],
        ),
    )
    restored = RuntimeContextProjection()
    restored.restore(list(session.log), state)
    assert restored.retained is not None and restored.retained.seq < newest
    assert restored.project(rendered(env="cwd: /a"), state, new_id) is None
    assert restored.project(rendered(env="cwd: /b"), state, new_id) is not None


def proj_none(proj: RuntimeContextProjection, session: Session, text: str) -> bool:
    return proj.project(rendered(env=text), session.surface.state, new_id) is None


def test_R1_at_most_one_runtime_context_message_per_step() -> None:
    dyn = Dynamic(context="cwd: /a")
    adapter = MockModelAdapter(routes=ROUTES)
    session, _ = run(dyn, [[Fail(), Say("ok")]], adapter=adapter)
    assert len(adapter.requests) == 2  # a retry in the same step
    assert len(ctx_messages(list(session.log))) == 1


# ----------------------------------------------------------------


def test_R2_snapshot_source_is_typed_with_sections() -> None:
    session = Agent().new_session()
    draft = RuntimeContextProjection().project(
        rendered(env="cwd: /a", git="main"), session.surface.state, new_id
    )
    assert draft is not None
    assert draft.message["source"] == {
        "kind": "runtime-context",
        "form": "snapshot",
        "sections": [{"name": "env", "text": "cwd: /a"}, {"name": "git", "text": "main"}],
    }


def test_R2_cleared_source_is_only_the_kind() -> None:
    session = Agent().new_session()
    proj = RuntimeContextProjection()
    state = session.surface.state
    first = proj.project(rendered(env="x"), state, new_id)
    assert first is not None
    proj.observe(commit(session, first), state)
    cleared = proj.project(rendered(), state, new_id)
    assert cleared is not None and cleared.message["source"] == {"kind": "runtime-context"}


# ----------------------------------------------------------------


def test_R3_projecting_is_not_appending() -> None:
    session = Agent().new_session()
    proj = RuntimeContextProjection()
    a = proj.project(rendered(env="x"), session.surface.state, new_id)
    b = proj.project(rendered(env="x"), session.surface.state, new_id)
    assert a is not None and b is not None
    assert session.next_seq == 0 and proj.retained is None


class FlakyRoutes(MockModelAdapter):
    """The first ``fail`` prepare_call attempts find no route."""

    def __init__(self, fail: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.fail = fail

    def prepare_call(self, context: RequestContext) -> Any:
        if self.fail:
            self.fail -= 1
            raise RouteUnavailable("no capacity")
        return super().prepare_call(context)


def test_R3_committed_only_after_the_route_is_prepared() -> None:
    dyn = Dynamic(context="cwd: /a")
    adapter = FlakyRoutes(1, routes=ROUTES, script=[Say("ok")])
    session, _ = run(dyn, [[]], adapter=adapter)
    events = list(session.log)
    types = [e.type for e in events]
    (ctx,) = ctx_messages(events)
    failed = types.index("assistant/attempt")
    finish = events[failed].data["stream"][-1]["chunk"]
    assert finish["reason"]["failure"]["code"] == "route-unavailable"
    assert ctx.seq > failed  # not before the first successfully prepared attempt
    assert types.index("step/start") < failed


def test_R3_shadowed_snapshot_is_resent_next_step() -> None:
    dyn = Dynamic(context="cwd: /a")
    session, _ = run(
        dyn,
        [[Say("one")], [Say("two")], [Overflow(), Say("three")], [Say("four")]],
        plugins=[CompactionPlugin(keep_last=1)],
    )
    snaps = ctx_messages(list(session.log))
    # sent once, shadowed by the compaction in turn 3, resent in turn 4
    assert len(snaps) == 2
    assert snaps[0].seq not in session.surface.state.node_events
    assert snaps[1].seq in session.surface.state.node_events


# ----------------------------------------------------------------


def system_project(
    session: Session, text: str, *, in_history: bool = True, starts_series: bool = False
) -> list[EventDraft]:
    drafts = SystemPromptProjection(new_id).project(
        session.surface.state, text, in_history=in_history, starts_series=starts_series
    )
    for d in drafts:
        commit(session, d)
    return drafts


def user(session: Session, text: str) -> None:
    commit(
        session,
        EventDraft(
            "user/message",
            {
                "id": new_id("user"),
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "source": {"kind": "user"},
            },
            surface_op="append",
        ),
    )


def test_R4_first_system_node_is_reserved_even_when_empty() -> None:
    session = Agent().new_session()
    (draft,) = system_project(session, "")
    assert draft.surface_op == "append"
    assert system_texts(session) == [""]
    assert wire_system(session) == []  # an empty head yields no wire message (G-1)
    system_project(session, "now with text", in_history=False)
    assert system_texts(session) == ["now with text"]  # written into the reserved head


def test_R4_capable_route_appends_a_changed_prompt() -> None:
    session = Agent().new_session()
    system_project(session, "A")
    user(session, "q")
    (draft,) = system_project(session, "B")
    assert draft.surface_op == "append"
    assert system_texts(session) == ["A", "B"]
    assert system_project(session, "B") == []  # latest non-empty text equals rendered


def test_R4_incapable_route_consolidates_to_one_head() -> None:
    session = Agent().new_session()
    system_project(session, "A")
    user(session, "q")
    system_project(session, "B")
    user(session, "q2")
    drafts = system_project(session, "C", in_history=False)
    assert system_texts(session) == ["C", ""]
    assert wire_system(session) == ["C"]
    for d in drafts:  # one node per replace, citing it
        op = d.surface_op
        assert op["op"] == "replace" and op["startSeq"] == op["endSeq"]
        assert d.source_event_seqs == [op["startSeq"]]


def test_R4_new_series_consolidates_even_on_a_capable_route() -> None:
    session = Agent().new_session()
    system_project(session, "A")
    user(session, "q")
    system_project(session, "B")
    system_project(session, "B", starts_series=True)
    assert system_texts(session) == ["B", ""]


def test_R4_empty_prompt_blanks_every_system_text() -> None:
    session = Agent().new_session()
    system_project(session, "A")
    user(session, "q")
    system_project(session, "B")
    system_project(session, "")
    assert system_texts(session) == ["", ""]
    assert wire_system(session) == []  # an old instruction cannot resurface


def test_R4_consolidation_blanks_later_nodes_before_rewriting_the_head() -> None:
    """Issue 17 item 6: the runtime's order (R-4) -- every later non-empty system node is
    blanked first, the head is rewritten last; we used to rewrite the head first."""
    session = Agent().new_session()
    system_project(session, "A")
    user(session, "q")
    system_project(session, "B")
    user(session, "q2")
    system_project(session, "C")
    drafts = system_project(session, "D", in_history=False)
    targets = [d.surface_op["startSeq"] for d in drafts]
    texts = [message_text(d.message) for d in drafts]
    head = targets[-1]
    assert texts == ["", "", "D"] and head < min(targets[:-1])
    assert targets[:-1] == sorted(targets[:-1])  # later nodes in surface order
    assert system_texts(session) == ["D", "", ""]


def test_R4_unchanged_head_is_not_rewritten() -> None:
    session = Agent().new_session()
    system_project(session, "A")
    assert system_project(session, "A", in_history=False) == []
    assert system_project(session, "A", starts_series=True) == []


# ----------------------------------------------------------------


def test_R5_in_history_comes_from_this_attempts_route() -> None:
    """Attempt 1 (capable) fails; attempt 2 is prepared on an incapable route with the
    same provider and model: the prompt must be consolidated for attempt 2 although the
    last request/context record still says in-history."""
    dyn = Dynamic(prompt="A")
    adapter = MockModelAdapter(routes=ROUTES)
    session, _ = run(dyn, [[Say("one", route="capable")]], adapter=adapter)
    dyn.prompt = "B"
    run(
        dyn,
        [[Fail(route="capable"), Say("two", route="incapable")]],
        session=session,
        adapter=adapter,
    )
    first, second = adapter.requests[-2:]
    assert [message_text(m) for m in first.messages if m["role"] == "system"] == ["A", "B"]
    assert [message_text(m) for m in second.messages if m["role"] == "system"] == ["B"]
    assert second.context["systemPromptUpdate"] == "consolidate"  # the route's declared mode


def test_R5_capable_route_after_an_incapable_record_appends() -> None:
    dyn = Dynamic(prompt="A")
    adapter = MockModelAdapter(routes=ROUTES)
    session, _ = run(dyn, [[Say("one", route="incapable")]], adapter=adapter)
    dyn.prompt = "B"
    run(dyn, [[Say("two", route="capable")]], session=session, adapter=adapter)
    assert system_texts(session) == ["A", "B"]
