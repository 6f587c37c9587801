"""``processor fold`` as a process: it leaves without freeing the folded session.

The command prints, flushes and ends with ``os._exit`` (processor/cli/
quick_exit.py), so interpreter teardown (atexit handlers, freeing every kept
event) never runs; the output must still be whole and the exit code right.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import orjson
from click.testing import CliRunner

from processor.cli import quick_exit
from processor.cli.main import cli
from processor.files import write_session_file
from processor.workload import generate_session

# main() as the console script runs it, plus an atexit marker: it prints only
# when the interpreter tears down normally
SCRIPT = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("torn down\\n"))
from processor.cli.main import main
sys.argv = ["processor", *sys.argv[1:]]
main()
"""


def _command(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,  # stdout is a pipe, as in `processor fold ... | jq`
        timeout=120,
        check=False,
    )


def _log(tmp_path: Path, events: int) -> Path:
    log = tmp_path / "s.jsonl"
    write_session_file(log, None, generate_session(random.Random(5), events))
    return log


def test_fold_output_is_whole_through_a_pipe_and_teardown_is_skipped(tmp_path: Path) -> None:
    log = _log(tmp_path, 3000)
    done = _command("fold", str(log), "--compact")
    assert done.returncode == 0, done.stderr
    assert b"torn down" not in done.stderr  # os._exit: no teardown
    assert done.stderr == b""
    # the same bytes as the in-process command (which frees as usual)
    expected = CliRunner().invoke(cli, ["fold", str(log), "--compact"]).stdout_bytes
    assert len(done.stdout) > 100_000 and done.stdout == expected
    assert orjson.loads(done.stdout)["asOfSeq"] == 2999


def test_fold_pretty_output_and_checkpoint_file_are_whole(tmp_path: Path) -> None:
    log = _log(tmp_path, 500)
    checkpoint = tmp_path / "c.json"
    done = _command("fold", str(log), "--write-checkpoint", str(checkpoint))
    assert done.returncode == 0, done.stderr
    expected = CliRunner().invoke(cli, ["fold", str(log)]).stdout_bytes
    assert done.stdout == expected
    assert orjson.loads(checkpoint.read_bytes())["lastSeq"] == 499


def test_a_refused_log_exits_1_with_its_line_and_tears_down(tmp_path: Path) -> None:
    log = tmp_path / "bad.jsonl"
    log.write_bytes(b'{"seq": 0, "type": "nope"}\n')
    done = _command("fold", str(log))
    assert done.returncode == 1
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert lines[-1] == "torn down" and lines[0].startswith("seq 0: ")


def test_exit_now_returns_when_nothing_is_held() -> None:
    quick_exit.exit_now(0)  # would end pytest if it did not return
