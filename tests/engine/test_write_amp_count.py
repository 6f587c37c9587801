"""The write-amplification bench counts exactly what the engine produces (issue 12).

``bench.write_amp.simulate`` drops records as it counts them; here the same
logs go through the test harness, which keeps them, and the totals agree.
"""

from __future__ import annotations

import random

from bench.write_amp import simulate
from processor.workload import generate_session, prose
from tests.engine.kit import CONFIG, Harness


def test_the_bench_counts_every_record_the_engine_produces() -> None:
    logs = {
        sid: generate_session(
            random.Random(seed), 40, big_result_bytes=500, big_ratio=1.0, words=True
        )
        for seed, sid in enumerate(("a", "b"))
    }
    [point] = simulate(logs, [40], compress=lambda b: b)
    h = Harness()
    sizes = {"events": 0, "checkpoints": 0, "views": 0}
    for i in range(40):
        for sid, log in logs.items():
            rec = h.event(sid, log[i])
            sizes["events"] += len(rec.key or b"") + len(rec.value or b"")
            h.fold(rec)
        h.commit()
    topics = CONFIG.topics
    for name, topic in (("checkpoints", topics.checkpoints), ("views", topics.views)):
        sizes[name] = sum(len(o.key or b"") + len(o.value or b"") for o in h.topic(topic))
        assert point.topics[name].records == len(h.topic(topic))
    assert {k: v.raw for k, v in point.topics.items()} == sizes
    assert point.topics["events"].records == 80


def test_prose_is_words_of_the_asked_size() -> None:
    text = prose(random.Random(1), 10_000)
    assert len(text) == 10_000
    assert len(set(text.split())) > 500  # not "x" * n: it does not compress to nothing
