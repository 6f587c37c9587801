"""``processor run`` against a bootstrap address where nothing answers: ``/readyz`` says so.

The start waited two minutes in ``init_transactions`` (then up to one more in
the permission check) before its one-line exit; ``/readyz`` said ``not
ready: restoring`` meanwhile, which sends an operator looking at the
checkpoints.  Now the wait is named (as the restore's are).  No broker:
port 1 refuses every connection.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from processor.children import popen_tied
from tests.local_http import free_port, get

REPO = Path(__file__).parents[2]
#: the first call of the start that waits for a broker: transactions' init
NEEDLE = "for the transaction coordinator to initialise transactional id"


def test_readyz_names_the_broker_nobody_answers_for_during_the_start() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "processor", "run", "-b", "127.0.0.1:1"]
    cmd += ["--topic-prefix", "x", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = popen_tied(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            seen.append(get(port, "/readyz"))
            if NEEDLE in seen[-1][1]:
                break
            time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait(30)
    status, body = seen[-1]
    assert status == 503 and body.startswith("not ready: waiting "), seen[-3:]
    assert NEEDLE in body, body
