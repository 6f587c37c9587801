"""The container recipe, tested without a container engine.

``deploy/container/Dockerfile`` builds the wheels in one stage (the processor's
is the compiled build, ``PROCESSOR_MYPYC=1``) and installs them into a fresh
virtual environment, as a non-root user, in the next; its entry point is
``processor run``.  These tests do the same on the host: build the wheels with
``scripts/build_wheel.sh`` (the build stage's step on the same files; or take
the ones CI built with it, ``PROCESSOR_WHEELHOUSE``), install them with ``pip
--no-index`` into a fresh venv owned by a non-root user in a temp directory
outside the checkout (no PYTHONPATH, cwd elsewhere), check that the modules
setup.py compiles are the compiled ones, and run ``processor fold``,
``processor run`` against the real broker (health, readiness, views, clean
SIGTERM) and ``processor demo`` with its own dev broker, which reads the
wheel's packaged pom.xml and log4j config."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from processor.devbroker import default_jars_dir, kafka_version, resolve_jars
from tests.deploy.conftest import (
    PACKAGE,
    REPO,
    Unprivileged,
    background,
    checkout_env,
    checkout_processor,
    free_port,
    http_get,
    make_venv,
    wait_until,
)
from tests.kafka_fixtures import unique_prefix

DOCKERFILE = REPO / "deploy" / "container" / "Dockerfile"
EXAMPLE = "processor/examples/session.jsonl"


@dataclass
class Installed:
    user: Unprivileged
    venv: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        return self.user.env([self.bin], **extra)

    def run(
        self,
        *argv: str,
        timeout: float = 300,
        **extra: str,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.user.command(argv),
            env=self.env(**extra),
            cwd=self.user.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def site_file(self, relative: str) -> Path:
        out = self.run(
            "python",
            "-c",
            "import pathlib, processor; print(pathlib.Path(processor.__file__).parent)",
        )
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip()).parent / relative


def compiled_modules() -> list[str]:
    """setup.py's ``mypyc_modules()`` as module names (what the compiled build compiles)."""
    spec = importlib.util.spec_from_file_location("processor_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # setup() runs only as __main__
    # the package's files: the checkout's (the compiled run's folder has none)
    source = Path(os.environ.get("PROCESSOR_PURE_SOURCE") or REPO)
    files: list[str] = setup_py.mypyc_modules(source)
    assert len(files) >= 40, files
    return [f.removesuffix(".py").replace("/", ".") for f in files]


def build_wheelhouse(out: Path) -> None:
    """The shipped wheels: scripts/build_wheel.sh, or the wheelhouse CI built with it."""
    ready = os.environ.get("PROCESSOR_WHEELHOUSE")
    if ready:
        shutil.copytree(ready, out, dirs_exist_ok=True)
        return
    # the build side (root in CI) may use its pip cache; the install side may not reach it
    # PYTHON: this interpreter, whose environment holds the dependencies the
    # compiler type-checks against (a bare python3 has none of them)
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build_wheel.sh"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr


@pytest.fixture(scope="module")
def installed(unprivileged: Unprivileged) -> Iterator[Installed]:
    """The shipped wheels, installed into a fresh venv by the non-root user."""
    house = unprivileged.home / "wheelhouse"
    build_wheelhouse(house)
    wheel = next(house.glob("processor-*.whl"))
    unprivileged.give(house)
    venv = unprivileged.home / "venv"
    make_venv(unprivileged, venv)
    argv = [
        str(venv / "bin" / "pip"),
        "install",
        "-q",
        "--no-index",
        "--find-links",
        str(house),
        "processor",
    ]
    done = subprocess.run(
        unprivileged.command(argv),
        env=unprivileged.env(),
        cwd=unprivileged.home,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    yield Installed(unprivileged, venv, wheel)


# ------------------------------------------------------------------ recipe


def _stages(text: str) -> list[list[str]]:
    """Dockerfile instructions (continuations joined) grouped by FROM."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        elif stages:
            stages[-1].append(line)
    return stages


def test_container_recipe_is_multi_stage_non_root_with_health_check() -> None:
    stages = _stages(DOCKERFILE.read_text())
    assert len(stages) >= 2, "a build stage and a runtime stage"
    final = stages[-1]
    keywords = [i.split()[0].upper() for i in final]
    # the runtime stage gets nothing from the source tree and no wheel layer
    assert "COPY" not in keywords and "ADD" not in keywords, final
    install = next(i for i in final if "pip install" in i)
    assert "--no-index" in install and "from=build" in install and "--mount=type=bind" in install
    assert any(i.startswith("ENV") and "PIP_NO_CACHE_DIR=1" in i for i in final)
    user = next(i for i in final if i.upper().startswith("USER ")).split()[1]
    assert user.split(":")[0] not in ("0", "root")
    assert int(user.split(":")[0]) > 0
    entry = next(i for i in final if i.upper().startswith("ENTRYPOINT"))
    assert json.loads(entry.split(None, 1)[1]) == ["processor", "run"]
    health = next(i for i in final if i.upper().startswith("HEALTHCHECK"))
    assert "/healthz" in health
    # the build stage builds wheels; nothing else reaches the runtime stage
    assert any("pip wheel" in i for i in stages[0])
    ignore = [
        line
        for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert ignore[0] == "**", "the build context denies everything not listed"


def _arg_defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))


def test_container_builds_the_compiled_wheel_on_the_runtime_python() -> None:
    text = DOCKERFILE.read_text()
    args = _arg_defaults(text)
    froms = re.findall(r"^FROM \$\{(\w+)\} AS (\w+)", text, re.M)
    images = {stage: args[arg] for arg, stage in froms}
    build, runtime = images["build"], images["runtime"]
    # the build stage has a compiler (the full image), the runtime none (slim) ...
    assert "slim" not in build and "slim" in runtime, images
    # ... and both are the same Python on the same Debian release: the ABI of the
    # compiled modules is the runtime interpreter's
    assert build.split(":")[0] == runtime.split(":")[0] == "python"
    tag_b, tag_r = build.split(":")[1].split("-"), runtime.split(":")[1].split("-")
    assert tag_b[0] == tag_r[0] and tag_b[-1] == tag_r[-1], images
    stage_build = _stages(text)[0]
    assert any(i.startswith("ENV") and "PROCESSOR_MYPYC=1" in i for i in stage_build)
    # the build stage and scripts/build_wheel.sh build from the same files
    copied = {
        src
        for i in stage_build
        if i.upper().startswith("COPY ")
        for src in i.split()[1:-1]
        if not src.startswith("--")
    }
    script = (REPO / "scripts" / "build_wheel.sh").read_text()
    files = re.search(r"^FILES=\((.*?)\)", script, re.M | re.S)
    assert files is not None
    assert set(files.group(1).split()) == copied


def test_compiler_is_pinned_for_the_build() -> None:
    pin = re.search(r'^MYPY_PIN = "(mypy==[\w.]+)"', (REPO / "setup.py").read_text(), re.M)
    assert pin is not None
    requires = re.search(r"^requires = (\[.*?\])", (REPO / "pyproject.toml").read_text(), re.M)
    assert requires is not None
    assert pin.group(1) in json.loads(requires.group(1))


def test_installed_modules_are_the_compiled_ones(installed: Installed) -> None:
    # a platform wheel (a pure one would be py3-none-any) ...
    assert not installed.wheel.name.endswith("-none-any.whl"), installed.wheel.name
    modules = compiled_modules()
    assert "processor.core.session" in modules and "processor.engine.engine" in modules
    probe = (
        "import importlib, json, sys; "
        "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))"
    )
    out = installed.run("python", "-c", probe, *modules)
    assert out.returncode == 0, out.stderr
    files = json.loads(out.stdout)
    # ... whose every module setup.py compiles is an extension module in the venv
    site = str(installed.venv)
    pure = {m: f for m, f in files.items() if not (f.startswith(site) and f.endswith(".so"))}
    assert not pure, f"not compiled: {pure}"


def test_wheel_ships_schemas_and_dev_broker_files(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for schema in sorted((REPO / "schemas").rglob("*.avsc")):
        assert f"processor/schemas/{schema.relative_to(REPO / 'schemas')}" in names
    assert "processor/devbroker_files/pom.xml" in names
    assert "processor/devbroker_files/log4j2.properties" in names
    assert "processor/examples/session.jsonl" in names
    # the copies are the checkout's files, byte for byte
    pom = installed.site_file("processor/devbroker_files/pom.xml")
    assert pom.read_bytes() == (REPO / "deploy/kafka/pom.xml").read_bytes()


def test_installed_package_finds_its_own_data_outside_the_checkout(installed: Installed) -> None:
    probe = (
        "import json, processor.kafka_dist as d; "
        "from processor.codec import default_codec, find_schema_dir; "
        "default_codec(); print(json.dumps([str(find_schema_dir()), str(d.POM), "
        "str(d.LOG4J_CONFIG), d.kafka_version()]))"
    )
    out = installed.run("python", "-c", probe)
    assert out.returncode == 0, out.stderr
    schemas, pom, log4j, version = json.loads(out.stdout)
    site = str(installed.venv)
    assert schemas.startswith(site) and pom.startswith(site) and log4j.startswith(site)
    assert str(REPO) not in schemas + pom + log4j
    assert version == kafka_version()


def test_fold_from_the_wheel_equals_the_checkout(installed: Installed) -> None:
    example = installed.site_file(EXAMPLE)
    wheel = installed.run("processor", "fold", str(example), "--at", "40")
    assert wheel.returncode == 0, wheel.stderr
    checkout = subprocess.run(
        [*checkout_processor(), "fold", str(PACKAGE.parent / EXAMPLE), "--at", "40"],
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checkout.returncode == 0, checkout.stderr
    assert json.loads(wheel.stdout) == json.loads(checkout.stdout)


@pytest.mark.kafka
def test_entry_point_runs_against_the_broker_as_non_root(
    installed: Installed, kafka_bootstrap: str
) -> None:
    prefix = unique_prefix("whl")
    port = free_port()
    kafka: dict[str, Any] = {  # Any: **kafka cannot then be taken for timeout=
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PROCESSOR_TOPIC_PREFIX": prefix,
        "PROCESSOR_GROUP_ID": prefix,
        "PROCESSOR_PARTITIONS": "2",
    }
    made = installed.run("processor", "topics", "create", **kafka)
    assert made.returncode == 0, made.stderr
    log = installed.user.home / f"{prefix}.log"
    # the image's entry point and environment: `processor run`, metrics on 0.0.0.0
    cmd = installed.user.command(
        [
            str(installed.bin / "processor"),
            "run",
            "--instance-id",
            "processor-0",
            "--static-membership",
        ]
    )
    env = installed.env(PROCESSOR_METRICS_HOST="0.0.0.0", PROCESSOR_METRICS_PORT=str(port), **kafka)
    with background(cmd, log, env=env, cwd=installed.user.home) as member:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(f"{base}/healthz")[0] == 200, "/healthz 200")
        wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, "/readyz 200 (restored)")
        example = installed.site_file(EXAMPLE)
        ing = installed.run("processor", "ingest", str(example), "--session-id", "wheel-1", **kafka)
        assert ing.returncode == 0, ing.stderr
        assert "1 session(s)" in ing.stdout

        def folded() -> str | None:
            out = installed.run(
                "processor",
                "views",
                "--session",
                "wheel-1",
                "--format",
                "fold",
                "--timeout",
                "20",
                **kafka,
            )
            return out.stdout if out.returncode == 0 and '"asOfSeq"' in out.stdout else None

        views = json.loads(wait_until(folded, "the session's views"))
        offline = json.loads(installed.run("processor", "fold", str(example)).stdout)
        assert views["wheel-1"]["asOfSeq"] == offline["asOfSeq"]
        assert views["wheel-1"]["messages"] == offline["messages"]
        metrics = http_get(f"{base}/metrics")[1].decode()
        assert re.search(r'^processor_events_total\{outcome="applied"\} [1-9]', metrics, re.M)
        assert member.terminate() == 0, member.output()
    assert "Traceback" not in member.output()


@pytest.mark.kafka
def test_demo_from_the_wheel_starts_its_own_broker(installed: Installed) -> None:
    # the dev broker of the wheel: packaged pom.xml (version, jar marker) and log4j
    # config.  The jars come from the build side's cache (copied: the non-root
    # user cannot read root's home), so no Maven run is needed here.
    source = resolve_jars(default_jars_dir())
    cache = installed.user.home / "kafka-cache"
    shutil.copytree(source, cache / kafka_version() / "jars")
    installed.user.give(cache)
    out = installed.run(
        "processor", "demo", "--sessions", "2", timeout=600, PROCESSOR_KAFKA_CACHE=str(cache)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all 2 sessions match the offline fold exactly" in out.stdout
    assert "broker stopped" in out.stderr
