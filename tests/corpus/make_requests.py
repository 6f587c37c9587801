"""Writes tests/corpus/requests/*.json: request-building cases (the agent side).

Each case is one request: the log before it, the step's inputs (see
:mod:`tests.corpus.runtime_requests`) and the events the runtime appends
(``runtime``, from that independent model).  Where the runtime appends a
header its own loader refuses, ``ours`` holds the loadable events we write
instead and ``why`` says why (docs/runtime-load-checks.md, "Request
building").  Run by ``tests/agent/test_request_corpus.py``; regenerate with
``python -m tests.corpus.make_corpus``.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import orjson

from tests.corpus.runtime_requests import runtime_events

OUT = Path(__file__).parent / "requests"

CFG = {"provider": "mock", "model": "mock-1"}
CFG_MAX = {**CFG, "maxTokens": 4096}
TOOL_A = {"name": "a", "description": "the a tool", "parameters": {"type": "object"}}
TOOL_B = {"name": "b", "description": "the b tool", "parameters": {"type": "object"}}
TOOL_A2 = {"name": "a", "description": "another a", "parameters": {"type": "object"}}


def _prefix(
    header: dict[str, Any] | None = None, context: dict[str, Any] | None = None
) -> list[Any]:
    """system node, turn 1 step 1, a user message, then an optional header and context."""
    events: list[dict[str, Any]] = [
        {"type": "turn/start", "data": {"turn": 1}},
        {"type": "step/start", "data": {"turn": 1, "step": 1}},
        {
            "type": "system/message",
            "data": {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "sys",
                    "role": "system",
                    "content": [{"type": "text", "text": "You are careful."}],
                    "source": {"kind": "system-prompt"},
                },
            },
            "surfaceOp": "append",
        },
        {
            "type": "user/message",
            "data": {
                "id": "u1",
                "role": "user",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "user"},
            },
            "surfaceOp": "append",
        },
    ]
    if header is not None:
        events.append({"type": "request/header", "data": {"header": header, "reason": "initial"}})
    if context is not None:
        events.append({"type": "request/context", "data": context})
    return [{**e, "seq": i, "time": 1_700_000_000_000 + i} for i, e in enumerate(events)]


def _case(log: list[Any], route: dict[str, Any], tools: list[Any], **step: Any) -> dict[str, Any]:
    return {"log": log, "route": route, "tools": tools, "turn": 1, "step": 1, **step}


CTX = {"provider": "mock", "model": "mock-1", "contextWindow": 200000}

#: name -> (input, ours-or-None, why)
CASES: dict[str, tuple[dict[str, Any], list[Any] | None, str]] = {
    "H2-initial-starts-series-false-tools-empty": (
        _case(_prefix(), {"config": CFG}, [], startsSeries=False),
        None,
        "",
    ),
    "H2-initial-starts-series-true-tools-empty": (
        _case(_prefix(), {"config": CFG}, [], startsSeries=True),
        None,
        "",
    ),
    "H2-initial-adapter-defaults-tools-empty-starts-series-false": (
        _case(
            _prefix(),
            {"config": CFG_MAX, "adapterDefaults": {"maxTokens": True}},
            [],
            startsSeries=False,
        ),
        None,
        "",
    ),
    "H2-initial-adapter-defaults-all-false": (
        _case(_prefix(), {"config": CFG_MAX, "adapterDefaults": {"maxTokens": False}}, [TOOL_A]),
        None,
        "",
    ),
    "H4-initial-consolidate": (
        _case(_prefix(), {"config": CFG, "systemPromptUpdate": "consolidate"}, [TOOL_A]),
        None,
        "",
    ),
    "H4-resume-consolidate": (
        _case(
            _prefix({"config": CFG}, {**CTX, "systemPromptUpdate": "in-history"}),
            {"config": CFG, "contextWindow": 200000, "systemPromptUpdate": "consolidate"},
            [],
        ),
        None,
        "",
    ),
    "H4-resume-undeclared-mode": (
        _case(
            _prefix({"config": CFG}, {**CTX, "systemPromptUpdate": "in-history"}),
            {"config": CFG, "contextWindow": 200000},
            [],
            startsSeries=False,
        ),
        None,
        "",
    ),
    "H2-change-tools-to-empty": (
        _case(
            _prefix({"config": CFG, "tools": [TOOL_A]}, CTX),
            {"config": CFG, "contextWindow": 200000},
            [],
            headerLogged=True,
            startsSeries=False,
        ),
        None,
        "",
    ),
    "H2-series-unchanged-header": (
        _case(
            _prefix({"config": CFG, "tools": [TOOL_A]}, CTX),
            {"config": CFG, "contextWindow": 200000},
            [TOOL_A],
            headerLogged=True,
            startsSeries=True,
        ),
        None,
        "",
    ),
    "H2-resume-adds-a-tool": (
        _case(
            _prefix({"config": CFG, "tools": [TOOL_A]}, CTX),
            {"config": CFG, "contextWindow": 200000},
            [TOOL_A, TOOL_B],
            startsSeries=False,
        ),
        None,
        "",
    ),
    "Y2-initial-duplicate-tool-names": (
        _case(_prefix(), {"config": CFG}, [TOOL_A, TOOL_A2]),
        None,
        "",
    ),
    "H2-adapter-default-without-its-config-field": (
        _case(_prefix(), {"config": CFG, "adapterDefaults": {"maxTokens": True}}, []),
        [
            {"type": "request/header", "data": {"header": {"config": CFG}, "reason": "initial"}},
            {"type": "request/context", "data": {"provider": "mock", "model": "mock-1"}},
        ],
        "the runtime writes adapterDefaults.maxTokens without config.maxTokens, which its "
        "loader refuses (assertAdapterDefaults); we leave the marker out",
    ),
    "H2-adapter-defaults-with-a-false-marker": (
        _case(
            _prefix(),
            {"config": CFG_MAX, "adapterDefaults": {"maxTokens": True, "reasoningEffort": False}},
            [],
        ),
        [
            {
                "type": "request/header",
                "data": {
                    "header": {"config": CFG_MAX, "adapterDefaults": {"maxTokens": True}},
                    "reason": "initial",
                },
            },
            {"type": "request/context", "data": {"provider": "mock", "model": "mock-1"}},
        ],
        "canonicalHeader keeps adapterDefaults as given, so the runtime writes the false "
        "reasoningEffort marker its loader refuses (assertAdapterDefaults); we keep the true one",
    ),
}


def write_requests() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    for name, (case, ours, why) in CASES.items():
        body: dict[str, Any] = {"input": case, "runtime": runtime_events(copy.deepcopy(case))}
        if ours is not None:
            body["ours"] = ours
            body["why"] = why
        (OUT / f"{name}.json").write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    return len(CASES)
