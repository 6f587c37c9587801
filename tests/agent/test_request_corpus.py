"""The request-building corpus (tests/corpus/requests): our builder writes what the
runtime's buildRequest writes (issue 36 items 1-3).

Each case gives the log before one request and the step's inputs; ``runtime`` is
what the runtime appends (tests/corpus/runtime_requests.py, written from its
agent loop), ``ours`` (when present) the loadable events we write instead where
the runtime's own loader would refuse its event.  Building never raises for a
case, and the log it leaves folds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.agent.adapters import PreparedRoute
from processor.agent.adapters.mock import MockModelAdapter
from processor.agent.context import EventDraft
from processor.agent.request import RequestState, build_request
from processor.core.defaults import fold_session
from processor.core.events import Event, parse_event
from tests.agent.test_context import commit as commit_draft
from tests.corpus.runtime_requests import runtime_events

CASES = sorted((Path(__file__).parents[1] / "corpus" / "requests").glob("*.json"))


def _without_ids(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(events)
    for e in out:
        if e["type"] == "developer/message":
            e["data"]["message"].pop("id", None)
    return out


def build(case: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Event]]:
    """Run our build_request on a corpus case; returns the appended events and the log."""
    session = fold_session([parse_event(e) for e in case["log"]])
    state = RequestState.from_session(session)
    state.logged = case.get("headerLogged", False)
    if case.get("surfaceRewritten", False):
        state.generation -= 1
    route = case["route"]
    prepared = PreparedRoute(
        adapter=MockModelAdapter(),
        config=route["config"],
        adapter_defaults=route.get("adapterDefaults", {}),
        context_window=route.get("contextWindow"),
        system_prompt_update=route.get("systemPromptUpdate"),
    )
    appended: list[Event] = []

    def commit(draft: EventDraft) -> Event:
        event = commit_draft(session, draft)
        appended.append(event)
        return event

    build_request(
        session,
        state,
        prepared,
        case["tools"],
        commit=commit,
        new_id=lambda kind: f"{kind}-1",
        starts_series=case.get("startsSeries") is True,
        turn=case["turn"],
        step=case["step"],
        attempt=1,
        stream="s",
    )
    written = [
        {"type": e.type, "data": orjson.loads(orjson.dumps(e.to_json()["data"]))} for e in appended
    ]
    return written, list(session.log)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_H2_request_corpus_case(path: Path) -> None:
    """Items 1-3: each accepted input maps to the events the runtime writes."""
    body = orjson.loads(path.read_bytes())
    assert body["runtime"] == runtime_events(copy.deepcopy(body["input"])), "regenerate the corpus"
    written, log = build(body["input"])
    assert _without_ids(written) == _without_ids(body.get("ours", body["runtime"]))
    fold_session(log)  # the log we leave loads


def test_H2_request_corpus_is_there() -> None:
    assert len(CASES) >= 10
