"""The conformance corpus (clients/conformance/views/) against the Python reader."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.conformance.corpus import check_case

CORPUS = Path(__file__).resolve().parents[2] / "clients" / "conformance" / "views"
CASES = sorted(CORPUS.glob("*.json"))


def test_the_corpus_is_there_and_covers_every_kind() -> None:
    covered: set[str] = set()
    for path in CASES:
        covered |= set(orjson.loads(path.read_bytes())["covers"])
    needed = {"compaction", "confluent", "format-1", "format-2", "format-3", "incomplete"}
    needed |= {"override", "quarantine", "rebuild", "split", "tombstone", "units"}
    assert needed <= covered, f"no case covers {sorted(needed - covered)}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_python_reader_passes_the_case(path: Path) -> None:
    assert check_case(orjson.loads(path.read_bytes())) == []
