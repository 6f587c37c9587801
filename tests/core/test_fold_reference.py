"""The optimised fold equals a straightforward reference fold (issue 15).

``Session.append`` skips work where the result is provably the same: units
are only called for the event types they declare (``event_types``), the
fast path keeps no per-event bookkeeping beyond the watermarks, the digest
of the last event is computed when asked, frozen states are built from
frozen parts.  The reference below does none of that: it plans and commits
every event with the planner, calls every unit's ``apply`` for every known
event, derives messages and the transcript from scratch, and hashes every
event.  Both must give the same output, checkpoint and change notifications
on generated logs; a unit whose ``event_types`` leaves out a type it reacts
to fails here.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.builtin import BUILTIN_UNITS, default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import KNOWN_TYPES, Event
from processor.core.frozen import FrozenDict, FrozenList, freeze
from processor.core.log import inherited_event_count
from processor.core.messages import derive_event_message, transcript_entry
from processor.core.session import CHECKPOINT_VERSION, Session, synthetic_header
from processor.core.surface import SurfaceState, commit_plan, plan_event
from processor.offline import fold_events, session_output
from processor.workload import generate_session

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def deep_frozen(value: Any) -> bool:
    if isinstance(value, dict):
        return type(value) is FrozenDict and all(deep_frozen(v) for v in value.values())
    if isinstance(value, list):
        return type(value) is FrozenList and all(deep_frozen(v) for v in value)
    return True


def reference_fold(
    events: list[Event],
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, int]]]:
    """(output, checkpoint, identity changes) computed the plain way."""
    header = synthetic_header()
    surface = SurfaceState()
    registry = default_message_projections()
    for event in events:
        commit_plan(surface, event, plan_event(surface, event, registry))
    inherited = inherited_event_count(events)
    states = {d.key: d.init(header, inherited) for d in BUILTIN_UNITS}
    changes: list[tuple[str, int]] = []
    for event in events:
        if not event.is_known:
            continue
        for d in BUILTIN_UNITS:
            new = d.apply(states[d.key], event)
            if new is not states[d.key]:
                changes.append((d.key, event.seq))
            states[d.key] = new
    last = events[-1].seq if events else -1
    messages = [
        m
        for m in (
            derive_event_message(surface.node_events[s], surface.overrides) for s in surface.nodes
        )
        if m is not None
    ]
    transcript = [e for e in map(transcript_entry, events) if e is not None]
    rows = {
        d.key: {"ver": d.state_version, "seq": last, "val": states[d.key]} for d in BUILTIN_UNITS
    }
    output = {
        "asOfSeq": last,
        "surface": {
            "nodes": list(surface.nodes),
            "replaceGeneration": surface.replace_generation,
            "contentGeneration": surface.content_generation,
        },
        "messages": messages,
        "transcript": transcript,
        "projections": {
            d.key: d.wire.view(states[d.key]) for d in BUILTIN_UNITS if d.wire is not None
        },
        "checkpoint": rows,
    }
    digest = None
    for event in events:  # every event hashed, the last one kept
        envelope = {"type": event.type, "seq": event.seq, "time": event.time, "data": event.data}
        for key, value in (
            ("surfaceOp", event.surface_op),
            ("sourceEventSeqs", event.source_event_seqs),
        ):
            if key in event.to_json():
                envelope[key] = value
        if event.ignorable is not None:
            envelope["ignorable"] = event.ignorable
        digest = hashlib.blake2b(
            orjson.dumps(envelope, option=orjson.OPT_SORT_KEYS), digest_size=16
        ).hexdigest()
    checkpoint = {
        "version": CHECKPOINT_VERSION,
        "lastSeq": last,
        "lastDigest": digest,
        "surface": surface.to_json(),
        "transcriptBase": 0,
        "transcript": transcript,
        "rows": rows,
    }
    return output, checkpoint, changes


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(1, 120), st.sampled_from([3, 4]))
def test_optimised_fold_equals_reference_fold(rng: random.Random, n: int, form: int) -> None:
    events = generate_session(rng, n, form=form)
    expected_output, expected_checkpoint, expected_changes = reference_fold(events)
    session = Session(
        message_projections=default_message_projections(), projections=default_registry()
    )
    changes: list[tuple[str, int]] = []
    session.projections.add_listener(lambda key, _s, _v, seq: changes.append((key, seq)))
    session.extend(events)
    assert changes == expected_changes
    for unit in BUILTIN_UNITS:  # states are built from frozen parts, never left mutable
        assert deep_frozen(session.projections.state_of(unit.key)), unit.key
    assert as_json(session_output(session)) == as_json(expected_output)
    assert as_json(session.checkpoint()) == as_json(expected_checkpoint)
    assert as_json(fold_events(events).checkpoint()) == as_json(expected_checkpoint)


def _states_along(events: list[Event]) -> dict[str, list[Any]]:
    header = synthetic_header()
    states = {d.key: d.init(header, 0) for d in BUILTIN_UNITS}
    seen: dict[str, list[Any]] = {d.key: [states[d.key]] for d in BUILTIN_UNITS}
    for event in events:
        for d in BUILTIN_UNITS:
            states[d.key] = d.apply(states[d.key], event)
            seen[d.key].append(states[d.key])
    return seen


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(1, 80), st.data())
def test_units_ignore_every_type_outside_their_event_types(
    rng: random.Random, n: int, data: st.DataObject
) -> None:
    """P-1 for skipped types: any payload of an undeclared type returns the same state."""
    events = generate_session(rng, n)
    payloads = [e.data for e in events]
    seen = _states_along(events)
    for unit in BUILTIN_UNITS:
        if unit.event_types is None:
            continue
        states = data.draw(
            st.lists(st.sampled_from(seen[unit.key]), min_size=1, max_size=4),
            label=f"{unit.key} states",
        )
        for etype in sorted(KNOWN_TYPES - unit.event_types):
            payload = data.draw(st.sampled_from(payloads), label="payload")
            for state in states:
                event = Event(type=etype, seq=n, time=0, data=freeze(payload))
                assert unit.apply(state, event) is state, (unit.key, etype)


def test_P5_undetached_checkpoint_shares_frozen_states_and_copies_mutable_ones() -> None:
    from processor.core.projections import ProjectionDefinition

    def count_apply(state: Any, event: Event) -> Any:
        return {"n": state["n"] + 1}  # a plain, mutable state (allowed for custom units)

    registry = default_registry()
    registry.register(
        ProjectionDefinition(
            key="plainCount",
            state_version=1,
            init=lambda header, inherited: {"n": 0},
            apply=count_apply,
            validate_state=lambda s: None,
        )
    )
    events = generate_session(random.Random(5), 40)
    session = Session(message_projections=default_message_projections(), projections=registry)
    session.extend(events)
    shared = session.checkpoint(detached=False)
    assert as_json(shared) == as_json(session.checkpoint())
    for unit in BUILTIN_UNITS:
        state = session.projections.state_of(unit.key)
        if isinstance(state, dict | list):  # no thaw copy of a frozen state
            assert shared["rows"][unit.key]["val"] is state, unit.key
    plain = session.projections.state_of("plainCount")
    row = shared["rows"]["plainCount"]["val"]
    assert row is not plain and row == plain and deep_frozen(row)
    plain["n"] = -1  # the live mutable state changes; the row it was copied to does not
    assert row["n"] == len(events)


def test_P3_apply_that_raises_leaves_earlier_units_advanced_and_later_ones_behind() -> None:
    """The fast path keeps the one-unit-after-the-other watermarks when an apply raises."""
    from processor.core.events import make_event
    from processor.core.projections import ProjectionDefinition, ProjectionRegistry

    armed = {"on": True}

    def count(state: Any, event: Event) -> Any:
        return state + 1

    def count_todos(state: Any, event: Event) -> Any:
        return state + 1 if event.type == "todo/write" else state

    def bomb(state: Any, event: Event) -> Any:
        if armed["on"] and event.type == "todo/write":
            raise RuntimeError("boom")
        return state

    def unit(key: str, apply: Any, types: frozenset[str] | None = None) -> ProjectionDefinition:
        return ProjectionDefinition(
            key=key,
            state_version=1,
            init=lambda h, i: 0,
            apply=apply,
            validate_state=lambda s: None,
            event_types=types,
        )

    registry = ProjectionRegistry()
    for definition in (
        unit("before", count),
        unit("bomb", bomb),
        unit("after", count_todos, frozenset({"todo/write"})),
    ):
        registry.register(definition)
    events = generate_session(random.Random(3), 20)
    session = Session(message_projections=default_message_projections(), projections=registry)
    session.extend(events)
    boom = make_event("todo/write", 20, {"todos": []})
    try:
        session.append(boom)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the unit's error must propagate")
    proj = session.projections
    assert (proj.observed_seq("before"), proj.observed_seq("bomb"), proj.observed_seq("after")) == (
        20,
        19,
        19,
    )
    todos = sum(e.type == "todo/write" for e in events if e.is_known)
    known = sum(e.is_known for e in events)
    armed["on"] = False  # catching up later applies the event exactly once to each unit
    assert proj.state_of("before") == known + 1 and proj.state_of("after") == todos + 1
    session.append(make_event("todo/write", 21, {"todos": []}))
    assert proj.state_of("before") == known + 2 and proj.state_of("after") == todos + 2
