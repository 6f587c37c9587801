"""deploy/k8s/ship-sidecar: schema-valid, and the sidecar is what `processor ship` takes.

Rendered with kustomize and validated as ``test_k8s.py`` does; then: the
sessions volume is the runtime's and is mounted read-only in the sidecar,
the command line parses with ``processor ship``'s own options, the probes
and the port are the ones the config serves.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from processor.cli.ship import ship as ship_command
from processor.config import load_config
from tests.deploy.conftest import REPO
from tests.deploy.test_k8s import _one, _render, _validate

SIDECAR = REPO / "deploy" / "k8s" / "ship-sidecar"


def test_ship_sidecar_renders_valid_and_reads_the_sessions_read_only(tmp_path: Path) -> None:
    resources = _render(SIDECAR)
    for resource in resources:
        _validate(resource)
    pod = _one(resources, "Deployment")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    runtime, ship = containers["runtime"], containers["ship"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    words = shlex.split(" ".join(ship["args"]).split("exec ", 1)[1])
    assert words[:2] == ["processor", "ship"], words
    argv = words[2:]
    config_path = argv[argv.index("--config") + 1]
    stand_in = tmp_path / "ship.toml"
    cm = _one(resources, "ConfigMap")
    stand_in.write_text(cm["data"]["ship.toml"])
    config = load_config(stand_in, env={})
    root = argv[0]  # ROOT: the directories exist only in the pod
    local_root = tmp_path / "sessions"
    local_root.mkdir()
    swap = {config_path: str(stand_in), root: str(local_root)}
    ctx = ship_command.make_context("ship", [swap.get(a, a) for a in argv])
    assert ctx.params["root"] == local_root

    mounts = {m["mountPath"]: m for m in ship["volumeMounts"]}
    sessions = mounts[root]
    assert sessions["readOnly"] is True
    assert sessions["name"] in {m["name"] for m in runtime["volumeMounts"]}
    assert not any(m.get("readOnly") for m in runtime["volumeMounts"] if m["name"] == "sessions")
    state = str(ctx.params["state_dir"])
    assert state in mounts and not mounts[state].get("readOnly")
    config_mount = next(m for m in ship["volumeMounts"] if m.get("subPath") == "ship.toml")
    assert config_mount["mountPath"] == config_path
    assert volumes[config_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]

    port = next(p for p in ship["ports"] if p["name"] == "ship-metrics")
    assert port["containerPort"] == config.metrics_port and config.metrics_host == "0.0.0.0"
    assert ship["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ship-metrics"}
    assert ship["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ship-metrics"}
    secret = next(v for v in volumes.values() if "secret" in v)
    secret_dir = next(m for m in ship["volumeMounts"] if m["name"] == secret["name"])["mountPath"]
    assert Path(config.kafka["ssl.ca.location"]).parent == Path(secret_dir)
    assert f"{secret_dir}/sasl-password" in " ".join(ship["args"])
