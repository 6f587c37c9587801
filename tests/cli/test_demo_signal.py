"""Issue 39: ``processor demo --inspect`` signalled alone leaves no process behind.

A supervisor's stop button sends SIGTERM to the demo's own pid (``kill
<pid>``), not to its process group as a terminal's Ctrl-C does.  The demo's
``processor run`` members used to go on running, reparented to init.  Now
the demo stops them on SIGTERM at any point, and each dies with the demo
anyway (``children.py``).  Killed while its members fold (before the
inspector phase), and killed outright (a supervisor's SIGKILL after its grace
period) while it keeps the inspector open: then nothing of the demo runs, and
its members end by their parent-death signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from processor.children import popen_tied

pytestmark = pytest.mark.kafka
REPO = Path(__file__).parents[2]
#: the demo's stderr line once its members run, and its stdout line at the inspector phase
MARKERS = {"folding": "two processors started", "inspecting": "open it in a browser"}


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("phase", "sig"), [("folding", signal.SIGTERM), ("inspecting", signal.SIGKILL)]
)
def test_issue39_demo_killed_alone_leaves_no_process(
    kafka_bootstrap: str, tmp_path: Path, phase: str, sig: signal.Signals
) -> None:
    log = tmp_path / "demo.log"
    cmd = [sys.executable, "-m", "processor", "demo", "-b", kafka_bootstrap]
    cmd += ["--sessions", "2", "--inspect", "--inspect-port", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as sink:
        demo = popen_tied(cmd, env=env, stdout=sink, stderr=sink)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while MARKERS[phase] not in log.read_text(errors="replace"):
            assert demo.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        kids = _descendants(demo.pid)
        assert kids, "the demo runs no member"
        os.kill(demo.pid, sig)  # the demo alone, not its group
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(k) for k in kids):
            time.sleep(0.5)
        left = sorted(k for k in kids if _alive(k))
        assert not left, (
            f"still running 30 s after kill -{sig.name} <demo pid>: {left}\n{log.read_text()}"
        )
    finally:
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)
        demo.kill()
        demo.wait()
