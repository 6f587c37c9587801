"""``processor ship`` on a real broker: the views equal the offline fold of the files.

A tree written as the runtime writes (batches, zstd frames, torn tails then
truncation, a migration, a fork, resumed sessions) is shipped by the real
command; a processor member then folds the topic, and every session's views
must equal ``processor fold`` of its final file, with no dead letter and no
quarantine.  The second test kills the shipper with SIGKILL at random points
while a writer appends, and restarts it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from processor.client.views_reader import materialize_views, offline_equivalent
from processor.offline import fold_events, fold_file, session_output
from tests.service.conftest import REPO, Stack, as_json
from tests.service.test_processor import dead_letters, wait_for_views
from tests.ship.helpers import events
from tests.ship.runtime_writer import RuntimeWriter

pytestmark = pytest.mark.kafka
CORPUS = Path(__file__).parents[1] / "corpus" / "valid"


def _ship_cmd(stack: Stack, root: Path, state: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "processor",
        "ship",
        str(root),
        "-b",
        stack.config.bootstrap_servers,
        "--topic-prefix",
        stack.config.topic_prefix,
        "--state-dir",
        str(state),
        "--rescan-interval",
        "0.5",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _expected(writers: list[RuntimeWriter]) -> dict[str, Any]:
    return {
        w.sid: as_json(offline_equivalent(session_output(fold_events(w.logical)))) for w in writers
    }


def _no_quarantine(stack: Stack, sids: list[str]) -> None:
    views = materialize_views(stack.config)
    for sid in sids:
        status = views[sid].get("status") if isinstance(views[sid], dict) else None
        assert status is None or "quarantine" not in str(status), (sid, status)


def _tree(root: Path) -> list[RuntimeWriter]:
    evs = events(120, seed=5)
    ws = []
    z = RuntimeWriter(root, "zstd-batches")
    for i in range(0, 120, 9):
        z.append(evs[i : i + 9])
    ws.append(z)
    p = RuntimeWriter(root, "plain/torn", compressed=False, cwd="/home/u/other")
    p.append(evs[:40])
    p.write_torn(evs[40:50])
    p.append(evs[len(p.logical) : 80])  # resumed: closers and more
    p.write_unterminated(evs[80])  # a last line without newline: not shipped
    ws.append(p)
    t = RuntimeWriter(root, "zstd-torn-rewritten")
    t.append(evs[:30])
    t.write_torn(evs[30:45])
    t.append(evs[len(t.logical) : 70])
    ws.append(t)
    m = RuntimeWriter(root, "migrated", version=3)
    m.append(evs[:25])
    m.migrate(4)
    m.append(evs[25:60])
    ws.append(m)
    return ws


def test_ship_once_then_the_views_equal_the_offline_fold(stack: Stack, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    root.mkdir()
    writers = _tree(root)
    fork = root / "--work-example--" / "forked-subagent"
    fork.mkdir(parents=True)
    shutil.copy(CORPUS / "forked-subagent" / "session.v4.jsonl", fork)
    every = root / "--work-example--" / "every-type-v4-zstd"
    every.mkdir(parents=True)
    shutil.copy(CORPUS / "every-type-v4-zstd" / "session.v4.jsonl.zstd", every)
    done = subprocess.run(
        _ship_cmd(stack, root, tmp_path / "state", "--once"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "shipped" in done.stderr
    expected = _expected(writers)
    expected["forked-subagent"] = as_json(
        offline_equivalent(fold_file(fork / "session.v4.jsonl").output)
    )
    expected["every-type-v4-zstd"] = as_json(
        offline_equivalent(fold_file(every / "session.v4.jsonl.zstd").output)
    )
    # a second --once sends nothing new: the registry says it is all on the topic
    again = subprocess.run(
        _ship_cmd(stack, root, tmp_path / "state", "--once"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "shipped 0 event(s)" in again.stderr, again.stderr
    stack.run_processor(max_idle_s=3)
    wait_for_views(stack, expected, timeout=60)
    assert dead_letters(stack) == []
    _no_quarantine(stack, list(expected))


def test_sigkilled_shipper_restarted_while_a_writer_appends(stack: Stack, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    root.mkdir()
    state = tmp_path / "state"
    rng = random.Random(34)
    writers = [
        RuntimeWriter(root, f"live-{i}", compressed=i % 2 == 0, cwd=f"/p/{i % 2}") for i in range(5)
    ]
    writers.append(RuntimeWriter(root, "live-migrated", version=3))  # migrates midway
    logs = {w.sid: events(400, seed=100 + i) for i, w in enumerate(writers)}
    stop = threading.Event()

    def write() -> None:
        pos = dict.fromkeys(logs, 0)
        while any(pos[s] < 400 for s in pos) and not stop.is_set():
            w = rng.choice(writers)
            n = pos[w.sid]
            if n >= 400:
                continue
            batch = logs[w.sid][n : n + rng.randint(1, 25)]
            if w.version == 3 and n >= 150:
                w.truncate_torn()
                if w.recovered:
                    w.append([])
                w.migrate(4)  # the next generation, beside the old one
                continue
            if n and rng.random() < 0.1:
                w.write_torn(batch)  # a crash; the resumed writer truncates it
                pos[w.sid] = len(w.logical)
                continue
            w.append(batch)
            pos[w.sid] = len(w.logical)
            time.sleep(rng.uniform(0.005, 0.04))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    log = (tmp_path / "ship.log").open("ab")
    kills = 0
    while writer.is_alive() or kills < 3:
        proc = subprocess.Popen(_ship_cmd(stack, root, state), env=_env(), stdout=log, stderr=log)
        time.sleep(rng.uniform(0.8, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if kills > 12:
            stop.set()
    writer.join()
    for w in writers:
        w.truncate_torn()  # torn frames' records: rewritten by one last append
        if w.recovered:
            w.append([])
    assert kills >= 3
    done = subprocess.run(
        _ship_cmd(stack, root, state, "--once"), env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    # the registry lost: it learns from the topic what is there, and sends nothing again
    shutil.rmtree(state)
    lost = subprocess.run(
        _ship_cmd(stack, root, state, "--once"), env=_env(), capture_output=True, text=True
    )
    assert lost.returncode == 0 and "shipped 0 event(s)" in lost.stderr, lost.stderr
    expected = {w.sid: as_json(offline_equivalent(fold_file(w.path).output)) for w in writers}
    assert expected == _expected(writers)
    member = stack.run_processor(max_idle_s=3)
    wait_for_views(stack, expected, timeout=90)
    assert dead_letters(stack) == [], (tmp_path / "ship.log").read_text()[-2000:]
    _no_quarantine(stack, list(expected))
    outcomes = member.metrics.events
    applied = outcomes.labels("applied")._value.get()
    assert applied == sum(len(w.logical) for w in writers)
    assert outcomes.labels("quarantined")._value.get() == 0
    assert outcomes.labels("rejected")._value.get() == 0


def test_resent_events_are_counted_duplicates_not_dead_letters(
    stack: Stack, tmp_path: Path
) -> None:
    """What a kill -9 makes the shipper send again (at most the unpersisted bound,
    below the duplicate window) is dropped by the seq gate and counted."""
    root = tmp_path / "sessions"
    root.mkdir()
    w = RuntimeWriter(root, "again")
    w.append(events(150, seed=8))
    for _ in range(2):  # the second run has no registry and is told not to recover
        shutil.rmtree(tmp_path / "state", ignore_errors=True)
        done = subprocess.run(
            _ship_cmd(stack, root, tmp_path / "state", "--once", "--no-recover"),
            env=_env(),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0 and "shipped 150 event(s)" in done.stderr, done.stderr
    proc = stack.run_processor(max_idle_s=3)
    wait_for_views(stack, _expected([w]), timeout=60)
    assert proc.metrics.events.labels("duplicate")._value.get() == 150
    assert dead_letters(stack) == []


def test_follow_serves_metrics_and_health_and_exits_0_on_sigterm(
    stack: Stack, tmp_path: Path
) -> None:
    import re
    import urllib.request

    root = tmp_path / "sessions"
    root.mkdir()
    log = tmp_path / "ship.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            _ship_cmd(stack, root, tmp_path / "state", "--metrics-port", "0"),
            env=_env(),
            stdout=sink,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline:
            m = re.search(r"metrics on http://[^:]+:(\d+)/", log.read_text())
            port = int(m.group(1)) if m else None
            time.sleep(0.1)
        assert port is not None, log.read_text()
        base = f"http://127.0.0.1:{port}"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        assert get("/healthz")[0] == 200
        w = RuntimeWriter(root, "live")  # a session created while running
        w.append(events(30, seed=3))
        bad = root / "_no-cwd" / "bad"
        bad.mkdir(parents=True)
        (bad / "session.v4.jsonl").write_bytes(b"not json\n")
        while time.monotonic() < deadline:
            text = get("/metrics")[1]
            if "ship_events_total 30.0" in text and "ship_files_refused_current 1.0" in text:
                break
            time.sleep(0.2)
        assert "ship_events_total 30.0" in text, text
        assert "ship_sessions_followed 1.0" in text  # the refused one is not followed
        assert get("/readyz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "refused" in log.read_text() and "bad" in log.read_text()
