"""Issue 39: SIGTERM ends a member that waits for a broker at once, not after the wait.

``processor run`` against an address where nothing answers waits up to
two minutes in ``init_transactions``; a SIGTERM meanwhile used to wait that
out too.  Now a stop gives every wait for a broker up (``stopping.py``), and
the member ends with exit 4 and one line saying nothing was committed.
No broker: port 1 refuses every connection.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from processor.children import popen_tied
from tests.local_http import free_port, get

REPO = Path(__file__).parents[2]
NEEDLE = "for the transaction coordinator to initialise transactional id"


def test_issue39_sigterm_ends_a_member_waiting_for_a_broker(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "processor", "run", "-b", "127.0.0.1:1", "--topic-prefix", "x"]
    cmd += ["--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROCESSOR_STOP_BOUND_S": "60"}
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        proc = popen_tied(cmd, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and NEEDLE not in get(port, "/readyz")[1]:
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        # the init's own deadline is 120 s, the stop bound 60 s: either would be
        # a failure; a stop that gives the wait up ends well before both
        code = proc.wait(50)
    finally:
        proc.kill()
        proc.wait()
    text = err.read_text()
    assert code == 4, text
    assert "nothing of the open batch" in text.splitlines()[-1], text
