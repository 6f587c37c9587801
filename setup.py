"""Build step that makes the wheel self-contained.

The Avro schemas (``schemas/``, the cross-language contract) and the dev
broker's Maven files (``deploy/kafka/pom.xml``, ``log4j2.properties``) live
outside the ``processor`` package in the repository, so there is one copy to
edit.  A wheel has no repository: this copies them into the built package
(``processor/schemas/``, ``processor/devbroker_files/``), where
``find_schema_dir()`` and ``processor.devbroker`` look when the checkout's
copies are absent.  Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent

#: package-relative target folder -> (source folder, file patterns)
SHIPPED: dict[str, tuple[str, tuple[str, ...]]] = {
    "schemas": ("schemas", ("*.avsc", "history/*.avsc")),
    "devbroker_files": ("deploy/kafka", ("pom.xml", "log4j2.properties")),
}


class BuildWithSharedData(build_py):
    def run(self) -> None:
        super().run()
        for target, (source, patterns) in SHIPPED.items():
            files = [f for pattern in patterns for f in sorted((ROOT / source).glob(pattern))]
            if not files:
                # a wheel without them would fail only at run time: refuse to build it
                raise RuntimeError(f"nothing to ship from {ROOT / source} {patterns}")
            for file in files:
                dest = Path(self.build_lib) / "processor" / target / file.relative_to(
                    ROOT / source)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, dest)


#: The compiled build is what ships: ``PROCESSOR_MYPYC=1`` compiles the hot,
#: strictly typed modules with mypyc (the container's build stage and
#: scripts/build_wheel.sh set it).  Without it, a plain ``pip install .`` builds
#: the pure-Python package: the single source and the fallback, with no C
#: compiler needed; the checkout's editable installs stay pure that way too (a
#: compiled editable build would drop .so files beside the sources, shadowing
#: them for every PYTHONPATH run).  The .py files stay in the compiled wheel.
#:
#: What is compiled is derived: every module of these packages and these
#: single modules, less the named exclusions, so a new module of the core is
#: compiled (and tested compiled) without anyone remembering to list it.
MYPYC_PACKAGES = ("processor/core", "processor/engine", "processor/codec")
MYPYC_SINGLE = (
    "processor/files.py",
    "processor/offline.py",
    "processor/service/loop/fold_loop.py",
)
#: module -> why it stays interpreted (every entry must exist: a stale one fails the build)
MYPYC_EXCLUDED = {
    "processor/core/frozen.py": "dict/list subclasses: mypyc cannot compile them",
    "processor/core/frozen_types.py": "the frozen dict/list classes themselves (as frozen.py)",
    "processor/core/leaf.py": "the import shim of the C module _leaf",
    "processor/core/errors.py": "the error root: exception classes, raised_from (no hot path)",
    "processor/core/builder.py": "builds example logs (tests, examples, benches), not folds",
    "processor/core/defaults.py": "assembles the default registries once per session",
    "processor/engine/checkpoints.py": "decodes checkpoints at restore only",
    "processor/engine/commands.py": "control records: rare, and full of dynamic JSON",
    "processor/engine/dead_letters.py": "dead letters: off the hot path",
    "processor/engine/run_errors.py": "exception classes",
    "processor/engine/ports.py": "the Protocols the engine's callers implement: no code",
    "processor/engine/replay_floor.py": "computed once per session of a replay",
    "processor/codec/names.py": "constants",
    "processor/codec/typed_records.py": "dataclasses read by every layer; no hot loop",
    "processor/codec/schemas.py": "the schema store: loaded once",
}


def mypyc_modules(root: Path = ROOT) -> list[str]:
    """The compiled build's modules, as paths relative to ``root``."""
    for path in MYPYC_EXCLUDED:
        if not (root / path).is_file():
            raise SystemExit(f"setup.py: MYPYC_EXCLUDED names {path}, which does not exist")
    found = [
        p.relative_to(root).as_posix()
        for package in MYPYC_PACKAGES
        for p in sorted((root / package).rglob("*.py"))
        if p.name != "__init__.py"
    ]
    found += list(MYPYC_SINGLE)
    return [p for p in found if p not in MYPYC_EXCLUDED]


#: the mypy (mypyc) a compiled build uses; pyproject.toml's [build-system]
#: requires names the same pin, so an isolated build (pip's default, the
#: container's) is reproducible, and a --no-build-isolation one must match it
MYPY_PIN = "mypy==2.4.1"


def _ext_modules() -> dict[str, Any]:
    flag = os.environ.get("PROCESSOR_MYPYC", "0")
    if flag not in ("0", "1"):
        raise SystemExit(f"PROCESSOR_MYPYC must be 0 (pure) or 1 (compiled), not {flag!r}")
    if flag == "0":
        return {}
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mypy")
    except PackageNotFoundError:
        found = "none"
    if found != MYPY_PIN.split("==")[1]:
        raise SystemExit(f"PROCESSOR_MYPYC=1 builds with {MYPY_PIN} (setup.py, pyproject.toml), "
                         f"found mypy {found}: build in isolation or install the pin")
    from mypyc.build import mypycify

    # the strict config names processor.agent too: not built here, not an error
    compiled = mypycify(["--no-warn-unused-configs", *mypyc_modules()], opt_level="3")
    return {"ext_modules": [*compiled, *_leaf_module()]}


def _leaf_module() -> list[Extension]:
    """The C module that keeps frozen values out of the cyclic collector
    (processor/core/leaf.py): its own switch, ``PROCESSOR_LEAF`` (default: on in
    a compiled build).  Without it the frozen values stay tracked, which
    changes nothing but the collector's work."""
    flag = os.environ.get("PROCESSOR_LEAF", "1")
    if flag not in ("0", "1"):
        raise SystemExit(f"PROCESSOR_LEAF must be 0 or 1, not {flag!r}")
    if flag == "0":
        return []
    return [Extension("processor.core._leaf", ["processor/core/_leaf.c"])]


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildWithSharedData}, **_ext_modules())
