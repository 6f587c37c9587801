"""Issue 12's "Done when" as properties of the engine's output, whatever its wire format.

Written only against the interfaces the parted format keeps (design12.md):
views are read back through ``views_reader`` (``_Materializer``,
``session_fold_equivalent``), checkpoints through
``engine.checkpoints.latest_checkpoints``, and compared with the offline
fold.  For any generated logs (several sessions interleaved, compacting and
offloading images) and any batching:

- the views assembled from everything produced equal the offline fold;
- with both compacted topics simulated (last record per key, tombstones
  applied), a new owner restored at any cut and folding the tail ends where
  an uninterrupted fold ends, and so does a subscriber that reads the
  compacted views topic from offset zero;
- a follower that reads the views one transaction at a time, also one that
  starts from a compacted topic, only ever holds session snapshots equal to
  the offline fold of the log up to their ``asOfSeq``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.client.view_assembly import DECODED_CACHE_BYTES
from processor.client.views_reader import _Materializer, session_fold_equivalent
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.engine import Fate, Out
from processor.workload import generate_session
from tests.engine.kit import (
    CODEC,
    CONFIG,
    Harness,
    compacted,
    materialize,
    offline_fold,
    plain,
    restored_from,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
VIEWS = CONFIG.topics.views
#: session ids: one with a "/" (ids may contain it; the views key prefix is "<sid>/")
IDS = ("a", "team/b", "c")


@dataclass(frozen=True)
class Scenario:
    logs: dict[str, tuple[Event, ...]]
    steps: tuple[str, ...]  # the session of each folded event, in fold order
    commits: tuple[bool, ...]  # commit the batch after step i
    config: ServiceConfig

    def prefix(self, sid: str, seq: int) -> list[Event]:
        return [e for e in self.logs[sid] if e.seq <= seq]


@st.composite
def scenarios(draw: st.DrawFn, max_events: int = 80) -> Scenario:
    n = draw(st.integers(1, len(IDS)))
    logs: dict[str, tuple[Event, ...]] = {}
    for sid in IDS[:n]:
        rng = draw(st.randoms(use_true_random=False))
        length = draw(st.integers(1, max_events))
        # a small context budget: the agent compacts (replace ranges) within the log
        budget = draw(st.integers(5, 40))
        logs[sid] = tuple(generate_session(rng, length, context_budget=budget))
    steps = tuple(draw(st.permutations([sid for sid, log in logs.items() for _ in log])))
    commits = tuple(draw(st.lists(st.booleans(), min_size=len(steps), max_size=len(steps))))
    config = replace(
        CONFIG,
        transcript_page_size=draw(st.sampled_from([3, 8, 256])),
        max_view_bytes=draw(st.sampled_from([2_000, CONFIG.max_view_bytes])),
    )
    return Scenario(logs, steps, commits, config)


def play(h: Harness, sc: Scenario, start: int, stop: int) -> list[list[Out]]:
    """Fold steps [start, stop) of ``sc`` into ``h``; the records of each commit."""
    done = {sid: sum(1 for s in sc.steps[:start] if s == sid) for sid in sc.logs}
    transactions = []
    for i in range(start, stop):
        sid = sc.steps[i]
        event = sc.logs[sid][done[sid]]
        done[sid] += 1
        outcome = h.fold(h.event(sid, event))
        assert outcome.fate is Fate.APPLIED, (sid, event.seq, outcome)
        if sc.commits[i]:
            transactions.append(h.commit())
    transactions.append(h.commit())
    return transactions


def assert_views_equal_the_fold(views: dict[str, Any], sc: Scenario, sids: list[str]) -> None:
    for sid in sids:
        assert sid in views, f"no views of {sid}"
        assert plain(session_fold_equivalent(views[sid])) == offline_fold(list(sc.logs[sid])), sid


@SETTINGS
@given(scenarios())
def test_views_assembled_after_any_batching_equal_the_offline_fold(sc: Scenario) -> None:
    h = Harness(config=sc.config)
    play(h, sc, 0, len(sc.steps))
    assert_views_equal_the_fold(h.views(), sc, list(sc.logs))
    # a subscriber reading the compacted views topic from offset zero sees the same
    assert_views_equal_the_fold(materialize(compacted(h.topic(VIEWS))), sc, list(sc.logs))


@SETTINGS
@given(scenarios(), st.data())
def test_restore_from_compacted_topics_plus_the_tail_equals_the_offline_fold(
    sc: Scenario, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(sc.steps)), label="cut")
    h = Harness(config=sc.config)
    play(h, sc, 0, cut)
    r = restored_from(h, config=sc.config)
    play(r, sc, cut, len(sc.steps))
    # the compacted views of the first owner, then the new owner's output
    assert_views_equal_the_fold(r.views(), sc, list(sc.logs))
    assert_views_equal_the_fold(materialize(compacted(r.topic(VIEWS))), sc, list(sc.logs))
    # and a third owner restored from everything: nothing left to fold, the
    # last event of every session is an exact retry (the anchor holds)
    third = restored_from(r, config=sc.config)
    for sid, log in sc.logs.items():
        assert third.fold(third.event(sid, log[-1])).fate is Fate.DUPLICATE, sid


class _Follower:
    """A views subscriber that checks its sessions whenever a transaction ended."""

    def __init__(self, sc: Scenario, cache_bytes: int = DECODED_CACHE_BYTES) -> None:
        self.sc = sc
        self.reader = _Materializer(CODEC, None, None, cache_bytes)
        self.folds: dict[tuple[str, int], dict[str, Any]] = {}
        self.checked = 0

    def read(self, records: list[Out]) -> None:
        """Apply one transaction's (or a compacted topic's) views records, then check."""
        for o in records:
            if o.topic == VIEWS:
                self.reader.apply(o.key, o.value)
        for sid in sorted(self.reader.views):  # every session the reader holds
            self.check(sid)

    def check(self, sid: str) -> None:
        snapshot = plain(session_fold_equivalent(self.reader.views[sid]))
        seq = snapshot["asOfSeq"]
        if (sid, seq) not in self.folds:
            self.folds[(sid, seq)] = offline_fold(self.sc.prefix(sid, seq))
        assert snapshot == self.folds[(sid, seq)], (sid, seq)
        self.checked += 1


@SETTINGS
@given(scenarios(max_events=40), st.data())
def test_a_follower_only_ever_holds_snapshots_equal_to_the_fold_at_their_seq(
    sc: Scenario, data: st.DataObject
) -> None:
    h = Harness(config=sc.config)
    transactions = play(h, sc, 0, len(sc.steps))
    # a reader whose decoded cache is tiny (or off) re-decodes: same snapshots
    bound = data.draw(st.sampled_from([0, 3_000, DECODED_CACHE_BYTES]), label="cache bytes")
    follower = _Follower(sc, bound)
    for tx in transactions:
        follower.read(tx)
    assert follower.checked >= len(sc.logs)
    # a follower that starts later, from the compacted topic at offset zero
    k = data.draw(st.integers(0, len(transactions)), label="joins after transaction")
    late = _Follower(sc, bound)
    late.read(compacted([o for tx in transactions[:k] for o in tx if o.topic == VIEWS]))
    for tx in transactions[k:]:
        late.read(tx)
    assert_views_equal_the_fold(late.reader.views, sc, list(sc.logs))


def test_the_scenarios_compact_and_offload_images() -> None:
    """The generated logs do what the properties claim to cover."""
    types: set[str] = set()
    replaces = 0
    for seed in range(40):
        for e in generate_session(random.Random(seed), 60, context_budget=12):
            types.add(e.type)
            op = e.surface_op
            replaces += isinstance(op, Mapping) and op.get("op") == "replace"
    assert "image/offload" in types and replaces > 0


def test_the_views_reader_bounds_its_decoded_cache_and_reports_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logs = {f"s{i}": generate_session(random.Random(i), 150, context_budget=30) for i in range(3)}
    h = Harness()
    for step in range(150):
        for sid, log in logs.items():
            h.fold(h.event(sid, log[step]))
        h.commit()
    records = [o for o in h.topic(VIEWS)]
    roomy = _Materializer(CODEC, None, None)
    for o in records:
        roomy.apply(o.key, o.value)
    assert roomy.parted.cache.evictions == 0 and roomy.parted.cache.bytes > 20_000
    caplog.set_level("WARNING", logger="processor.client")
    small = _Materializer(CODEC, None, None, cache_bytes=20_000)
    for o in records:
        small.apply(o.key, o.value)
    cache = small.parted.cache
    assert cache.evictions > 0 and cache.bytes <= 20_000
    bound_logs = [r for r in caplog.records if "decoded cache reached its bound" in r.message]
    assert len(bound_logs) == 1  # once, not per eviction
    for sid, log in logs.items():
        assert plain(session_fold_equivalent(small.views[sid])) == offline_fold(log), sid
        assert small.views[sid] == roomy.views[sid]
    # a session tombstone gives its cached values back
    small.apply(b"s0/~h", None)
    assert all(key[0] != "s0" for key in cache._values)
