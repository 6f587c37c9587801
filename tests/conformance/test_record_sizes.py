"""VF-7: every derived record fits under the bound (docs/views-format.md, section 11).

Hostile but valid input: request headers with a few hundred KB of
incompressible tool descriptions each (every event under 1 MB).  The
checkpoint's ``toolHistory`` unit row keeps the tools of every request
header (its view is split, the row is not), so it outgrows any bound.  The
processor refuses that one session (a ``VF-7`` dead letter, quarantined at
its last committed checkpoint); an ordinary session in the same partition
keeps flowing.
"""

from __future__ import annotations

import base64
import random

import orjson

from processor.codec import Checkpoint
from processor.config import ServiceConfig
from processor.core.events import Event, parse_event
from processor.engine.record_bounds import (
    FRAMING_MARGIN,
    TOPIC_MAX_MESSAGE_BYTES,
    record_bound,
    record_size,
)
from processor.kafka.clients import output_settings
from processor.kafka.topic_admin import topic_specs
from processor.workload import generate_session
from tests.engine.kit import CODEC, CONFIG, Harness, offline_fold, plain, session_log


def hostile_log(
    seed: int, n: int, description: int = 350_000, tools: int = 2, every_result: int = 0
) -> list[Event]:
    """A valid session whose request headers carry big incompressible tool text
    (``tools`` of each header), and every ``every_result``-th tool result too."""
    rng = random.Random(seed)
    out = []
    results = 0
    for event in generate_session(random.Random(seed), n):
        raw = orjson.loads(orjson.dumps(event.to_json()))
        if event.type == "request/header":
            for tool in raw["data"]["header"].get("tools", [])[:tools]:
                tool["description"] = noise(rng, description)
        elif event.type == "tool/result" and every_result:
            results += 1
            if results % every_result == 0:
                for block in raw["data"]["message"]["content"]:
                    if block.get("type") == "text":
                        block["text"] = noise(rng, description)
        out.append(parse_event(raw))
    return out


def noise(rng: random.Random, size: int) -> str:
    """``size`` random bytes as base64: text no compression shrinks much."""
    return base64.b64encode(rng.randbytes(size)).decode()


class Committed:
    """The committed checkpoints topic as the service's store serves it."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    def load(self, partition: int, session_id: str) -> tuple[Checkpoint | None, int]:
        return self.h.checkpoints().get(session_id), 0


def test_VF7_every_derived_record_fits_under_the_bound() -> None:
    events = hostile_log(22, 400)
    assert all(len(CODEC.encode_parsed_event("s", e)) < 1_000_000 for e in events)
    good = session_log(400, seed=5)
    h = Harness()
    h.engine.partitions[0].source = Committed(h)
    bound = record_bound(CONFIG)
    for start in range(0, len(events), 20):
        h.fold_events("s", events[start : start + 20])
        h.fold_events("g", good[start : start + 20])
        h.commit()
    over = [(o.topic, o.key, record_size(o)) for o in h.produced if record_size(o) > bound]
    assert not over, f"records over {bound} bytes: {over[:3]}"

    # the hostile session is refused visibly, at its last committed seq
    letters = [d for d in h.dead_letters() if d.rule == "VF-7"]
    assert len(letters) == 1, [(d.seq, d.rule) for d in h.dead_letters()]
    letter = letters[0]
    assert letter.session_id == "s" and letter.seq is not None
    assert f"seq {letter.seq}: derived record" in letter.reason
    views = h.views()
    status = views["s"]["status"].value
    assert status["state"] == "quarantined" and status["quarantine"]["rule"] == "VF-7"
    at = status["lastSeq"]
    assert at < letter.seq
    expected = offline_fold([e for e in events if e.seq <= at])
    expected["status"] = "quarantined"
    assert plain(h.fold_equivalent("s")) == expected
    later = [d for d in h.dead_letters() if d.rule == "QUARANTINED"]
    assert later and all(d.seq is not None and d.seq > letter.seq for d in later)
    # its restored checkpoint says so too
    assert h.checkpoints()["s"].surface["service"]["quarantine"]["rule"] == "VF-7"

    # the ordinary session of the partition flowed to its end
    assert views["g"]["status"].value == {"state": "ok", "lastSeq": good[-1].seq}
    assert plain(h.fold_equivalent("g")) == offline_fold(good)


def test_VF7_the_producer_and_the_topics_agree_on_the_bound() -> None:
    """The output producer sends what the topics take; the bound is below both."""
    conf = output_settings(CONFIG, "x")
    compacted = [s for s in topic_specs(CONFIG) if s.configs.get("cleanup.policy") == "compact"]
    assert compacted
    for spec in compacted:
        assert int(spec.configs["max.message.bytes"]) == TOPIC_MAX_MESSAGE_BYTES
    assert int(conf["message.max.bytes"]) == TOPIC_MAX_MESSAGE_BYTES
    assert record_bound(CONFIG) == TOPIC_MAX_MESSAGE_BYTES - FRAMING_MARGIN
    assert record_bound(CONFIG) > CONFIG.max_view_bytes  # split views always fit
    # a configured producer limit lowers the bound with it
    small = ServiceConfig(kafka={"message.max.bytes": "1000000"})
    assert output_settings(small, "x")["message.max.bytes"] == "1000000"
    assert record_bound(small) == 1_000_000 - FRAMING_MARGIN


def test_VF7_a_session_refused_in_its_first_batch_shows_its_quarantine() -> None:
    """Nothing committed to go back to: its status says so, it gets no checkpoint."""
    events = hostile_log(22, 400)
    good = session_log(60, seed=5)
    h = Harness()
    h.engine.partitions[0].source = Committed(h)
    h.fold_events("s", events)
    h.fold_events("g", good)
    h.commit()
    h.fold_events("s", hostile_log(22, 410)[400:])
    h.commit()
    bound = record_bound(CONFIG)
    assert all(record_size(o) <= bound for o in h.produced)
    rules = [(d.rule, d.seq) for d in h.dead_letters() if d.session_id == "s"]
    assert rules[0] == ("VF-7", events[-1].seq) and len(rules) == 11
    assert all(rule == "QUARANTINED" for rule, _ in rules[1:])
    status = h.views()["s"]["status"].value
    assert status["state"] == "quarantined" and status["lastSeq"] == -1
    assert status["quarantine"]["rule"] == "VF-7"
    assert "s" not in h.checkpoints()
    assert plain(h.fold_equivalent("g")) == offline_fold(good)


def test_VF7_without_a_store_the_refused_session_is_quarantined_in_memory() -> None:
    """No committed state to go back to (no source, or its store failing): the
    session writes nothing more, its later events are dead-lettered."""
    events = hostile_log(22, 400)
    h = Harness()
    h.fold_events("s", events[:100])
    h.commit()
    published = len(h.produced)
    h.fold_events("s", events[100:])
    h.commit()
    h.fold_events("s", hostile_log(22, 405)[400:])
    h.commit()
    bound = record_bound(CONFIG)
    assert all(record_size(o) <= bound for o in h.produced)
    later = h.produced[published:]
    assert {o.topic for o in later} == {CONFIG.topics.dlq}
    rules = [d.rule for d in h.dead_letters()]
    assert rules == ["VF-7"] + ["QUARANTINED"] * 5
    assert "in memory only" in h.dead_letters()[0].reason
