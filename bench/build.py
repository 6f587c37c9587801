"""Which build of the processor the benchmarks measure (issue 15).

By default ``python -m bench`` measures the build that ships: the compiled
wheel (``scripts/build_wheel.sh``, the container's build step), installed into
a venv under ``bench/results/tmp/`` that sees the system's site packages (the
bench's own dependencies) and rebuilt only when the package's sources change.
The bench then runs itself again in that venv, away from the checkout's
``processor/``: ``PYTHONPATH`` names a folder holding only a link to
``bench/`` and ``PYTHONSAFEPATH`` keeps the working directory off
``sys.path``, so the bench process and every child it starts (``python -m
processor run``, ``python -m bench.<figure> --child``) import the installed
compiled package.  ``--build pure`` measures the checkout's source, as before.
Every result records the build that actually ran (:func:`running_build`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / "results" / "tmp" / "venv-compiled"
#: set in the re-run bench's environment (and so its children's)
ENV_FLAG = "PROCESSOR_BENCH_BUILD"
BUILDS = ("compiled", "pure")


def running_build() -> str:
    """``compiled`` or ``pure``: what ``import processor`` gives this process."""
    import processor.core.session as session

    return "pure" if str(session.__file__).endswith(".py") else "compiled"


def describe() -> str:
    import processor

    where = Path(str(processor.__file__)).parent
    if running_build() == "compiled":
        return f"compiled (mypyc wheel, scripts/build_wheel.sh) at {where}"
    return f"pure (Python source) at {where}"


def source_digest() -> str:
    """What the wheel is built from: the package's files, setup.py, pyproject.toml."""
    h = hashlib.sha256()
    files = sorted(
        p
        for p in (REPO / "processor").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so"
    )
    for path in [*files, REPO / "setup.py", REPO / "pyproject.toml"]:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def wheelhouse() -> Path:
    return VENV / "wheels"


def ensure_compiled(say: Callable[[str], None]) -> Path:
    """The venv's python with the compiled wheel of the current sources installed."""
    py = VENV / "bin" / "python"
    stamp = VENV / "source.sha256"
    digest = source_digest()
    if py.exists() and stamp.exists() and stamp.read_text() == digest:
        _link_sources()
        return py
    say(f"building the compiled wheel into {VENV} (sources changed or first use) ...")
    shutil.rmtree(VENV, ignore_errors=True)
    _check([sys.executable, "-m", "venv", str(VENV)])
    # the dependencies come from this interpreter's environment (the project's
    # .venv) through a .pth line, as scripts/test_compiled.sh does: a venv made
    # from a venv sees the base interpreter's site, not this one's
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "processor-bench-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _check(["bash", str(REPO / "scripts" / "build_wheel.sh"), str(wheelhouse()), "--no-deps"])
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-I"]
    _check([*pip, "--no-index", "--find-links", str(wheelhouse()), "processor"])
    _link_sources()
    stamp.write_text(digest)
    return py


#: What the re-run bench imports from the checkout besides the installed build:
#: the bench itself, and the fault suite's scenarios the ship and failover
#: figures drive (``tests/`` imports ``processor`` as an installed package).
LINKED = ("bench", "tests")


def _link_sources() -> None:
    """``benchpath/`` holds links to :data:`LINKED` only, never to ``processor/``."""
    (VENV / "benchpath").mkdir(exist_ok=True)
    for name in LINKED:
        link = VENV / "benchpath" / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)


def rerun_compiled(argv: Sequence[str], say: Callable[[str], None]) -> NoReturn:
    """Replace this process by the bench in the compiled venv (same arguments)."""
    py = ensure_compiled(say)
    env = dict(os.environ)
    env.update({ENV_FLAG: "compiled", "PYTHONPATH": str(VENV / "benchpath"), "PYTHONSAFEPATH": "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(py, [str(py), "-m", "bench", *argv], env)


def child_pythonpath() -> list[str]:
    """What children need on ``PYTHONPATH`` to import the build this process runs."""
    if os.environ.get(ENV_FLAG) == "compiled":
        return [str(VENV / "benchpath")]
    return [str(REPO)]


def _check(argv: list[str]) -> None:
    with tempfile.TemporaryFile("w+") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"{' '.join(argv)} failed:\n{log.read()[-3000:]}")
