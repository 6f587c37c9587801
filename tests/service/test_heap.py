"""The loop's collector policy (heap.py): thresholds while running, a freeze per commit."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from processor.service.loop.heap import THRESHOLDS, HeapPolicy


@pytest.fixture
def clean_gc() -> Iterator[None]:
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()  # an in-process `processor fold` (cli tests) may have turned it off
    yield
    gc.unfreeze()
    gc.set_threshold(*saved)
    if not enabled:
        gc.disable()


class Node:
    ref: object = None


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_thresholds_are_raised_while_running_and_given_back(clean_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    heap = HeapPolicy()
    heap.start()
    assert gc.get_threshold() == THRESHOLDS
    heap.committed()
    assert gc.get_freeze_count() > 0
    heap.stop()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0  # what the run froze is collectable again


def test_higher_thresholds_of_the_process_are_kept(clean_gc: None) -> None:
    gc.set_threshold(100_000, 50, 100)
    heap = HeapPolicy()
    heap.start()
    assert gc.get_threshold() == (100_000, 50, 100)
    heap.stop()
    assert gc.get_threshold() == (100_000, 50, 100)


def test_a_commit_frees_the_batch_cycles_and_freezes_what_lives(clean_gc: None) -> None:
    held = [{"event": i, "payload": [i, str(i)]} for i in range(1000)]  # session state
    a, b = Node(), Node()
    a.ref, b.ref = b, a  # garbage of the batch, in a cycle
    gone = weakref.ref(a)
    del a, b
    heap = HeapPolicy()
    heap.committed()
    assert gone() is None  # collected before the freeze: nothing dead is kept
    assert not _tracked(held[-1])  # a full collection no longer walks the held state
    assert heap.settles == 1
    c, d = Node(), Node()  # cycles after the commit are collected as usual
    c.ref, d.ref = d, c
    later = weakref.ref(c)
    del c, d
    gc.collect()
    assert later() is None


def test_nothing_is_frozen_while_the_collector_is_off(clean_gc: None) -> None:
    gc.disable()
    try:
        held = [Node()]
        HeapPolicy().committed()
        assert _tracked(held[0])
    finally:
        gc.enable()
