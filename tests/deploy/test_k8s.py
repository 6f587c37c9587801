"""deploy/k8s: schema-valid offline, and consistent with what the processor does.

Every manifest is validated against the Kubernetes OpenAPI schemas bundled in
``kubernetes-validate`` (strict: unknown fields fail); the kustomize base and
the example overlay are rendered with ``kubectl kustomize`` (or ``kustomize``)
and validated as rendered.  The rest checks what a schema cannot: the pod name
is the instance id, the probes hit the endpoints the config serves, the grace
period outlasts the transaction timeout, the mounted files are the ones the
config names, and the command line only uses options ``processor run`` has.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from processor.cli.run import run as run_command
from processor.config import ServiceConfig, load_config
from tests.deploy.conftest import REPO

K8S = REPO / "deploy" / "k8s"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "example"
K8S_VERSION = "1.30.0"  # oldest Kubernetes the manifests promise to fit
CRD_KINDS = {"PodMonitor"}  # Prometheus Operator CRD: no bundled schema, checked below


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _validate(resource: dict[str, Any]) -> None:
    if resource["kind"] in CRD_KINDS:
        return
    for version in (K8S_VERSION, kubernetes_validate.latest_version()):
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(
                f"{resource['kind']}/{resource['metadata']['name']} "
                f"(Kubernetes {version}): {exc.message} at "
                f"{'.'.join(map(str, exc.path))}"
            ) from None


def _render(folder: Path) -> list[dict[str, Any]]:
    if shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", str(folder)]
    elif shutil.which("kustomize"):
        cmd = ["kustomize", "build", str(folder)]
    else:
        pytest.skip("neither kubectl nor kustomize on PATH to render the kustomization")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(resources: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [r for r in resources if r["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _config(resources: list[dict[str, Any]], folder: Path, tmp_path: Path) -> ServiceConfig:
    cm = _one(resources, "ConfigMap")
    file = tmp_path / f"{folder.name}.toml"
    file.write_text(cm["data"]["processor.toml"])
    return load_config(file, env={})  # refuses unknown settings


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    containers = sts["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "processor")


def _run_argv(container: dict[str, Any]) -> list[str]:
    """The `processor run ...` words of the container's shell command."""
    script = " ".join(container["args"])
    words = shlex.split(script.split("exec ", 1)[1])
    assert words[:2] == ["processor", "run"], words
    return words[2:]


def _parse_run(argv: list[str], tmp_path: Path) -> tuple[click.Context, str]:
    """Click's parse of the arguments (the --config file exists only in the pod)."""
    config_path = argv[argv.index("--config") + 1]
    stand_in = tmp_path / "stand-in.toml"
    stand_in.write_text("")
    local = [str(stand_in) if a == config_path else a for a in argv]
    return run_command.make_context("run", local), config_path


def test_every_base_manifest_is_schema_valid_on_its_own() -> None:
    files = sorted(BASE.glob("*.yaml"))
    kinds = set()
    for file in files:
        if file.name == "kustomization.yaml":
            continue
        for doc in _docs(file):
            _validate(doc)
            kinds.add(doc["kind"])
    assert {"StatefulSet", "PodDisruptionBudget", "Service", "PodMonitor"} <= kinds


def test_the_validator_rejects_a_broken_manifest() -> None:
    sts = _docs(BASE / "statefulset.yaml")[0]
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pathh"] = "/"
    with pytest.raises(AssertionError, match="pathh"):
        _validate(sts)


@pytest.mark.parametrize("folder", [BASE, OVERLAY], ids=["base", "overlay"])
def test_kustomization_renders_to_valid_consistent_manifests(folder: Path, tmp_path: Path) -> None:
    resources = _render(folder)
    for resource in resources:
        _validate(resource)
    config = _config(resources, folder, tmp_path)
    sts = _one(resources, "StatefulSet")
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = _container(sts)

    # the pod name is the instance id (stable transactional id); membership is
    # dynamic: static classic members stalled on a group coordinator's loss (issue 37)
    ctx, config_path = _parse_run(_run_argv(container), tmp_path)
    assert ctx.params["instance_id"] == "$POD_NAME" and not ctx.params["static_membership"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert sts["kind"] == "StatefulSet"

    # probes and scrapes reach the endpoint the config serves
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    assert port["containerPort"] == config.metrics_port
    assert config.metrics_host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    monitor = _one(resources, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    pdb = _one(resources, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1

    # SIGTERM: the open batch commits (up to the transaction timeout) and the
    # producer flushes (10 s) before the kubelet kills the pod
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > config.transaction_timeout_ms / 1000 + 10
    assert grace > config.revoke_budget_ms / 1000

    # mounted files are the ones named by the config and the command
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config_mount = next(m for m in mounts.values() if m.get("subPath") == "processor.toml")
    assert config_path == config_mount["mountPath"]
    assert (
        volumes[config_mount["name"]]["configMap"]["name"]
        == _one(resources, "ConfigMap")["metadata"]["name"]
    )
    secret = next(v for v in volumes.values() if "secret" in v)
    secret_dir = mounts[secret["name"]]["mountPath"]
    assert Path(config.kafka["ssl.ca.location"]).parent == Path(secret_dir)
    assert f"{secret_dir}/sasl-password" in " ".join(container["args"])

    # the local store is on a writable volume (the root filesystem is read-only:
    # a store that cannot be opened leaves the pod unready), its budget within it
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    state = config.state_path
    assert state is not None and state.is_absolute()
    state_mount = next(
        m for m in mounts.values() if state.is_relative_to(m["mountPath"]) and "subPath" not in m
    )
    assert not state_mount.get("readOnly")
    # a volume per pod: a replaced pod (a rollout) restores from it, not the topic
    claims = {c["metadata"]["name"]: c for c in sts["spec"]["volumeClaimTemplates"]}
    assert state_mount["name"] in claims and state_mount["name"] not in volumes
    size = claims[state_mount["name"]]["spec"]["resources"]["requests"]["storage"]
    assert config.store_bytes < _quantity(size) * 0.8  # room for the write-ahead log

    # resources are set, memory bounded; the image runs as the Dockerfile's user
    res = container["resources"]
    assert res["limits"]["memory"] == res["requests"]["memory"]
    dockerfile = (REPO / "deploy/container/Dockerfile").read_text()
    user = re.findall(r"^USER (\d+)", dockerfile, re.M)[-1]
    assert pod["spec"]["securityContext"]["runAsUser"] == int(user)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # replicas beyond the partition count would idle
    assert sts["spec"]["replicas"] <= config.partitions


def _quantity(text: str) -> int:
    """A Kubernetes quantity in bytes (binary suffixes, what the manifests use)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def test_overlay_changes_only_what_an_environment_owns(tmp_path: Path) -> None:
    base, overlay = _render(BASE), _render(OVERLAY)
    sts = _one(overlay, "StatefulSet")
    assert all(r["metadata"].get("namespace") == "agents" for r in overlay)
    assert _container(sts)["image"].startswith("registry.example.com/")
    assert (
        _config(overlay, OVERLAY, tmp_path).topic_prefix
        != _config(base, BASE, tmp_path).topic_prefix
    )
    # the config map name carries a content hash: a changed file rolls the pods
    assert re.fullmatch(
        r"processor-config-[a-z0-9]{10}", _one(overlay, "ConfigMap")["metadata"]["name"]
    )


def test_run_options_in_the_manifest_exist(tmp_path: Path) -> None:
    # a renamed option must break this test, not the rollout
    sts = _docs(BASE / "statefulset.yaml")[0]
    argv = _run_argv(_container(sts))
    _parse_run(argv, tmp_path)
    with pytest.raises(click.NoSuchOption):
        _parse_run([*argv, "--no-such-option"], tmp_path)
