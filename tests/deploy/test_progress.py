"""Replay and ingest progress: events, sessions, rate and ETA on a terminal, silent in logs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from processor.cli.main import cli
from processor.cli.progress import FileProgress, Progress, format_eta
from tests.deploy.conftest import PACKAGE
from tests.kafka_fixtures import unique_prefix

EXAMPLE = PACKAGE / "examples" / "session.jsonl"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_sees_events_sessions_rate_and_eta() -> None:
    out, clock = Terminal(), Clock()
    bar = Progress("replay", stream=out, clock=clock)
    clock.now += 2.0
    bar.update(events=1_000, total_events=4_000, sessions=3)
    assert out.getvalue() == (
        "\rreplay: 1,000/4,000 events (25%) · 3 sessions · 500 ev/s · ETA 0:06"
    )
    clock.now += 6.0
    bar.update(events=4_000, sessions=12)
    bar.close()
    last = out.getvalue().split("\r")[-1]
    assert last == "replay: 4,000/4,000 events (100%) · 12 sessions · 500 ev/s · done in 0:08\n"


def test_logs_get_nothing() -> None:
    log, clock = io.StringIO(), Clock()  # not a terminal
    with Progress("ingest", stream=log, clock=clock) as bar:
        for n in range(1, 100):
            clock.now += 1
            bar.update(events=n, sessions=1, total_events=100)
    assert log.getvalue() == ""


def test_redraws_are_throttled_and_a_shorter_line_erases_a_longer_one() -> None:
    out, clock = Terminal(), Clock()
    bar = Progress("x", stream=out, clock=clock, min_interval_s=1.0)
    clock.now += 1
    bar.update(events=123_456_789, sessions=1)
    for n in range(10):
        bar.update(events=n, sessions=1)  # same instant: not drawn
    assert out.getvalue().count("\r") == 1
    clock.now += 200_000
    bar.update(events=5, sessions=1)
    first, second = out.getvalue().split("\r")[1:]
    assert len(second) == len(first) and second.rstrip() == "x: 5 events · 1 session · 0 ev/s"


def test_file_progress_takes_the_eta_from_bytes() -> None:
    clock = Clock()
    bar = Progress("ingest", stream=Terminal(), clock=clock)
    files = FileProgress(bar, total_bytes=4_000)
    files.begin(1_000)
    files.expect(10)
    for _ in range(10):
        files.event()
    files.end(sessions=1)
    files.begin(3_000)
    files.expect(30)
    for _ in range(15):
        files.event()
    clock.now += 5.0
    assert bar.line() == "ingest: 25 events (62%) · 1 session · 5 ev/s · ETA 0:03"
    files.end(sessions=2)  # a refused file still counts as done
    assert bar.line().startswith("ingest: 25 events (100%) · 2 sessions")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0:00"), (7.4, "0:07"), (750, "12:30"), (7500, "2:05:00"), (-3, "0:00")],
)
def test_eta_format(seconds: float, text: str) -> None:
    assert format_eta(seconds) == text


@pytest.mark.kafka
def test_ingest_and_replay_show_progress_only_when_asked(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = unique_prefix("prog")
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PROCESSOR_TOPIC_PREFIX": prefix,
        "PROCESSOR_GROUP_ID": prefix,
        "PROCESSOR_PARTITIONS": "2",
    }
    runner = CliRunner()
    assert runner.invoke(cli, ["topics", "create"], env=env).exit_code == 0
    quiet = runner.invoke(cli, ["ingest", str(EXAMPLE), "--session-id", "p-1"], env=env)
    assert quiet.exit_code == 0, quiet.output
    assert "\r" not in quiet.stderr  # CliRunner's stderr is no terminal: no progress
    shown = runner.invoke(
        cli, ["ingest", "--progress", str(EXAMPLE), "--session-id", "p-2"], env=env
    )
    assert shown.exit_code == 0, shown.output
    events = sum(
        1
        for line in EXAMPLE.read_text().splitlines()
        if line.strip() and json.loads(line)["type"] != "session"
    )  # not the header
    assert re.search(
        rf"\ringest: {events} events \(100%\) · 1 session · [\d,]+ ev/s · done in", shown.stderr
    ), shown.stderr
    replayed = runner.invoke(cli, ["replay", "--into-prefix", f"{prefix}g", "--progress"], env=env)
    assert replayed.exit_code == 0, replayed.output
    # sessions: shown once a commit reported them (a replay this short may end first)
    assert re.search(
        rf"\rreplay: {2 * events}/{2 * events} events \(100%\) · "
        r"(2 sessions · )?[\d,]+ ev/s · done in",
        replayed.stderr,
    ), replayed.stderr
