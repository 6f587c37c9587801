"""The quick start's project environment (scripts/venv.sh, issue 38).

Both README commands install into ``.venv`` at the checkout's root, never into
the interpreter they are given (a distribution's Python refuses that, PEP 668),
and a second run reuses the environment, reinstalling only when
``pyproject.toml`` or ``setup.py`` changed or new extras are asked for.  These
tests run the script's function against a stand-in interpreter that records
what it is asked to do, so they need no network and no real install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.deploy.conftest import REPO

# Answers like the real interpreter, except that `-m venv DIR` makes DIR with
# this stand-in as DIR/bin/python and `-m pip ...` is only written down.
FAKE = """#!/bin/sh
echo "$0 $*" >> "$FAKE_LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && cp "$FAKE_SELF" "$3/bin/python" && chmod +x "$3/bin/python"
  exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then exit 0; fi
case "$*" in *ensurepip*) [ -z "$FAKE_NO_VENV" ] || exit 1 ;; esac
exec "$REAL_PY" "$@"
"""


def _checkout(tmp: Path) -> Path:
    root = tmp / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "scripts/venv.sh"):
        shutil.copyfile(REPO / name, root / name)
    return root


def _run(root: Path, tmp: Path, extras: str, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp / "python3-fake"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    full = {
        **os.environ,
        "PYTHON": str(fake),
        "FAKE_SELF": str(fake),
        "FAKE_LOG": str(tmp / "calls.log"),
        "REAL_PY": sys.executable,
        "FAKE_NO_VENV": "",
        **env,
    }
    full.pop("PROCESSOR_VENV", None)
    full.pop("PROCESSOR_REINSTALL", None)
    script = f'set -euo pipefail; source scripts/venv.sh; project_venv "{extras}"; echo "$VENV_PY"'
    return subprocess.run(
        ["bash", "-c", script], cwd=root, env=full, capture_output=True, text=True, timeout=60
    )


def _pip_calls(tmp: Path) -> list[str]:
    log = tmp / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return [line for line in lines if " -m pip install" in line]


def test_installs_into_the_checkouts_venv_and_reuses_it(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    first = _run(root, tmp_path, "")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("checkout/.venv/bin/python")
    (install,) = _pip_calls(tmp_path)
    assert install.startswith(str(root / ".venv" / "bin" / "python"))  # never $PYTHON itself
    assert install.endswith("-e .")
    # the same files: nothing installed again
    assert _run(root, tmp_path, "").returncode == 0
    assert _pip_calls(tmp_path) == []
    # the test extras were never installed: installed once, then remembered
    assert _run(root, tmp_path, "test").returncode == 0
    assert [c.split()[-1] for c in _pip_calls(tmp_path)] == [".[test]"]
    assert _run(root, tmp_path, "test").returncode == 0
    assert _run(root, tmp_path, "").returncode == 0
    assert _pip_calls(tmp_path) == []
    # pyproject.toml changed: installed again
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    assert _run(root, tmp_path, "").returncode == 0
    assert len(_pip_calls(tmp_path)) == 1


def test_a_python_that_cannot_make_a_venv_is_named_in_one_line(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    out = _run(root, tmp_path, "", FAKE_NO_VENV="1")
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert "cannot make a virtual environment" in line and f"python{ver}-venv" in line
    assert not (root / ".venv").exists()
