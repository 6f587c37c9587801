"""Units folded a batch at a time (``ProjectionDefinition.apply_all``, issue 15).

A unit with ``apply_all`` is not called per event on the session's fast
path: its events are queued on the cell and folded in one call before
anything reads the cell.  The result must be the per-event fold's: the same
state (values, key order, frozen), the same object when no event changed
it, at every point a reader can look, with listeners, and after a broken
``apply_all`` (the cell falls back to per-event ``apply``).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from processor.core.builtin import BUILTIN_UNITS, default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import Event
from processor.core.frozen import FrozenDict
from processor.core.projections import PENDING_MAX, ProjectionDefinition, ProjectionRegistry
from processor.core.session import Session, synthetic_header
from processor.workload import generate_session
from tests.core.test_fold_reference import deep_frozen

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BATCHED = [unit for unit in BUILTIN_UNITS if unit.apply_all is not None]


def _same(a: Any, b: Any) -> None:
    # orjson keeps key order: equal bytes = equal values in the same order
    assert orjson.dumps(a) == orjson.dumps(b)
    assert deep_frozen(a) and deep_frozen(b)


def test_the_heavy_units_fold_in_batches() -> None:
    assert {u.key for u in BATCHED} >= {"sessionStats", "turnBoundary", "titleInput"}


def _check_batches(events: list[Event], bounds: list[int]) -> None:
    for unit in BATCHED:
        assert unit.apply_all is not None
        state = batched = unit.init(synthetic_header(), 0)
        for lo, hi in itertools.pairwise(bounds):
            before = state
            for event in events[lo:hi]:
                state = unit.apply(state, event)
            before_batched = batched
            batched = unit.apply_all(batched, events[lo:hi])
            _same(batched, state)
            # P-1: a batch that changes nothing returns the very same object
            assert (batched is before_batched) == (state is before), unit.key


@SETTINGS
@given(
    st.randoms(use_true_random=False),
    st.integers(1, 150),
    st.sampled_from([3, 4]),
    st.lists(st.integers(0, 150), max_size=6),
)
def test_apply_all_equals_apply_event_by_event(
    rng: random.Random, n: int, form: int, cuts: list[int]
) -> None:
    events = [e for e in generate_session(rng, n, form=form) if e.is_known]
    _check_batches(events, sorted({0, len(events), *(c for c in cuts if c <= len(events))}))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("size", [1, 3, 17, 200, 10_000])
def test_apply_all_equals_apply_on_long_logs(seed: int, size: int) -> None:
    """Long enough for every rule of the batched units (replaces, tool errors, usage)."""
    events = [e for e in generate_session(random.Random(seed), 1000) if e.is_known]
    assert {"turn/end", "assistant/message", "tool/result"} <= {e.type for e in events}
    _check_batches(events, [*range(0, len(events), size), len(events)])


def test_apply_all_of_irrelevant_events_is_the_same_object() -> None:
    events = [
        Event(type="vendor/telemetry", seq=0, time=0, data=FrozenDict({})),
        Event(type="request/context", seq=1, time=0, data=FrozenDict({})),
    ]
    for unit in BATCHED:
        assert unit.apply_all is not None
        state = unit.init(synthetic_header(), 0)
        assert unit.apply_all(state, events) is state
        assert unit.apply_all(state, []) is state


def _session(registry: ProjectionRegistry | None = None) -> Session:
    return Session(
        message_projections=default_message_projections(),
        projections=registry if registry is not None else default_registry(),
    )


def test_every_reader_sees_the_queued_events_folded() -> None:
    events = generate_session(random.Random(11), 300)
    eager = _session()
    eager.projections.add_listener(lambda *_: None)  # listeners: apply per event
    lazy = _session()
    for i, event in enumerate(events):
        eager.append(event)
        lazy.append(event)
        if i % 37 == 0:
            for unit in BATCHED:
                _same(lazy.projections.state_of(unit.key), eager.projections.state_of(unit.key))
                assert lazy.projections.observed_seq(unit.key) == event.seq
    assert lazy.projections.snapshot() == eager.projections.snapshot()
    assert orjson.dumps(lazy.checkpoint()) == orjson.dumps(eager.checkpoint())


def test_a_listener_added_later_hears_every_change_after_it() -> None:
    events = generate_session(random.Random(12), 200)
    reference = _session()
    expected: list[tuple[str, int]] = []
    reference.projections.add_listener(lambda key, _s, _v, seq: expected.append((key, seq)))
    reference.extend(events)
    session = _session()
    session.extend(events[:100])  # queued, nobody listening
    heard: list[tuple[str, int]] = []
    session.projections.add_listener(lambda key, _s, _v, seq: heard.append((key, seq)))
    session.extend(events[100:])
    assert heard == [(k, s) for k, s in expected if s >= events[100].seq]
    assert any(k == "sessionStats" for k, _ in heard)


def _counting_unit(broken_batches: bool) -> ProjectionDefinition:
    def apply(state: Any, event: Event) -> Any:
        if event.type != "turn/start":
            return state
        return state + 1

    def apply_all(state: Any, events: list[Event]) -> Any:
        if broken_batches:
            raise RuntimeError("broken apply_all")
        for event in events:
            state = apply(state, event)
        return state

    return ProjectionDefinition(
        key="turnCount",
        state_version=1,
        init=lambda header, inherited: 0,
        apply=apply,
        validate_state=lambda state: None,
        event_types=frozenset({"turn/start"}),
        apply_all=apply_all,
    )


def test_a_broken_apply_all_leaves_the_cell_before_its_queue() -> None:
    events = generate_session(random.Random(13), 200)
    turns = sum(1 for e in events if e.type == "turn/start")
    registry = default_registry()
    registry.register(_counting_unit(broken_batches=True))
    session = _session(registry)
    session.extend(events)
    with pytest.raises(RuntimeError, match="broken apply_all"):
        session.projections.state_of("turnCount")
    # the next read folds the queued events one by one (apply), none lost or doubled
    assert session.projections.state_of("turnCount") == turns
    assert session.projections.observed_seq("turnCount") == events[-1].seq


def test_a_queue_holds_at_most_pending_max_events() -> None:
    """Queues are bounded: a long log is folded in as it goes, not all at the
    end (where its events were cold), and the states stay the per-event fold's."""
    events = generate_session(random.Random(15), 4 * PENDING_MAX + 37)
    eager = _session()
    eager.projections.add_listener(lambda *_: None)  # listeners: apply per event
    lazy = _session()
    longest = 0
    for event in events:
        eager.append(event)
        lazy.append(event)
        cells = lazy.projections._cells.values()
        longest = max(longest, *(len(c.pending or ()) for c in cells))
    assert longest == PENDING_MAX - 1
    for unit in BATCHED:
        _same(lazy.projections.state_of(unit.key), eager.projections.state_of(unit.key))


def test_a_broken_apply_all_raises_when_its_queue_is_full() -> None:
    """The bound's flush is the read's: a broken ``apply_all`` raises at the
    append that filled the queue, the cell stays before its queue, and the
    next read folds those events one by one (none lost or doubled)."""
    events = generate_session(random.Random(16), 40 * PENDING_MAX)
    registry = default_registry()
    registry.register(_counting_unit(broken_batches=True))
    session = _session(registry)
    with pytest.raises(RuntimeError, match="broken apply_all"):
        session.extend(events)
    last = session.last_seq
    assert last < events[-1].seq
    turns = sum(1 for e in events[: last + 1] if e.type == "turn/start")
    assert session.projections.state_of("turnCount") == turns
    assert session.projections.observed_seq("turnCount") == last


def test_a_failing_apply_after_a_queued_unit_keeps_the_queue_consistent() -> None:
    """_fail_at: cells before the failed unit advance, the rest stay (P-3)."""
    events = generate_session(random.Random(14), 120)
    target = next(e for e in events if e.type == "turn/start" and e.seq > 20)

    def failing(state: Any, event: Event) -> Any:
        if event.seq == target.seq:
            raise RuntimeError("boom")
        return state

    registry = default_registry()  # turnBoundary and sessionStats come first
    registry.register(_counting_unit(broken_batches=False))
    registry.register(
        ProjectionDefinition(
            key="failing",
            state_version=1,
            init=lambda header, inherited: 0,
            apply=failing,
            validate_state=lambda state: None,
        )
    )
    session = _session(registry)
    with pytest.raises(RuntimeError, match="boom"):
        session.extend(events)
    for key in ("sessionStats", "turnBoundary", "turnCount"):
        assert session.projections.observed_seq(key) == target.seq
    assert session.projections.observed_seq("failing") == target.seq - 1
    turns = sum(1 for e in events[: target.seq + 1] if e.type == "turn/start")
    reference = _session()
    reference.projections.add_listener(lambda *_: None)
    reference.extend(events[: target.seq + 1])
    _same(
        session.projections._cells["sessionStats"].state,
        reference.projections.state_of("sessionStats"),
    )
    assert session.projections._cells["turnCount"].state == turns


_LEAVES = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, -1, 2**53, 2**53 + 1, -(2**53) - 1, 2**64, 10**21])
    | st.sampled_from([0.0, -0.0, 1.0, 1.5, 2.0**53, 1e21, 1e-7])
    | st.sampled_from(["a", "b", "1", "\ud800", "\u2028"])
)
_JSON = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from("xy"), inner, max_size=2)
    ),
    max_leaves=6,
)


@settings(max_examples=600, deadline=None)
@given(_JSON, _JSON)
@example(2**53, 2**53 + 1)
@example(-(2**53), -(2**53) - 1)
@example([1, "a"], [1.0, "a"])
@example({"x": 1, "y": True}, {"y": True, "x": 1})
@example({"x": 2**64}, {"x": 2**64 + 1})
def test_tool_redefinition_shortcut_agrees_with_js_text(a: Any, b: Any) -> None:
    """toolHistory skips js_json for float-free values with safe integers (H-5)."""
    from processor.core.builtin.tool_history import _same_tool
    from processor.core.header import js_json

    assert _same_tool(a, b) == (js_json(a) == js_json(b))
    assert _same_tool(a, a)
