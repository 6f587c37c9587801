"""deploy/grafana and deploy/prometheus only query what the processor exports.

The exported series come from the processor's own registry
(:class:`processor.telemetry.metrics.Metrics`): counter ``x`` exports
``x_total``, histogram ``x`` exports ``x_bucket``/``x_sum``/``x_count``.  Each
PromQL expression of the dashboard and of the rules is reduced to the metric
names and label names it uses; a renamed metric or label fails here, not on
an empty panel or a silent alert.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from processor.telemetry.metrics import Metrics
from tests.deploy.conftest import REPO

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "processor-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "processor-rules.yaml"
#: labels Prometheus adds to every scraped series
TARGET_LABELS = {"job", "instance"}
#: series the rules read from elsewhere (kube-state-metrics, Prometheus itself)
FOREIGN = {"kube_pod_status_ready": {"namespace", "pod", "condition"}, "up": set()}

_WORDS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "by",
    "without",
    "rate",
    "increase",
    "deriv",
    "irate",
    "delta",
    "histogram_quantile",
    "and",
    "or",
    "unless",
    "ignoring",
    "on",
    "offset",
    "bool",
    "label_values",
    "group_left",
    "group_right",
    "topk",
    "bottomk",
    "max_over_time",
    "min_over_time",
    "avg_over_time",
    "abs",
    "clamp_min",
    "inf",
    "nan",
}


def exported() -> dict[str, set[str]]:
    """Series name -> label names, from a fresh registry of the processor."""
    series: dict[str, set[str]] = {}
    for value in vars(Metrics()).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        # prometheus_client keeps name, type and label names on the wrapper
        name, kind, labels = value._name, value._type, set(value._labelnames)
        suffixes = {
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
            "gauge": [""],
        }[str(kind)]
        for suffix in suffixes:
            series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


def promql_names(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """(metric -> labels in its selector, labels in by/without/on/ignoring clauses)."""
    expr = re.sub(r"\$__\w+|\$\w+", "x", expr)
    metrics: dict[str, set[str]] = {}
    for name, selector in re.findall(r"([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?", expr):
        if selector:
            labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
            metrics.setdefault(name, set()).update(labels)
    grouping: set[str] = set()
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        grouping.update(w.strip() for w in clause.split(",") if w.strip())
    bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^]]*\]', " ", expr)
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    for name in re.findall(r"(?<![\w.:])[a-zA-Z_:][\w:]*(?!\w|\s*\()", bare):
        if name.lower() not in _WORDS and not re.fullmatch(r"e\d*|x", name):
            metrics.setdefault(name, set())
    return metrics, grouping


def _check(expr: str, known: dict[str, set[str]], where: str) -> None:
    metrics, grouping = promql_names(expr)
    assert metrics, f"{where}: no metric found in {expr!r}"
    allowed: set[str] = set(TARGET_LABELS)
    for name, labels in metrics.items():
        assert name in known, f"{where}: {name} is not exported by the processor ({expr!r})"
        assert labels <= known[name] | TARGET_LABELS, f"{where}: {name}{{{labels}}}"
        allowed |= known[name]
    assert grouping <= allowed, f"{where}: grouping by {grouping - allowed} in {expr!r}"


def _dashboard_exprs() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    out = [
        (f"panel {p['title']!r}", t["expr"]) for p in doc["panels"] for t in p.get("targets") or []
    ]
    out += [
        (f"variable {v['name']}", re.sub(r"^label_values\((\w+),.*", r"\1", v["query"]))
        for v in doc["templating"]["list"]
        if v["type"] == "query"
    ]
    return out


def test_the_metric_parser_sees_names_and_labels() -> None:
    metrics, grouping = promql_names(
        'sum by (job, rule) (rate(processor_dlq_records_total{job=~"$job"}[5m])) '
        '- ignoring (le) processor_restore_seconds_bucket{le="30.0"} > 0 and up == 1'
    )
    assert metrics == {
        "processor_dlq_records_total": {"job"},
        "processor_restore_seconds_bucket": {"le"},
        "up": set(),
    }
    assert grouping == {"job", "rule", "le"}


def test_every_dashboard_query_uses_exported_metrics() -> None:
    known = exported()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 15
    used = set()
    for where, expr in exprs:
        _check(expr, known, where)
        used |= set(promql_names(expr)[0])
    # every family of the processor is on the dashboard somewhere
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in known}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, f"not on the dashboard: {sorted(families - shown)}"


def test_a_renamed_metric_is_caught() -> None:
    with pytest.raises(AssertionError, match="processor_events_applied_total"):
        _check('sum(rate(processor_events_applied_total{job=~"$job"}[5m]))', exported(), "x")
    with pytest.raises(AssertionError, match="session"):
        _check('sum(processor_sessions_quarantined{session="s"})', exported(), "x")


def test_every_rule_uses_exported_metrics_or_earlier_recording_rules() -> None:
    known = {**exported(), **FOREIGN}
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            where = rule.get("record") or rule["alert"]
            _check(rule["expr"], known, where)
            if "record" in rule:
                metrics = promql_names(rule["expr"])[0]
                labels = set().union(*(known[m] for m in metrics)) | TARGET_LABELS
                match = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", rule["expr"])
                kept = {w.strip() for w in match.group(1).split(",")} if match else labels
                known[rule["record"]] = kept


def test_committed_dashboard_is_what_the_code_generates() -> None:
    pytest.importorskip("grafana_foundation_sdk")
    import importlib.util

    spec = importlib.util.spec_from_file_location("processor_dashboard", GRAFANA / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == DASHBOARD.read_text(), (
        "regenerate: python deploy/grafana/dashboard.py > deploy/grafana/processor-dashboard.json"
    )


def test_dashboard_is_importable_json(tmp_path: Path) -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "processor-overview" and doc["title"] == "Processor"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        p.get("datasource", {}).get("uid", "${datasource}") == "${datasource}"
        for p in doc["panels"]
    )
