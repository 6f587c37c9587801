"""Write the views conformance corpus: ``python -m tests.conformance.make``.

Every case is a run of the processor's engine (the code the service runs,
without a broker: tests/engine/kit.py) whose views records are numbered as
a partition numbers them; :mod:`tests.conformance.corpus` adds what the
reader must show.  Healthy sessions are also checked against ``processor
fold`` before a case is written, so the expectations are not just the
reader agreeing with itself.  ``--check``: fail if a file would change.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from processor.client.views_reader import session_fold_equivalent
from processor.codec import Codec
from processor.codec.schemas import InMemorySchemaRegistry
from processor.core.events import Event
from processor.core.projection_registry import ProjectionDefinition, WireView
from processor.engine import Out
from processor.engine.replay_floor import replay_floor
from processor.workload import generate_session
from tests.conformance.corpus import Rec, build_case, compact, number
from tests.engine import kit
from tests.engine.format2 import format2
from tests.engine.kit import CONFIG, Harness, offline_fold, plain, restored_from

OUT = Path(__file__).resolve().parents[2] / "clients" / "conformance" / "views"
VIEWS = CONFIG.topics.views


def views_of(outs: list[Out]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(o.partition, o.key, o.value) for o in outs if o.topic == VIEWS]


def batches(
    h: Harness, sid: str, events: list[Event], sizes: list[int], partition: int = 0
) -> None:
    """Fold ``events`` in batches cycling through ``sizes``, one commit each."""
    i = k = 0
    while i < len(events):
        n = sizes[k % len(sizes)]
        h.fold_events(sid, events[i : i + n], partition)
        h.commit()
        i, k = i + n, k + 1


def fold_checked(records: list[Rec], expected: dict[str, list[Event]]) -> None:
    """The assembled views of each healthy session equal ``processor fold``."""
    views = kit.materialize([Out(VIEWS, r.partition, r.key, r.value) for r in records])
    for sid, events in expected.items():
        got = plain(session_fold_equivalent(views[sid]))
        assert got == offline_fold(events), f"{sid}: the views differ from processor fold"


def log(seed: int, n: int, **kw: Any) -> list[Event]:
    return generate_session(random.Random(seed), n, **kw)


# ------------------------------------------------------------------ cases


def case_sessions() -> dict[str, Any]:
    h = Harness(partitions=(0, 1))
    logs = {"s1": log(1, 50, context_budget=12), "team/a#1": log(2, 25), "p1": log(3, 30)}
    cursors = dict.fromkeys(logs, 0)
    sizes = [1, 5, 2, 9, 3]
    k = 0
    while any(cursors[s] < len(logs[s]) for s in logs):
        for sid, events in logs.items():
            n = sizes[k % len(sizes)]
            k += 1
            if cursors[sid] < len(events):
                h.fold_events(sid, events[cursors[sid] : cursors[sid] + n], 1 if sid == "p1" else 0)
                cursors[sid] += n
        h.commit()
    records = number(views_of(h.produced))
    fold_checked(records, logs)
    return build_case(
        "sessions",
        "Three sessions on two partitions (one id holds '/' and '#'), batches of 1 to 9 "
        "events, a surface that compacts (node chunks rewritten, bundles tombstoned): "
        "format 3 as the processor writes it today.",
        records,
    )


def case_compacted() -> dict[str, Any]:
    h = Harness()
    long_log, other = log(13, 160, context_budget=40), log(14, 30)
    for start in range(0, 160, 7):
        h.fold_events("s", long_log[start : start + 7])
        if start // 7 < 10:
            h.fold_events("o", other[3 * (start // 7) : 3 * (start // 7) + 3])
        h.commit()
    full = number(views_of(h.produced))
    # the cleaner's range ends inside a transaction: after its rewritten node
    # chunk, before its head (so the head before it names a chunk now gone)
    chunk = next(r for r in full[len(full) * 2 // 3 :] if r.key.endswith(b"/~n0"))
    cut = {0: chunk.offset + 1}
    records = compact(full, cut)
    fold_checked(records, {"s": long_log, "o": other})
    return build_case(
        "compacted",
        "A long session and a short one, read after the cleaner compacted the first two "
        "thirds of the partition (tombstones expired, offsets with gaps): old heads whose "
        "records were replaced are incomplete and skipped.",
        records,
        cuts=cut,
    )


def case_format2() -> dict[str, Any]:
    events = log(21, 70, context_budget=10)
    h = Harness()
    with format2():
        batches(h, "s", events[:45], [6])
    old = h.topic(VIEWS)
    r = restored_from(h)
    start = len(r.produced)
    batches(r, "s", events[45:], [6])
    records = number(views_of([*old, *r.produced[start:]]))
    fold_checked(records, {"s": events})
    return build_case(
        "format-2-then-3",
        "A session written in format 2 (a record ~m<seq> per message, heads without f), "
        "then taken over by a processor writing format 3 (bundles).",
        records,
    )


class Blob:
    """A unit whose view grows and shrinks: big, hard-to-compress values."""

    SIZES = (40, 5000, 9000, 3000, 40, 7000, 60)

    def __init__(self) -> None:
        self.definition = ProjectionDefinition(
            "blob",
            2,
            lambda header, inherited: {"n": 0},
            self.apply,
            lambda state: None,
            WireView(self.view, lambda view: None),
        )

    @staticmethod
    def apply(state: Any, event: Event) -> Any:
        return {"n": state["n"] + 1}

    @classmethod
    def view(cls, state: Any) -> Any:
        n = state["n"]
        size = cls.SIZES[(n // 6) % len(cls.SIZES)]
        seed = hashlib.sha256(str(n // 6).encode()).digest()
        text = b"".join(
            hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(size // 32 + 1)
        )
        return {"n": n // 6, "data": text.hex()[:size]}


def case_split() -> dict[str, Any]:
    config = replace(CONFIG, max_view_bytes=2048)
    h = Harness(config=config)
    h.engine.registry.register(Blob().definition)
    events = log(31, 60)
    batches(h, "s", events[:24], [3])
    r = restored_from(h, config=config)  # a restart: the parts count must survive it
    r.engine.registry.register(Blob().definition)
    start = len(r.produced)
    batches(r, "s", events[24:], [3])
    records = number(views_of([*h.topic(VIEWS), *r.produced[start:]]))
    return build_case(
        "split-units",
        "A unit view that grows to several parts and shrinks again (max_view_bytes 2048), "
        "across a restart of the processor: parts left over by a shrink are tombstoned.",
        records,
    )


def case_quarantine() -> dict[str, Any]:
    h = Harness()
    events, good = log(41, 20), log(42, 20)
    h.fold_events("bad", events[:6])
    h.fold_events("good", good[:6])
    h.commit()
    h.fold(h.record(b"bad", b"\x00not avro"))
    h.fold_events("bad", events[6:9])
    h.fold_events("good", good[6:])
    h.commit()
    records = number(views_of(h.produced))
    fold_checked(records, {"good": good})
    return build_case(
        "quarantine",
        "A session quarantined by an undecodable event (its head carries q, its views "
        "stay at the last good seq) beside a healthy one that keeps flowing.",
        records,
    )


def case_rebuild() -> dict[str, Any]:
    events = log(51, 60, context_budget=15)
    h = Harness()
    batches(h, "s", events[:45], [7])
    batches(h, "keep", log(52, 10), [10])
    cp = h.checkpoints()["s"]
    h.engine.tombstone_session(0, "s", cp)
    h.commit()
    fresh = Harness()
    batches(fresh, "s", events[:30], [9])
    records = number(views_of([*h.produced, *fresh.produced]))
    return build_case(
        "rebuild",
        "A session rebuilt from offset zero (its log changed): every record of it is "
        "tombstoned, the head first among its core records, then it is folded again "
        "to a lower seq.",
        records,
    )


def case_replay() -> dict[str, Any]:
    events = log(61, 50, context_budget=20)
    h = Harness()
    batches(h, "s", events, [5, 11])
    floors = {sid: replay_floor(0, sid, cp, CONFIG) for sid, cp in h.checkpoints().items()}
    replayed = Harness(publish_floor=floors)
    batches(replayed, "s", events, [13])
    records = number(views_of([*h.produced, *replayed.produced]))
    fold_checked(records, {"s": events})
    return build_case(
        "replay",
        "An in-place processor replay: the session's views are held back until the "
        "refold reaches the seq it had, then published again; written-once records "
        "are never rewritten with other contents, and no record is left behind.",
        records,
    )


def format1_records(events: list[Event], sid: str, ps: int) -> list[tuple[int, bytes, bytes]]:
    """What a format-1 processor published for ``events``: every view whole."""
    from processor.codec import View, encode_json_payload
    from processor.core.builtin import default_registry
    from processor.offline import fold_events, session_output

    doc = session_output(fold_events(events))
    seq = doc["asOfSeq"]
    entries = plain(doc["transcript"])
    pages = -(-len(entries) // ps)
    views: dict[str, tuple[int, Any]] = {
        "messages": (-1, doc["messages"]),
        "surface": (-1, doc["surface"]),
        "transcript": (-1, {"total": len(entries), "pageSize": ps, "pages": pages}),
        **{f"transcript.{p}": (-1, entries[p * ps : (p + 1) * ps]) for p in range(pages)},
    }
    versions = {d.key: d.state_version for d in default_registry().definitions()}
    views |= {k: (versions[k], v) for k, v in doc["projections"].items()}
    views["status"] = (-1, {"state": "ok", "lastSeq": seq})
    out = []
    for name, (version, value) in views.items():
        encoding, payload = encode_json_payload(
            plain(value), threshold=kit.CODEC.compress_threshold
        )
        record = View(sid, name, seq, version, encoding, payload)
        out.append((0, f"{sid}/{name}".encode(), kit.CODEC.encode_view(record)))
    return out


def case_format1() -> dict[str, Any]:
    """Format 1, then a processor restoring its whole checkpoint and going on in parts."""
    from processor.engine.checkpoints import latest_checkpoints
    from tests.engine.test_parts import _v1_checkpoint

    events = log(81, 90, context_budget=30)
    ps = 8
    config = replace(CONFIG, transcript_page_size=ps)
    h = Harness(config=config)
    h.fold_events("s", events[:60])
    written = [*format1_records(events[:30], "s", ps), *format1_records(events[:60], "s", ps)]
    rt = h.engine.partitions[0].sessions["s"]
    closed = rt.session.transcript_count // ps * ps
    rt.session.drop_transcript_before(closed)  # format 1 kept only the open page
    v1 = kit.CODEC.encode_checkpoint(_v1_checkpoint(h, "s"))
    restored = latest_checkpoints(kit.CODEC, [(b"s", v1)])
    r = Harness(config=config, checkpoints={0: restored.checkpoints})
    batches(r, "s", events[60:], [8])
    records = number([*written, *views_of(r.produced)])
    fold_checked(records, {"s": events})
    return build_case(
        "format-1-then-parted",
        "A session whose views a format-1 processor wrote whole (messages, surface, status, "
        "transcript, transcript.<n>), then taken over in parts: the format-1 core views "
        "are tombstoned, the closed format-1 pages stay and the head counts them in tb.",
        records,
    )


@contextmanager
def confluent_codec(registry: InMemorySchemaRegistry) -> Iterator[Codec]:
    saved = kit.CODEC
    kit.CODEC = Codec("confluent", resolver=registry)
    try:
        yield kit.CODEC
    finally:
        kit.CODEC = saved


def case_confluent() -> dict[str, Any]:
    registry = InMemorySchemaRegistry(first_id=7)
    events = log(71, 40)
    with confluent_codec(registry) as codec:
        h = Harness()
        batches(h, "s", events, [4, 9])
        records = number(views_of(h.produced))
        fold_checked(records, {"s": events})
    return build_case(
        "confluent",
        "The views of a processor configured with a schema registry: values in the "
        "Confluent wire format (00, schema id, body); the registry's schemas are in "
        "`registry`.",
        records,
        codec=codec,
        registry=registry,
    )


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "sessions": case_sessions,
    "compacted": case_compacted,
    "format-1-then-parted": case_format1,
    "format-2-then-3": case_format2,
    "split-units": case_split,
    "quarantine": case_quarantine,
    "rebuild": case_rebuild,
    "replay": case_replay,
    "confluent": case_confluent,
}


def render(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a case would change")
    parser.add_argument("cases", nargs="*", help="only these cases")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, make in CASES.items():
        if args.cases and name not in args.cases:
            continue
        data = render(make())
        path = OUT / f"{name}.json"
        if args.check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(name)
            continue
        path.write_bytes(data)
        print(f"{path.name}: {len(data)} bytes")
    if stale:
        print(f"stale cases (run python -m tests.conformance.make): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
