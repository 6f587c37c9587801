"""The big equivalences, for every prefix of generated valid logs (hypothesis).

live manager == offline fold (G-5, S-9); a checkpoint at any seq k restored
over the tail == the full fold (P-5..P-9 and the surface checkpoint); a log
shortened below a checkpoint's watermark is refused, never served stale.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.errors import SessionError
from processor.core.session import Session
from processor.core.surface import SurfaceManager, fold_surface
from processor.offline import fold_events, restore_session, session_output
from processor.workload import generate_session

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(2, 90))
def test_G5_live_manager_equals_offline_fold_for_every_prefix(rng: random.Random, n: int) -> None:
    events = generate_session(rng, n)
    registry = default_message_projections()
    manager = SurfaceManager(registry)
    for i, event in enumerate(events):
        manager.validate_next(event)
        manager.commit(event)
        offline = fold_surface(events[: i + 1], registry)
        assert tuple(manager.nodes) == offline.nodes
        assert manager.replace_generation == offline.replace_generation
        assert manager.content_generation == offline.content_generation
        assert tuple(manager.state.replacements) == offline.replacements
        assert dict(manager.state.overrides) == dict(offline.projected)


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(2, 80))
def test_live_session_equals_offline_fold_for_every_prefix(rng: random.Random, n: int) -> None:
    events = generate_session(rng, n)
    live = Session(
        message_projections=default_message_projections(), projections=default_registry()
    )
    for i, event in enumerate(events):
        live.validate(event)
        live.append(event)
        if i % 7 == 0 or i == n - 1:
            assert as_json(session_output(live)) == as_json(
                session_output(fold_events(events[: i + 1]))
            )


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(2, 80), st.data())
def test_checkpoint_at_any_seq_plus_tail_equals_full_fold(
    rng: random.Random, n: int, data: st.DataObject
) -> None:
    events = generate_session(rng, n)
    k = data.draw(st.integers(0, n - 1), label="checkpoint after seq")
    end = data.draw(st.integers(k, n - 1), label="prefix end")
    cp = as_json(fold_events(events[: k + 1]).checkpoint())  # through JSON, as stored
    restored = restore_session(cp, events[: end + 1])
    expected = fold_events(events[: end + 1])
    assert as_json(session_output(restored)) == as_json(session_output(expected))
    # and it keeps folding like the original afterwards
    for event in events[end + 1 :]:
        restored.append(event)
        expected.append(event)
    assert as_json(session_output(restored)) == as_json(session_output(expected))


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(3, 60), st.data())
def test_log_shortened_below_checkpoint_is_refused(
    rng: random.Random, n: int, data: st.DataObject
) -> None:
    events = generate_session(rng, n)
    k = data.draw(st.integers(1, n - 1))
    cp = as_json(fold_events(events[: k + 1]).checkpoint())
    cut = data.draw(st.integers(0, k - 1))
    with pytest.raises(SessionError, match="anchor"):
        restore_session(cp, events[: cut + 1])


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(3, 60), st.data())
def test_rewritten_anchor_event_is_refused(rng: random.Random, n: int, data: st.DataObject) -> None:
    events = generate_session(rng, n)
    k = data.draw(st.integers(1, n - 1))
    cp = as_json(fold_events(events[: k + 1]).checkpoint())
    other = generate_session(random.Random(rng.random()), n)
    if other[k].same_as(events[k]):
        return
    with pytest.raises(SessionError, match="anchor"):
        restore_session(cp, [*events[:k], other[k]])
