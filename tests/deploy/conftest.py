"""Shared helpers of the deploy tests: processes, ports, waits, an unprivileged user.

Everything runs for real: the processor as a subprocess, a real broker (the
session fixture), a real Prometheus server, real kubectl/promtool binaries.
Waits poll a condition with a generous deadline; nothing asserts wall-clock
times.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

import processor
from tests.local_http import free_port as free_port  # the deploy tests import it from here

REPO = Path(__file__).resolve().parents[2]
#: the imported package: the checkout's source, or the installed wheel when the
#: suite runs on the compiled build (scripts/test_compiled.sh, no processor/ in REPO)
PACKAGE = Path(str(processor.__file__)).resolve().parent
T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None], what: str, timeout: float = 120.0, every: float = 0.25
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


@dataclass
class Background:
    """A process started by a test, stopped (by its own pid) when the test ends."""

    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(
                    f"{self.proc.args!r} ignored SIGTERM:\n{self.output()}"
                ) from None
        return int(self.proc.returncode)


@contextlib.contextmanager
def background(
    cmd: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[Background]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
    bg = Background(proc, log)
    try:
        yield bg
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def checkout_env(**extra: str) -> dict[str, str]:
    """The environment of a checkout `processor` (PYTHONPATH = the worktree)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def checkout_processor() -> list[str]:
    return [sys.executable, "-m", "processor"]


# ------------------------------------------------------------- non-root user


@dataclass
class Unprivileged:
    """Runs commands as a non-root user (``nobody`` when the tests run as root)."""

    home: Path
    prefix: list[str] = field(default_factory=list)
    uid: int = field(default_factory=os.geteuid)
    gid: int = field(default_factory=os.getegid)

    def env(self, path: Sequence[Path] = (), **extra: str) -> dict[str, str]:
        """A clean environment: no PYTHONPATH, no pip settings of the host."""
        dirs = [str(p) for p in path] + ["/usr/local/bin", "/usr/bin", "/bin"]
        env = {"PATH": os.pathsep.join(dirs), "HOME": str(self.home), "LANG": "C.UTF-8"}
        env.update(extra)
        return env

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]

    def give(self, path: Path) -> None:
        """Hand ``path`` (recursively) to the user."""
        if os.geteuid() == 0:
            for p in [path, *path.rglob("*")]:
                os.lchown(p, self.uid, self.gid)

    def can_run(self, argv: Sequence[str]) -> bool:
        try:
            return (
                subprocess.run(
                    self.command(argv),
                    env=self.env(),
                    capture_output=True,
                    timeout=60,
                    check=False,
                    cwd=self.home,
                ).returncode
                == 0
            )
        except OSError:
            return False


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[Unprivileged]:
    # /tmp, not pytest's tmp_path: that one is private to the user running pytest
    home = Path(tempfile.mkdtemp(prefix="processor-deploy-"))
    home.chmod(0o755)
    try:
        if os.geteuid() != 0:
            yield Unprivileged(home)
            return
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("running as root without setpriv: cannot drop to a non-root user")
        nobody = pwd.getpwnam("nobody")
        user = Unprivileged(
            home,
            [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"],
            nobody.pw_uid,
            nobody.pw_gid,
        )
        user.give(home)
        yield user
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _traversable(path: Path, user: Unprivileged) -> bool:
    """Every folder above ``path`` lets ``user`` through (by mode bits)."""
    for folder in path.resolve().parents:
        st = folder.stat()
        bit = 0o100 if st.st_uid == user.uid else 0o010 if st.st_gid == user.gid else 0o001
        if not st.st_mode & bit:
            return False
    return True


def make_venv(user: Unprivileged, venv: Path) -> None:
    """A fresh venv (with pip) owned by ``user``, from a Python >= 3.11 it can run.

    Root's own interpreter may live in a private home (pyenv); the system's
    ``/usr/bin/python3.X`` is the fallback (Debian: python3-venv).
    """
    v = sys.version_info
    candidates = [sys.executable, f"/usr/bin/python{v.major}.{v.minor}", "/usr/bin/python3"]
    errors = []
    for exe in candidates:
        if not Path(exe).exists() or not _traversable(Path(exe), user):
            continue
        done = subprocess.run(
            user.command([exe, "-m", "venv", str(venv)]),
            env=user.env(),
            cwd=user.home,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode == 0 and user.can_run(
            [str(venv / "bin" / "python"), "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
        ):
            return
        errors.append(f"{exe}: {done.stderr.strip()}")
        shutil.rmtree(venv, ignore_errors=True)
    pytest.fail(
        f"no Python >= 3.11 of which uid {user.uid} can make a venv among "
        f"{candidates} (scripts/test.sh installs python3-venv): {errors}"
    )
