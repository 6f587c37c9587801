"""settle_heap: held sessions leave the collector's sight, new cycles are still collected."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator

import pytest

from processor.gcpolicy import settle_heap
from processor.offline import fold_events
from processor.workload import generate_session


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_settled_sessions_are_not_traversed_and_later_cycles_are_collected(
    unfrozen: None,
) -> None:
    sessions = [fold_events(generate_session(random.Random(i), 30)) for i in range(20)]
    state = sessions[-1].projections.state_of("sessionStats")
    assert gc.is_tracked(state) and _tracked(state)
    assert settle_heap() > 0
    assert not _tracked(state)  # a full collection no longer walks it

    class Node:
        ref: object = None

    a, b = Node(), Node()
    a.ref, b.ref = b, a
    del a, b
    assert gc.collect() >= 2  # garbage made after settling is still found
