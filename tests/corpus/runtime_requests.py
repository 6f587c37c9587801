"""An independent model of the runtime's request building (tests only).

Written from the runtime's ``ReactLoopAgent.buildRequest``
(``packages/core/agent-loop/src/agent.ts``) and ``canonicalHeader`` /
``headerEquals`` (``packages/core/session/src/request-header.ts``), without
importing :mod:`processor`: it says which events the runtime appends for one
request, given the log before it and the step's inputs.  The request-building
corpus (``tests/corpus/requests``) is generated from it and our
``build_request`` is held to it by ``tests/agent/test_request_corpus.py``.

Inputs of :func:`runtime_events` (the keys of a corpus case's ``input``):

* ``log``: the events before the request (raw envelopes);
* ``headerLogged``: this loop already wrote its initial/resume header;
* ``surfaceRewritten``: the surface changed since the loop's previous request;
* ``route``: ``{config, adapterDefaults?, contextWindow?, systemPromptUpdate?}``
  (the prepared call);
* ``tools``: the step's assembled tool schemas (may be ``[]``);
* ``startsSeries``: the step's request for a new series (``true``, ``false``
  or absent: only ``true`` counts, ``decision.startsRequestSeries === true``).
"""

from __future__ import annotations

import json
from typing import Any

KNOWN_MARKERS = ("reasoningEffort", "maxTokens")


def canonical(header: dict[str, Any]) -> dict[str, Any]:
    """``canonicalHeader``: adapterDefaults as given when a known marker is true."""
    out: dict[str, Any] = {"config": header["config"]}
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, dict) and any(defaults.get(k) is True for k in KNOWN_MARKERS):
        out["adapterDefaults"] = defaults
    if header.get("tools"):
        out["tools"] = header["tools"]
    return out


def _config_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")
    if any(a.get(k, "\0absent") != b.get(k, "\0absent") for k in keys):
        return False
    return a.get("stop") == b.get("stop")


def header_equals(a: dict[str, Any], b: dict[str, Any]) -> bool:
    da, db = a.get("adapterDefaults") or {}, b.get("adapterDefaults") or {}
    if not _config_equal(a["config"], b["config"]) or any(
        da.get(k) != db.get(k) for k in KNOWN_MARKERS
    ):
        return False
    ta, tb = a.get("tools") or [], b.get("tools") or []
    return len(ta) == len(tb) and all(
        json.dumps(x, separators=(",", ":")) == json.dumps(y, separators=(",", ":"))
        for x, y in zip(ta, tb, strict=True)
    )


def runtime_events(case: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{type, data}]`` the runtime appends for this request (developer message ids
    left out: the runtime mints them)."""
    log, route, tools = case["log"], case["route"], case["tools"]
    header: dict[str, Any] = {"config": route["config"]}
    if "adapterDefaults" in route:
        header["adapterDefaults"] = route["adapterDefaults"]
    if tools:
        header["tools"] = tools
    header = canonical(header)
    headers = [e for e in log if e["type"] == "request/header"]
    baseline = canonical(headers[-1]["data"]["header"]) if headers else None
    starts = case.get("startsSeries") is True or case.get("surfaceRewritten", False)
    out: list[dict[str, Any]] = []
    logged_header = False
    if not case.get("headerLogged", False):
        data: dict[str, Any] = {
            "header": header,
            "reason": "initial" if baseline is None else "resume",
        }
        if starts:
            data["startsSeries"] = True
        out.append({"type": "request/header", "data": data})
        logged_header = True
    elif baseline is None or not header_equals(baseline, header):
        data = {"header": header, "reason": "change"}
        if starts:
            data["startsSeries"] = True
        out.append({"type": "request/header", "data": data})
        logged_header = True
    elif starts:
        out.append({"type": "request/header", "data": {"header": header, "reason": "series"}})
    if baseline is not None and logged_header:
        before = {t["name"] for t in baseline.get("tools") or []}
        now = {t["name"] for t in tools}
        blocks = [{"type": "tool-addition", "toolName": t["name"]} for t in tools]
        blocks = [b for b in blocks if b["toolName"] not in before]
        added = bool(blocks)
        blocks += [
            {"type": "tool-removal", "toolName": t["name"]}
            for t in baseline.get("tools") or []
            if t["name"] not in now
        ]
        if blocks:
            dev: dict[str, Any] = {
                "turn": case["turn"],
                "step": case["step"],
                "message": {
                    "role": "developer",
                    "content": blocks,
                    "source": {"kind": "tool-registry"},
                },
            }
            if added:
                dev["headerSeq"] = len(log)
            out.append({"type": "developer/message", "data": dev})
    context: dict[str, Any] = {"provider": route["config"]["provider"]}
    context["model"] = route["config"]["model"]
    for key in ("contextWindow", "systemPromptUpdate"):
        if key in route:
            context[key] = route[key]
    previous = next((e["data"] for e in reversed(log) if e["type"] == "request/context"), None)
    keys = ("provider", "model", "contextWindow", "systemPromptUpdate")
    if previous is None or any(
        previous.get(k, "\0absent") != context.get(k, "\0absent") for k in keys
    ):
        out.append({"type": "request/context", "data": context})
    return out
