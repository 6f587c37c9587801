"""docs/operations.md: every `processor` command parses, and the marked blocks work.

Each fenced block preceded by ``<!-- runbook-test: NAME -->`` is run as written
by bash against a real broker (``processor`` on PATH is this checkout), with
the runbook's variables (``PREFIX``, ``GROUP``, ``SESSION``, ...) set; a
``background`` block is started and left running while the test checks the
result.  The quarantine -> redrive and blue/green replay paths are covered.
Commands the CI cannot run (kubectl) are not executed, but every ``processor``
command line anywhere in the runbook must parse with the real CLI.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import click
import pytest

from processor.cli.main import cli
from tests.deploy.conftest import (
    PACKAGE,
    REPO,
    Background,
    background,
    checkout_env,
    checkout_processor,
    free_port,
    http_get,
    wait_until,
)
from tests.kafka_fixtures import unique_prefix

RUNBOOK = REPO / "docs" / "operations.md"
EXAMPLE = PACKAGE / "examples" / "session.jsonl"
_MARK = re.compile(r"<!-- runbook-test: ([\w-]+)( background)? -->\n```(?:sh|bash)\n(.*?)```", re.S)
_FENCE = re.compile(r"```(?:sh|bash)\n(.*?)```", re.S)


def marked_blocks() -> dict[str, tuple[str, bool]]:
    """name -> (script, runs in the background)."""
    return {m[1]: (m[3], bool(m[2])) for m in _MARK.finditer(RUNBOOK.read_text())}


def processor_command_lines() -> list[list[str]]:
    """The argument lists of every `processor ...` command of the runbook's code blocks."""
    out = []
    for block in _FENCE.findall(RUNBOOK.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            words = []
            for word in lex:
                if word in {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}:
                    break
                words.append(word)
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                words.pop(0)  # VAR=value prefixes
            if words and words[0] == "processor":
                out.append(words[1:])
    return out


def parse_with_cli(args: list[str], stand_in: Path) -> click.Context:
    """Resolve the subcommand chain and parse its options like the real CLI would.

    Arguments holding shell variables or globs stand for files of the operator,
    so a real file stands in for them.
    """
    args = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in args]  # ${VAR:-default}
    args = [str(stand_in) if ("$" in a or "*" in a) else a for a in args]
    command: click.Command = cli
    name = "processor"
    while isinstance(command, click.Group):
        assert args, f"{name}: no subcommand"
        sub = command.get_command(click.Context(command), args[0])
        assert sub is not None, f"no such command: {name} {args[0]}"
        name, command, args = f"{name} {args[0]}", sub, args[1:]
    return command.make_context(name, args)


def test_runbook_has_the_tested_blocks() -> None:
    blocks = marked_blocks()
    assert {
        "quarantine-inspect",
        "quarantine-redrive",
        "quarantine-verify",
        "bluegreen-replay",
        "bluegreen-compare",
        "bluegreen-switch",
    } <= set(blocks)
    assert blocks["bluegreen-switch"][1] and not blocks["bluegreen-replay"][1]


def test_every_processor_command_in_the_runbook_parses(tmp_path: Path) -> None:
    stand_in = tmp_path / "file.jsonl"
    stand_in.write_text("")
    lines = processor_command_lines()
    assert len(lines) >= 15
    seen = set()
    for args in lines:
        try:
            ctx = parse_with_cli(args, stand_in)
        except click.ClickException as exc:
            raise AssertionError(f"processor {' '.join(args)}: {exc.format_message()}") from None
        seen.add(ctx.info_name)
    assert {
        "processor replay",
        "processor redrive",
        "processor dlq",
        "processor views",
        "processor ingest",
        "processor run",
        "processor topics create",
    } <= seen


def test_the_command_checker_rejects_what_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(click.NoSuchOption):
        parse_with_cli(["replay", "--into", "green"], tmp_path)
    with pytest.raises(AssertionError, match="no such command"):
        parse_with_cli(["requeue", "s1"], tmp_path)


# ----------------------------------------------------------------- scenarios


class Runbook:
    """Runs the runbook's blocks with `processor` = this checkout."""

    def __init__(self, tmp_path: Path, bootstrap: str, **variables: str) -> None:
        self.dir = tmp_path
        shim = tmp_path / "bin" / "processor"
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m processor "$@"\n')
        shim.chmod(0o755)
        prefix = unique_prefix("rb")
        self.env = checkout_env(
            KAFKA_BOOTSTRAP_SERVERS=bootstrap,
            PROCESSOR_TOPIC_PREFIX=prefix,
            PROCESSOR_GROUP_ID=prefix,
            PREFIX=prefix,
            GROUP=prefix,
            PROCESSOR_PARTITIONS="3",
            **variables,
        )
        self.env["PATH"] = f"{shim.parent}:{self.env['PATH']}"
        self.blocks = marked_blocks()

    @property
    def prefix(self) -> str:
        return self.env["PREFIX"]

    def run(self, name: str, check: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        script, in_background = self.blocks[name]
        assert not in_background
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.dir,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check:
            assert out.returncode == 0, f"{name}:\n{script}\n{out.stdout}\n{out.stderr}"
        return out

    def start(self, name: str, **extra: str) -> AbstractContextManager[Background]:
        script, in_background = self.blocks[name]
        assert in_background
        # one simple command: bash execs it (and the shim execs Python), so the
        # SIGTERM of Background.terminate reaches the processor itself
        return background(
            ["bash", "-euo", "pipefail", "-c", script.strip()],
            self.dir / f"{name}.log",
            env={**self.env, **extra},
            cwd=self.dir,
        )

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [*checkout_processor(), *args],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0, f"processor {args}: {out.stdout}{out.stderr}"
        return out

    def member(self, instance: str) -> AbstractContextManager[Background]:
        return background(
            [
                *checkout_processor(),
                "run",
                "--instance-id",
                instance,
                "--commit-interval-ms",
                "100",
            ],
            self.dir / f"{instance}.log",
            env=self.env,
        )

    def summary(self, session: str, prefix: str | None = None) -> str:
        extra = {"PROCESSOR_TOPIC_PREFIX": prefix} if prefix else {}
        out = subprocess.run(
            [
                *checkout_processor(),
                "views",
                "--session",
                session,
                "--format",
                "summary",
                "--timeout",
                "20",
            ],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return out.stdout if out.returncode == 0 else ""


def _last_seq() -> int:
    return len(EXAMPLE.read_text().splitlines()) - 2  # less the header; seqs from 0


def _offline_fold() -> dict[str, object]:
    out = subprocess.run(
        [*checkout_processor(), "fold", str(EXAMPLE)],
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(out.stdout))


@pytest.mark.kafka
def test_runbook_quarantine_inspect_fix_redrive(kafka_bootstrap: str, tmp_path: Path) -> None:
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(lines[:11] + lines[12:]))  # seq 10 missing: a gap at 11
    rb = Runbook(tmp_path, kafka_bootstrap, SESSION="q-1", FIXED_FILE=str(EXAMPLE))
    rb.cli("topics", "create")
    with rb.member("blue-0") as member:
        # the incident: a writer produced the session with a hole in it
        rb.cli("ingest", "--raw", "--session-id", "q-1", str(broken))
        wait_until(lambda: "status=quarantined" in rb.summary("q-1"), "q-1 quarantined")

        inspect = rb.run("quarantine-inspect").stdout
        assert "status=quarantined" in inspect and "lastSeq=9" in inspect
        assert "quarantine=seq 9: S-1: seq 11: gap" in inspect  # stopped at 9, why
        assert re.search(r"\bq-1\s+seq=11\s+S-1: .*gap", inspect), inspect  # the dead letters
        assert re.search(r"\bq-1\s+seq=64\s+QUARANTINED:", inspect), inspect

        # the runbook's guard: a file that is still wrong stops the block before
        # anything is redriven or produced
        still_wrong = rb.run("quarantine-redrive", check=False, FIXED_FILE=str(broken))
        assert still_wrong.returncode == 1 and "seq 11" in still_wrong.stderr
        assert "redrive requested" not in still_wrong.stdout

        fixed = rb.run("quarantine-redrive").stdout
        assert "redrive requested for q-1" in fixed and "1 session(s)" in fixed
        want = f"status=ok  lastSeq={_last_seq()}"
        wait_until(lambda: want in rb.run("quarantine-verify").stdout, f"q-1 {want}")
        views = json.loads(rb.cli("views", "--session", "q-1", "--format", "fold").stdout)
        offline = _offline_fold()
        assert views["q-1"]["messages"] == offline["messages"]
        assert views["q-1"]["transcript"] == offline["transcript"]
        assert member.terminate() == 0, member.output()


def _applied(port: int) -> float | None:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    found = re.search(rb'^processor_events_total\{outcome="applied"\} (\S+)', body, re.M)
    return float(found[1]) if status == 200 and found else None


@pytest.mark.kafka
def test_runbook_blue_green_replay_and_switch(kafka_bootstrap: str, tmp_path: Path) -> None:
    green = unique_prefix("green")
    port = free_port()
    rb = Runbook(tmp_path, kafka_bootstrap, GREEN=green, METRICS_PORT=str(port))
    rb.cli("topics", "create")
    done = f"status=ok  lastSeq={_last_seq()}"
    with rb.member("blue-0") as blue:
        for sid in ("bg-a", "bg-b"):
            rb.cli("ingest", "--session-id", sid, str(EXAMPLE))
        for sid in ("bg-a", "bg-b"):

            def folded(sid: str = sid) -> bool:
                return done in rb.summary(sid)

            wait_until(folded, f"{sid} folded by blue")

        replayed = rb.run("bluegreen-replay").stdout
        events = 2 * (_last_seq() + 1)
        assert f"replayed {events} events" in replayed and f"{green}.views" in replayed

        rb.run("bluegreen-compare")
        blue_txt, green_txt = (
            (tmp_path / "blue.txt").read_text(),
            (tmp_path / "green.txt").read_text(),
        )
        assert blue_txt == green_txt and blue_txt.count(done) == 2

        with rb.start("bluegreen-switch") as switched:
            # a new session written after the switch reaches the green views
            rb.cli("ingest", "--session-id", "bg-c", str(EXAMPLE))
            wait_until(lambda: done in rb.summary("bg-c", prefix=green), "bg-c in green")
            # the green member resumed where the replay stopped: it applied only bg-c
            wait_until(
                lambda: _applied(port) == float(_last_seq() + 1),
                "green applied exactly the new session",
            )
            assert isinstance(switched, Background)
            assert switched.terminate() == 0, switched.output()
        assert done in rb.summary("bg-c")  # blue still serves until it is stopped
        assert blue.terminate() == 0, blue.output()
