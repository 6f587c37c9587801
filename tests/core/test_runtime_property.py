"""Every log the workload generator writes passes the runtime's load checks.

The checker (:mod:`tests.corpus.runtime_checker`) is written from the
runtime's load path without the fold's code, so this holds the generator (and
with it the examples and benches built on it) to the runtime, not to us.  The
invalid corpus cross-checks the checker against the fold: both refuse the same
event of every envelope and data-check case.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.files import read_session_file
from processor.workload import generate_session
from tests.corpus.runtime_checker import check_log

CORPUS = Path(__file__).parent.parent / "corpus"


def _records(events: list) -> list:
    return [orjson.loads(e.to_bytes()) for e in events]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400), form=st.sampled_from([3, 4]))
def test_workload_logs_pass_the_runtime_load_checks(seed: int, n: int, form: int) -> None:
    records = _records(generate_session(random.Random(seed), n, form=form))
    assert check_log(records, form) is None
    assert check_log(records, None) is None  # a header-less reader accepts both forms


def test_long_workload_logs_pass_the_runtime_load_checks() -> None:
    for form in (3, 4):
        records = _records(generate_session(random.Random(form), 5000, form=form))
        assert check_log(records, form) is None


def _invalid_cases() -> list[Path]:
    """Corpus cases of the per-event load checks (E-1/2/4/5, D-1/2/4..7)."""
    out = []
    for path in sorted((CORPUS / "invalid").glob("*.jsonl")):
        if re.match(r"(E[1245]|D[124567])-", path.stem):
            out.append(path)
    return out


@pytest.mark.parametrize("path", _invalid_cases(), ids=lambda p: p.stem)
def test_checker_and_fold_refuse_the_same_event(path: Path) -> None:
    lines = path.read_bytes().splitlines()
    header = orjson.loads(lines[0])
    records = [orjson.loads(line) for line in lines[1:]]
    found = check_log(records, header["version"])
    assert found is not None and found[0] == len(records) - 1, found


def test_checker_accepts_the_valid_corpus() -> None:
    paths = sorted((CORPUS / "valid").glob("*/session*"))
    assert paths
    for path in paths:
        file = read_session_file(path)
        assert check_log(_records(file.events), file.dialect) is None, path.name
