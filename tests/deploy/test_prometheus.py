"""deploy/prometheus: the rules check, their unit tests pass, and a real server uses them.

``promtool`` and ``prometheus`` come from Debian's ``prometheus`` package
(scripts/test.sh installs it when missing).  The end-to-end test starts a real
Prometheus server on a free localhost port with a temp config that scrapes a
running ``processor run`` every second and evaluates the rules; it then reads
the events and lag series and a recording rule through the HTTP API, and sees
the dead-letter alert fire after a session with a gap is ingested.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import (
    PACKAGE,
    REPO,
    background,
    checkout_env,
    checkout_processor,
    free_port,
    http_get,
    wait_until,
)
from tests.kafka_fixtures import unique_prefix

#: recording and alerting rules in deploy/prometheus/processor-rules.yaml (promtool counts
#: them; a running Prometheus must find every one healthy)
RULE_COUNT = 22

RULES = REPO / "deploy" / "prometheus" / "processor-rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "processor-rules.test.yaml"
EXAMPLE = PACKAGE / "examples" / "session.jsonl"


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(
            f"{name} not found: install Debian's prometheus package (scripts/test.sh "
            "does when it is missing)"
        )
    return exe


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run(
        [_tool("promtool"), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {RULE_COUNT} rules found" in out.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    out = subprocess.run(
        [_tool("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_rule_unit_tests_fail_on_a_broken_rule(tmp_path: Path) -> None:
    # the unit tests must be able to fail: loosen one threshold and they do
    rules = RULES.read_text().replace(
        "processor:sessions_quarantined:sum > 0", "processor:sessions_quarantined:sum > 1"
    )
    assert rules != RULES.read_text()
    (tmp_path / RULES.name).write_text(rules)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    out = subprocess.run(
        [_tool("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode != 0 and "ProcessorSessionsQuarantined" in out.stdout + out.stderr


def test_every_alert_names_an_existing_runbook_section() -> None:
    import yaml

    anchors = _runbook_anchors()
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "ProcessorLagGrowing",
        "ProcessorNoProgress",
        "ProcessorPartitionStalled",
        "ProcessorSessionsQuarantined",
        "ProcessorDeadLetters",
        "ProcessorTransactionsAborting",
        "ProcessorNotReady",
        "ProcessorRebalanceStorm",
        "ProcessorRestoreSlow",
        "ProcessorRestoreWaiting",
    }
    for alert in alerts:
        page, _, anchor = alert["annotations"]["runbook"].partition("#")
        assert page == "docs/operations.md" and anchor in anchors, alert["alert"]


def _runbook_anchors() -> set[str]:
    """GitHub-style anchors of the runbook's headings."""
    import re

    anchors = set()
    for line in (REPO / "docs" / "operations.md").read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


# ----------------------------------------------------------------- end to end


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}")
    if status != 200:
        return []
    return list(json.loads(body)["data"]["result"])


def _value(base: str, expr: str) -> float | None:
    result = _query(base, expr)
    return float(result[0]["value"][1]) if len(result) == 1 else None


@pytest.mark.kafka
def test_prometheus_scrapes_a_running_processor_and_evaluates_the_rules(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = unique_prefix("prom")
    env = checkout_env(
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        PROCESSOR_TOPIC_PREFIX=prefix,
        PROCESSOR_GROUP_ID=prefix,
        PROCESSOR_PARTITIONS="2",
    )
    cli = checkout_processor()
    made = subprocess.run(
        [*cli, "topics", "create"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    metrics_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "processor",
                        "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
                    }
                ],
            }
        )
    )
    member_cmd = [
        *cli,
        "run",
        "--instance-id",
        "processor-0",
        "--metrics-port",
        str(metrics_port),
        "--commit-interval-ms",
        "100",
    ]
    prom_cmd = [
        _tool("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--log.level=warn",
    ]
    with (
        background(member_cmd, tmp_path / "processor.log", env=env) as member,
        background(prom_cmd, tmp_path / "prometheus.log") as prom,
    ):
        base = f"http://127.0.0.1:{prom_port}"
        wait_until(lambda: http_get(f"{base}/-/ready")[0] == 200, "Prometheus ready")
        wait_until(lambda: _value(base, 'up{job="processor"}') == 1.0, "the processor target up")
        ingest = subprocess.run(
            [*cli, "ingest", str(EXAMPLE), "--session-id", "good"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ingest.returncode == 0, ingest.stderr
        events = len(EXAMPLE.read_text().splitlines()) - 1  # less the header line

        # the events series: every event of the session applied
        wait_until(
            lambda: _value(base, 'processor_events_total{outcome="applied"}') == float(events),
            f"{events} applied events in Prometheus",
        )
        # the lag series: the partition that got the session, caught up (a partition
        # the member never consumed from exports none); the recording rule sums them
        wait_until(lambda: _query(base, "processor_partition_lag"), "a lag series")
        wait_until(lambda: _value(base, "processor:lag:sum") == 0.0, "processor:lag:sum = 0")
        rules = json.loads(http_get(f"{base}/api/v1/rules")[1])["data"]["groups"]
        assert [r["health"] for g in rules for r in g["rules"]] == ["ok"] * RULE_COUNT

        # a session with a gap: dead letter and quarantine, and the alert fires
        lines = EXAMPLE.read_text().splitlines(keepends=True)
        gap = tmp_path / "gap.jsonl"
        gap.write_text("".join(lines[:10] + lines[11:]))
        raw = subprocess.run(
            [*cli, "ingest", "--raw", str(gap), "--session-id", "gappy"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert raw.returncode == 0, raw.stderr

        def firing() -> list[dict[str, Any]]:
            status, body = http_get(f"{base}/api/v1/alerts")
            alerts = json.loads(body)["data"]["alerts"] if status == 200 else []
            return [
                a
                for a in alerts
                if a["labels"]["alertname"] == "ProcessorDeadLetters" and a["state"] == "firing"
            ]

        alert = wait_until(firing, "ProcessorDeadLetters firing")[0]
        assert alert["labels"]["job"] == "processor" and alert["labels"]["rule"]
        wait_until(
            lambda: _value(base, "processor:sessions_quarantined:sum") == 1.0,
            "one quarantined session in Prometheus",
        )
        assert member.terminate() == 0, member.output()
        assert prom.terminate() == 0, prom.output()
