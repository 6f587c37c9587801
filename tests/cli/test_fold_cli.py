"""``processor fold``: output shape, --at, --from-checkpoint, and the invalid corpus."""

from __future__ import annotations

import random
import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import processor
from processor.cli.main import cli
from processor.files import write_session_file
from processor.workload import generate_session

CORPUS = sorted((Path(__file__).parent.parent / "corpus" / "invalid").glob("*.jsonl"))
# the imported package's (the installed wheel's in the compiled run)
EXAMPLE = Path(str(processor.__file__)).parent / "examples" / "session.jsonl"


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
    assert set(doc) == {"asOfSeq", "surface", "messages", "transcript", "projections", "checkpoint"}
    assert doc["asOfSeq"] == 299
    assert set(doc["surface"]) == {"nodes", "replaceGeneration", "contentGeneration"}
    assert {"turnBoundary", "toolHistory", "requestHeader", "sessionStats", "inbox"} <= set(
        doc["projections"]
    )


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
    code, out, _ = run(
        str(log),
        "--at",
        "250",
        "--compact",
        "--write-checkpoint",
        str(tmp_path / "session-cp.json"),
    )
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
    log.write_bytes(
        orjson.dumps(
            {
                "type": "session",
                "version": 9,
                "id": "x",
                "createdAt": 0,
                "isSeeded": False,
                "delegationDepth": 0,
            }
        )
        + b"\n"
    )
    code, _, err = run(str(log))
    assert code == 1 and "unsupported session format version 9" in err


def test_example_log_folds() -> None:
    code, out, err = run(str(EXAMPLE), "--compact")
    assert code == 0, err
    assert orjson.loads(out)["asOfSeq"] > 20


# ------------------------------------------------------------------ runtime logs

VALID = sorted((Path(__file__).parent.parent / "corpus" / "valid").glob("*/session*"))


@pytest.mark.parametrize("path", VALID, ids=[p.parent.name for p in VALID])
def test_valid_runtime_log_folds(path: Path) -> None:
    code, out, err = run(str(path), "--compact")
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["asOfSeq"] >= 6 and doc["messages"]


def test_valid_corpus_holds_every_vocabulary_type_in_both_forms() -> None:
    from processor.core.events import KNOWN_TYPES

    for case in ("every-type-v4", "every-type-v3"):
        path = next(p for p in VALID if p.parent.name == case)
        types = {orjson.loads(line).get("type") for line in path.read_bytes().splitlines()}
        assert types >= KNOWN_TYPES, sorted(KNOWN_TYPES - types)


def test_every_type_log_folds_to_the_runtime_units() -> None:
    path = next(p for p in VALID if p.parent.name == "every-type-v4")
    doc = orjson.loads(run(str(path), "--compact")[1])
    units = doc["projections"]
    assert units["title"] == "Fix the config loader"
    assert units["todos"] is None  # the second turn/start cleared the list
    assert units["plan"] == {"active": True, "pending": False}
    assert units["goal"]["goal"]["id"] == "g1"  # GL-1: the runtime's create folds
    assert "titleInput" not in units  # not a wire unit
    offloaded = [b for m in doc["messages"] for b in m["content"] if b.get("type") == "image"]
    assert offloaded == [] or all(b["offloaded"] is True for b in offloaded)


def _header(version: int, **extra: object) -> bytes:
    return (
        orjson.dumps(
            {
                "type": "session",
                "version": version,
                "id": "x",
                "createdAt": 0,
                "isSeeded": False,
                "delegationDepth": 0,
                **extra,
            }
        )
        + b"\n"
    )


@pytest.mark.parametrize("version", [0, 1, 2])
def test_older_format_versions_are_refused_naming_the_version(tmp_path: Path, version: int) -> None:
    from processor.files import log_filename

    log = tmp_path / log_filename(version)
    log.write_bytes(_header(version))
    code, _, err = run(str(log))
    assert code == 1 and f"session format v{version} is not read here" in err
    assert err.count("\n") == 1


FORMATS = sorted((Path(__file__).parent.parent / "corpus" / "formats").glob("*/session*"))


@pytest.mark.parametrize("path", FORMATS, ids=[p.parent.name for p in FORMATS])
def test_corpus_format_versions_outside_3_and_4_are_refused_naming_them(path: Path) -> None:
    version = int(path.parent.name[1:])
    code, out, err = run(str(path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert (
        f"session format v{version} is not read here" in err
        if version < 3
        else f"unsupported session format version {version}" in err
    ), err


@pytest.mark.parametrize(
    "extra,fragment",
    [
        ({"cwd": "relative/dir"}, "cwd must be an absolute path"),
        ({"sandboxMode": "x"}, "retired policy field(s): sandboxMode"),
        ({"origin": "human"}, "origin must be 'subagent'"),
        ({"createdAt": -1}, "createdAt must be a non-negative safe integer"),
        ({"delegationDepth": 2**53}, "delegationDepth must be a non-negative safe integer"),
    ],
)
def test_header_line_is_checked_as_the_runtime_does(
    tmp_path: Path, extra: dict[str, object], fragment: str
) -> None:
    log = tmp_path / "session.v4.jsonl"
    log.write_bytes(_header(4, **extra))
    code, _, err = run(str(log))
    assert code == 1 and fragment in err, err


def test_log_file_names_follow_the_runtime() -> None:
    from processor.files import log_filename, version_of_filename

    assert log_filename(0) == "session.jsonl"
    assert log_filename(4, compressed=True) == "session.v4.jsonl.zstd"
    assert [
        version_of_filename(n)
        for n in (
            "session.jsonl",
            "session.v3.jsonl",
            "session.v4.jsonl.zstd",
            "session.v4.jsonl.zst",
            "session.v04.jsonl",
            "session.v0.jsonl",
            "other.jsonl",
        )
    ] == [0, 3, 4, 4, None, None, None]


# ------------------------------------------------------------------ files that lose data


def _valid_bytes() -> bytes:
    path = next(p for p in VALID if p.parent.name == "every-type-v4")
    return path.read_bytes()


def test_truncated_zstd_is_refused(tmp_path: Path) -> None:
    import zstandard

    packed = zstandard.ZstdCompressor(level=3).compress(_valid_bytes())
    log = tmp_path / "session.v4.jsonl.zstd"
    log.write_bytes(packed[: len(packed) // 2])
    code, out, err = run(str(log))
    assert code == 1 and out == "" and "truncated zstd stream" in err
    assert err.count("\n") == 1


def test_corrupt_zstd_is_refused(tmp_path: Path) -> None:
    import zstandard

    packed = bytearray(zstandard.ZstdCompressor(level=3).compress(_valid_bytes()))
    packed[10:30] = b"\x00" * 20
    log = tmp_path / "session.v4.jsonl.zstd"
    log.write_bytes(bytes(packed))
    code, _, err = run(str(log))
    assert code == 1 and ("corrupt zstd data" in err or "truncated" in err), err


def test_byte_order_mark_is_named(tmp_path: Path) -> None:
    log = tmp_path / "session.v4.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + _valid_bytes())
    code, _, err = run(str(log))
    assert code == 1 and "byte-order mark" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "name,content", [("session.v4.jsonl", b""), ("session.v4.jsonl.zstd", None)]
)
def test_empty_file_is_reported(tmp_path: Path, name: str, content: bytes | None) -> None:
    import zstandard

    log = tmp_path / name
    log.write_bytes(content if content is not None else zstandard.ZstdCompressor().compress(b""))
    code, _, err = run(str(log))
    assert code == 1 and "empty file" in err


def test_oversized_line_is_refused_with_offset_and_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import processor.files as files

    monkeypatch.setattr(files, "MAX_LINE_BYTES", 4096)
    header = _header(4)
    big = b'{"type":"vendor/blob","seq":0,"time":0,"ignorable":true,"data":"' + b"x" * 5000
    log = tmp_path / "session.v4.jsonl"
    log.write_bytes(header + big + b'"}\n')
    code, _, err = run(str(log))
    assert code == 1 and err.count("\n") == 1
    assert f"line at byte offset {len(header)} is {len(big) + 2} bytes, over the 4096-byte" in err
