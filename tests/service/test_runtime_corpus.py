"""The runtime corpus through Kafka: views equal ``processor fold``, refusals equal its errors.

Every valid log of ``tests/corpus/valid`` and every per-event case of
``tests/corpus/invalid`` is produced line by line (as the runtime wrote it) to
the events topic of a real broker.  A valid session's views must equal the
offline fold of its file; an invalid one must be dead-lettered at the same seq
with the same rule ``processor fold`` names, its views frozen at the fold of
the prefix before that event.

The events topic carries no file header, so the service cannot know a log's
format version: cases that are invalid only because a v3 message sits in a v4
file (or the other way round) are not sent; see ``check_message_shape``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.client.views_reader import (
    materialize_views,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import CodecError, default_codec
from processor.core.errors import SessionError
from processor.core.events import parse_event
from processor.offline import fold_events, fold_file, session_output
from tests.corpus.make_corpus import V3_CASES
from tests.service.conftest import Stack, as_json
from tests.service.test_processor import dead_letters, wait_for_views

CORPUS = Path(__file__).parents[1] / "corpus"
VALID = sorted((CORPUS / "valid").glob("*/session*"))
#: Per-event invalid cases the service can judge without a file header.
INVALID = [
    p
    for p in sorted((CORPUS / "invalid").glob("*.jsonl"))
    if not p.with_suffix(".checkpoint.json").exists()
    and p.stem not in V3_CASES
    and "-in-v" not in p.stem
]


def _records(path: Path) -> list[Any]:
    from processor.files import read_bytes

    out = []
    for line in read_bytes(path).splitlines():
        raw = orjson.loads(line)
        if not (isinstance(raw, dict) and raw.get("type") == "session"):
            out.append(raw)
    return out


def _encoded(sid: str, records: list[Any]) -> list[bytes] | None:
    """The Avro records of a log, or None when the codec cannot carry one of them."""
    codec = default_codec()
    try:
        return [codec.encode_event(sid, raw) for raw in records]
    except CodecError:
        return None


def _produce_raw(stack: Stack, sid: str, values: list[bytes]) -> None:
    producer = stack.producer()
    for value in values:
        producer.produce(stack.config.topics.events, key=sid.encode(), value=value)
        producer.poll(0)
    assert producer.flush(30) == 0


def _fold_error(path: Path) -> SessionError:
    with pytest.raises(SessionError) as info:
        fold_file(path)
    return info.value


def test_avro_record_carries_every_runtime_event_losslessly() -> None:
    """The SessionEvent record needs no new version for the runtime's logs."""
    codec = default_codec()
    n = 0
    for path in VALID:
        for raw in _records(path):
            decoded = codec.decode_event(codec.encode_event("s", raw))
            assert decoded.to_event().to_bytes() == parse_event(raw).to_bytes()
            n += 1
    assert n > 200


@pytest.mark.kafka
def test_runtime_corpus_folds_through_kafka_as_processor_fold_does(stack: Stack) -> None:
    assert len(VALID) >= 5 and len(INVALID) >= 40
    expected: dict[str, Any] = {}
    for path in VALID:
        sid = f"valid-{path.parent.name}"
        values = _encoded(sid, _records(path))
        assert values is not None, path
        _produce_raw(stack, sid, values)
        expected[sid] = as_json(offline_equivalent(fold_file(path).output))
    refusals: dict[str, SessionError] = {}
    sent = []
    for path in INVALID:
        sid = f"invalid-{path.stem}"
        values = _encoded(sid, _records(path))
        refusals[sid] = _fold_error(path)
        if values is None:  # the writer's codec refuses the envelope before Kafka
            assert refusals[sid].rule in ("E-1", "E-2"), path.stem
            continue
        _produce_raw(stack, sid, values)
        sent.append(path)
    stack.run_processor(max_idle_s=4)
    wait_for_views(stack, expected, timeout=60)

    letters = {d.session_id: d for d in dead_letters(stack)}
    views = materialize_views(stack.config)
    assert len(sent) >= 40
    for path in sent:
        sid = f"invalid-{path.stem}"
        error = refusals[sid]
        rule = re.sub(r"^([A-Z])(\d+)-.*", r"\1-\2", path.stem)
        assert error.rule == rule, (path.stem, str(error))
        letter = letters[sid]
        assert letter.rule == rule, (path.stem, letter.rule, letter.reason, str(error))
        if letter.seq is not None and "seq-beyond" not in path.stem:
            # (a dead letter names the seq the record claims; fold its position)
            assert letter.seq == error.seq, (path.stem, letter.seq, error.seq)
        # the views stop at the fold of the prefix before the refused event
        prefix = [parse_event(raw) for raw in _records(path)[:-1]]
        if sid in views:
            got = as_json(session_fold_equivalent(views[sid]))
            want = as_json(offline_equivalent(session_output(fold_events(prefix))))
            assert got["status"] == "quarantined", got["status"]
            assert {k: v for k, v in got.items() if k != "status"} == {
                k: v for k, v in want.items() if k != "status"
            }, path.stem
