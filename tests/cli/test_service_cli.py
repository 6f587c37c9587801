"""The Kafka subcommands (topics, ingest, views, dlq, redrive) on a real broker.

The end-to-end checks compare what `processor views` prints after a
processor ran over ingested files with `processor fold` of the same files.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from processor.cli.main import cli
from processor.client.session_writer import SessionWriter
from processor.client.views_reader import (
    ViewUpdate,
    follow_views,
    offline_equivalent,
)
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.core.session import synthetic_header
from processor.files import write_session_file
from processor.kafka import clients
from processor.offline import fold_events, session_output
from processor.service.loop.runner import Processor
from processor.workload import generate_session
from tests.kafka_fixtures import unique_prefix
from tests.service.test_writer import events_of

pytestmark = pytest.mark.kafka


def invoke(config: ServiceConfig, *args: str, input: str | None = None) -> Result:
    """Run ``processor <args>`` against ``config``'s broker and prefix."""
    command, *rest = args
    sub: list[str] = []
    if command == "topics":  # options go after the subcommand of a group
        sub, rest = [rest[0]], rest[1:]
    argv = [
        command,
        *sub,
        "-b",
        config.bootstrap_servers,
        "--topic-prefix",
        config.topic_prefix,
        "--group-id",
        config.group_id,
        *rest,
    ]
    return CliRunner().invoke(cli, argv, input=input, catch_exceptions=False)


def json_lines(text: str) -> list[Any]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def as_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


@pytest.fixture
def config(kafka_bootstrap: str) -> ServiceConfig:
    prefix = unique_prefix("c")
    return ServiceConfig(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=3,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
    )


def make_files(tmp_path: Path) -> dict[str, tuple[Path, list[Event]]]:
    """Two zstd files with a header line, one plain file without (id = file stem)."""
    rng = random.Random(21)
    out = {}
    for sid, name, header in (
        ("alpha", "alpha.jsonl.zst", True),
        ("beta", "session.v1.jsonl.zst", True),
        ("gamma", "gamma.jsonl", False),
    ):
        events = generate_session(random.Random(rng.random()), 120)
        path = tmp_path / (sid if name.startswith("session") else "") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_session_file(path, synthetic_header(sid) if header else None, events)
        out[sid] = (path, events)
    return out


# --------------------------------------------------------------------------
# topics
# --------------------------------------------------------------------------


def test_topics_create_is_idempotent_and_verify_passes(config: ServiceConfig) -> None:
    missing = invoke(config, "topics", "verify")
    assert missing.exit_code == 1 and missing.stderr.count("missing") == 5
    first = invoke(config, "topics", "create", "--partitions", "2")
    assert first.exit_code == 0, first.output
    assert sorted(first.stdout.split()[1::2]) == sorted(
        f"{config.topic_prefix}.{t}" for t in ("events", "views", "checkpoints", "dlq", "control")
    )
    again = invoke(config, "topics", "create", "--partitions", "2")
    assert again.exit_code == 0 and "all topics exist" in again.stdout
    assert invoke(config, "topics", "verify").exit_code == 0
    assert invoke(config, "topics", "verify", "--partitions", "2").exit_code == 0
    wrong = invoke(config, "topics", "verify", "--partitions", "5")
    assert wrong.exit_code == 1 and "2 partitions, expected 5" in wrong.stderr


def test_verify_detects_a_wrong_cleanup_policy_on_a_hand_made_topic(config: ServiceConfig) -> None:
    admin = clients.admin(config)
    views = config.topics.views
    futures = admin.create_topics(
        [
            NewTopic(
                views, num_partitions=3, replication_factor=1, config={"cleanup.policy": "delete"}
            )
        ]
    )
    futures[views].result()
    created = invoke(config, "topics", "create", "--partitions", "3")
    assert created.exit_code == 1  # the other four are created, the layout is still wrong
    assert created.stdout.count("created") == 4
    result = invoke(config, "topics", "verify")
    assert result.exit_code == 1
    assert f"{views}: cleanup.policy=delete, expected compact" in result.stderr
    assert "1 problem(s)" in result.stderr


def test_topics_delete_asks_unless_yes(config: ServiceConfig) -> None:
    created = invoke(config, "topics", "create", "--partitions", "1")
    assert created.exit_code == 0, created.output
    declined = invoke(config, "topics", "delete", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert config.topics.events in clients.admin(config).list_topics(timeout=10).topics
    deleted = invoke(config, "topics", "delete", "--yes")
    assert deleted.exit_code == 0 and deleted.stdout.count("deleted") == 5


# --------------------------------------------------------------------------
# ingest → run → views / dlq
# --------------------------------------------------------------------------


def test_ingest_zst_files_then_views_equal_the_offline_fold(
    config: ServiceConfig, tmp_path: Path
) -> None:
    assert invoke(config, "topics", "create").exit_code == 0
    files = make_files(tmp_path)
    result = invoke(config, "ingest", *(str(p) for p, _ in files.values()))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ingested 3 file(s), 3 session(s), 360 event(s)")
    assert {d.session_id for d in events_of(config)} == set(files)

    Processor(config).run(max_idle_s=3)

    shown = invoke(config, "views", "--format", "fold")
    assert shown.exit_code == 0, shown.output
    got = orjson.loads(shown.stdout)
    for sid, (path, events) in files.items():
        folded = CliRunner().invoke(cli, ["fold", str(path)], catch_exceptions=False)
        assert folded.exit_code == 0
        expected = offline_equivalent(orjson.loads(folded.stdout_bytes))
        assert got[sid] == expected, sid
        assert got[sid] == as_json(offline_equivalent(session_output(fold_events(events))))

    raw = orjson.loads(invoke(config, "views", "--session", "alpha").stdout)
    assert set(raw) == {"alpha"}
    alpha = raw["alpha"]
    index = alpha["transcript"]["value"]
    assert index["pages"] == len([v for v in alpha if v.startswith("transcript.")])
    assert {alpha[v]["asOfSeq"] for v in alpha} == {119}
    assert alpha["messages"]["stateVersion"] == -1

    one = orjson.loads(invoke(config, "views", "--session", "beta", "--view", "surface").stdout)
    assert list(one["beta"]) == ["surface"]
    summary = invoke(config, "views", "--format", "summary").stdout.splitlines()
    assert [line.split()[0] for line in summary] == ["alpha", "beta", "gamma"]
    assert all("status=ok" in line and "lastSeq=119" in line for line in summary)
    follow = invoke(config, "views", "--follow", "--session", "gamma", "--stop-after", "1")
    lines = json_lines(follow.stdout)
    gamma = orjson.loads(invoke(config, "views", "--session", "gamma").stdout)["gamma"]
    assert [line["view"] for line in lines] == sorted(gamma)  # the snapshot, once each
    assert set(gamma) >= set(got["gamma"]["projections"]) | {
        "messages",
        "surface",
        "status",
        "transcript",
        "transcript.0",
    }
    assert all(line["session"] == "gamma" and line["asOfSeq"] == 119 for line in lines)
    assert invoke(config, "dlq").stdout == ""
    assert invoke(config, "views", "--session", "nobody").exit_code == 1


def _bad_file(tmp_path: Path) -> tuple[Path, list[Event]]:
    """A valid log whose seq 20 was rewritten to 25 (an S-1 gap)."""
    events = generate_session(random.Random(5), 30)
    lines = [e.to_json() for e in events]
    lines[20] = {**lines[20], "seq": 25}
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path, events


def test_ingest_refuses_an_invalid_file_and_raw_mode_feeds_the_dlq(
    config: ServiceConfig, tmp_path: Path
) -> None:
    assert invoke(config, "topics", "create").exit_code == 0
    bad, events = _bad_file(tmp_path)
    good = tmp_path / "good.jsonl.zst"
    write_session_file(good, None, generate_session(random.Random(6), 40))
    result = invoke(config, "ingest", str(bad), str(good))
    assert result.exit_code == 1
    assert f"{bad}: seq 25: seq 25 is not contiguous; expected 20 (S-1)" in result.stderr
    assert "ingested 1 file(s), 1 session(s), 40 event(s)" in result.stdout
    assert {d.session_id for d in events_of(config)} == {"good"}  # nothing of bad.jsonl

    raw = invoke(config, "ingest", "--raw", str(bad))
    assert raw.exit_code == 0 and "30 event(s)" in raw.stdout
    Processor(config).run(max_idle_s=3)

    letters = json_lines(invoke(config, "dlq", "--session", "bad").stdout)
    assert [(d["rule"], d["seq"]) for d in letters] == [("S-1", 25)] + [
        ("QUARANTINED", s) for s in range(21, 30)
    ]
    first = letters[0]
    assert first["event"] == {**as_json(events[20].to_json()), "seq": 25}
    assert first["key"] == "bad" and first["topic"] == config.topics.events
    assert invoke(config, "dlq", "--session", "good").stdout == ""
    summary = invoke(config, "dlq", "--format", "summary", "--session", "bad").stdout
    assert summary.splitlines()[0].endswith("seq=25  S-1: seq 25: gap, expected 20 (S-1)")
    status = invoke(config, "views", "--session", "bad", "--format", "summary").stdout
    assert "status=quarantined" in status and "lastSeq=19" in status

    # the operator fixes the cause: re-drive, then the corrected tail
    assert invoke(config, "redrive", "bad").stdout == "redrive requested for bad at seq 19\n"
    fixed = tmp_path / "bad-fixed.jsonl"
    write_session_file(fixed, synthetic_header("bad"), events)
    assert invoke(config, "ingest", str(fixed)).exit_code == 0  # 0..19 are duplicates
    Processor(config).run(max_idle_s=3)
    doc = orjson.loads(invoke(config, "views", "--session", "bad", "--format", "fold").stdout)
    assert doc["bad"] == as_json(offline_equivalent(session_output(fold_events(events))))


def test_follow_views_sees_live_commits(config: ServiceConfig) -> None:
    assert invoke(config, "topics", "create").exit_code == 0
    updates: list[ViewUpdate] = []
    seen_any = threading.Event()

    def follow() -> None:
        for update in follow_views(config, session="live", stop_after_s=12):
            updates.append(update)
            if (
                update.view == "status"
                and update.record is not None
                and (update.record.value["lastSeq"] == 49)
            ):
                seen_any.set()
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    with SessionWriter(config) as writer:
        for event in generate_session(random.Random(9), 50):
            writer.append_event("live", event)
    Processor(config).run(max_idle_s=2)
    assert seen_any.wait(10)
    thread.join(5)
    names = {u.view for u in updates}
    assert {"messages", "surface", "status", "transcript", "transcript.0"} <= names
    assert all(u.session_id == "live" for u in updates)
