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


#: The compiled build (issue 15) is what ships: ``PROCESSOR_MYPYC=1`` compiles
#: the hot strictly typed modules below with mypyc (the container's build stage
#: and scripts/build_wheel.sh set it).  Without it, a plain ``pip install .``
#: builds the pure-Python package: the single source and the fallback, with no C
#: compiler needed; the checkout's editable installs stay pure that way too (a
#: compiled editable build would drop .so files beside the sources, shadowing
#: them for every PYTHONPATH run).  The .py files stay in the compiled wheel.
#: ``frozen`` stays interpreted: mypyc cannot compile dict/list subclasses.
MYPYC_MODULES = [
    "processor/core/events.py",
    "processor/core/freezing.py",
    "processor/core/event_checks.py",
    "processor/core/header.py",
    "processor/core/image_offload.py",
    "processor/core/log.py",
    "processor/core/messages.py",
    "processor/core/message_projections.py",
    "processor/core/projection_cell.py",
    "processor/core/projection_registry.py",
    "processor/core/projection_restore.py",
    "processor/core/restore_share.py",
    "processor/core/projections.py",
    "processor/core/session.py",
    "processor/core/sharing.py",
    "processor/core/surface.py",
    "processor/core/surface_plans.py",
    "processor/core/builtin/_common.py",
    "processor/core/builtin/inbox.py",
    "processor/core/builtin/request_header.py",
    "processor/core/builtin/runtime_units.py",
    "processor/core/builtin/session_stats.py",
    "processor/core/builtin/tool_history.py",
    "processor/core/builtin/turn_boundary.py",
    "processor/files.py",
    "processor/offline.py",
    # the engine (issue 15, helper `out`): fold bookkeeping and output assembly
    "processor/engine/gate.py",
    "processor/engine/held.py",
    "processor/engine/runtime.py",
    "processor/engine/chunks.py",
    "processor/engine/view_parts.py",
    "processor/engine/checkpoint_parts.py",
    "processor/engine/output.py",
    "processor/engine/records.py",
    "processor/engine/engine.py",
    "processor/codec/avro_compiled.py",
    "processor/codec/avro_fast.py",
    "processor/codec/avro_event.py",
    # orjson + zstd of every view and checkpoint payload (helper `svc3`)
    "processor/codec/payload.py",
    # the decode chain and the codec's per-record calls (helper `dec`)
    "processor/codec/decoded.py",
    "processor/codec/envelope.py",
    "processor/codec/framed.py",
    "processor/codec/parted.py",
    # the service loop's per-record fold (helper `svc4`, figure 2)
    "processor/service/loop/fold_loop.py",
]


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
    compiled = mypycify(["--no-warn-unused-configs", *MYPYC_MODULES], opt_level="3")
    # frozen values out of the cyclic collector (processor/core/leaf.py)
    leaf = Extension("processor.core._leaf", ["processor/core/_leaf.c"])
    return {"ext_modules": [*compiled, leaf]}


setup(cmdclass={"build_py": BuildWithSharedData}, **_ext_modules())
