"""``processor fold``: output shape, --at, --from-checkpoint, and the invalid corpus."""

from __future__ import annotations

import random
import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from processor.cli.main import cli
from processor.files import write_session_file
from processor.workload import generate_session

CORPUS = sorted((Path(__file__).parent.parent / "corpus" / "invalid").glob("*.jsonl"))
EXAMPLE = Path(__file__).parents[2] / "processor" / "examples" / "session.jsonl"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["fold", *args])
    return result.exit_code, result.stdout, result.stderr


def test_corpus_covers_enough_distinct_violations() -> None:
    families = {p.name.split("-")[0][0] for p in CORPUS}
    assert len(CORPUS) >= 25 and {"D", "S", "M", "P"} <= families


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_invalid_log_exits_1_with_seq_and_rule(path: Path) -> None:
    checkpoint = path.with_suffix(".checkpoint.json")
    extra = ["--from-checkpoint", str(checkpoint)] if checkpoint.exists() else []
    code, out, err = run(str(path), *extra)
    rule = re.sub(r"^([A-Z])(\d+)-.*", r"\1-\2", path.stem)
    assert code == 1, err
    assert out == ""
    line = err.strip()
    if checkpoint.exists():  # P cases: the seq the checkpoint needed
        assert re.fullmatch(rf"seq \d+: .+ \({rule}\)", line), line
        return
    lines = path.read_bytes().splitlines()
    last = orjson.loads(lines[-1])
    # a line whose seq is unusable is named by its position (the seq it must have)
    seq = last["seq"] if type(last["seq"]) is int and last["seq"] < 2**53 else len(lines) - 2
    assert re.fullmatch(rf"seq {seq}: .+ \({rule}\)", line), line


def test_fold_prints_every_part(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl.zst"
    events = generate_session(random.Random(3), 300)
    write_session_file(log, None, events)
    code, out, err = run(str(log), "--compact")
    assert code == 0, err
    doc = orjson.loads(out)
    assert set(doc) == {"asOfSeq", "surface", "messages", "transcript", "projections",
                        "checkpoint"}
    assert doc["asOfSeq"] == 299
    assert set(doc["surface"]) == {"nodes", "replaceGeneration", "contentGeneration"}
    assert {"turnBoundary", "toolHistory", "requestHeader", "sessionStats", "inbox"} <= set(
        doc["projections"])


def test_fold_at_folds_only_the_prefix(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    events = generate_session(random.Random(4), 200)
    write_session_file(log, None, events)
    with log.open("ab") as fh:
        fh.write(b"{not json}\n")  # damage after the prefix does not matter
    code, out, err = run(str(log), "--at", "120", "--compact")
    assert code == 0, err
    write_session_file(tmp_path / "p.jsonl", None, events[:121])
    assert orjson.loads(out) == orjson.loads(run(str(tmp_path / "p.jsonl"), "--compact")[1])


@pytest.mark.parametrize("kind", ["rows", "fold-output", "session"])
def test_from_checkpoint_prints_the_same_result(tmp_path: Path, kind: str) -> None:
    log = tmp_path / "s.jsonl"
    events = generate_session(random.Random(5), 400)
    write_session_file(log, None, events)
    full = orjson.loads(run(str(log), "--compact")[1])
    cp_file = tmp_path / "cp.json"
    code, out, _ = run(str(log), "--at", "250", "--compact", "--write-checkpoint",
                       str(tmp_path / "session-cp.json"))
    assert code == 0
    if kind == "rows":
        cp_file.write_bytes(orjson.dumps(orjson.loads(out)["checkpoint"]))
    elif kind == "fold-output":
        cp_file.write_bytes(out.encode())
    else:
        cp_file = tmp_path / "session-cp.json"
    code, out, err = run(str(log), "--from-checkpoint", str(cp_file), "--compact")
    assert code == 0, err
    assert orjson.loads(out) == full


def test_from_checkpoint_refuses_a_shortened_log(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    events = generate_session(random.Random(6), 300)
    write_session_file(log, None, events)
    run(str(log), "--compact", "--write-checkpoint", str(tmp_path / "cp.json"))
    write_session_file(log, None, events[:200])
    code, out, err = run(str(log), "--from-checkpoint", str(tmp_path / "cp.json"))
    assert code == 1 and out == ""
    assert "anchor" in err


def test_torn_tail_is_reported_with_offset(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    events = generate_session(random.Random(8), 20)
    write_session_file(log, None, events)
    size = log.stat().st_size
    with log.open("ab") as fh:
        fh.write(b'{"type": "user/mess')
    code, _, err = run(str(log))
    assert code == 1 and f"torn last line at byte offset {size}" in err
    code, out, _ = run(str(log), "--drop-torn-tail", "--compact")
    assert code == 0 and orjson.loads(out)["asOfSeq"] == 19


def test_unsupported_header_version_says_so(tmp_path: Path) -> None:
    log = tmp_path / "session.v9.jsonl"
    log.write_bytes(orjson.dumps({"type": "session", "version": 9, "id": "x", "createdAt": 0,
                                  "isSeeded": False, "delegationDepth": 0}) + b"\n")
    code, _, err = run(str(log))
    assert code == 1 and "unsupported session format version 9" in err


def test_example_log_folds() -> None:
    code, out, err = run(str(EXAMPLE), "--compact")
    assert code == 0, err
    assert orjson.loads(out)["asOfSeq"] > 20
