"""The acceptance experiment of the design (docs/session-semantics.md F-3).

Scripted multi-turn sessions run through the step loop and the mock adapter,
which records every request it received.  For each request, the log prefix up
to that request is folded from scratch and must give exactly the request's
messages, tool history and header: no model-facing content exists that is
not in the log.  The logs must also be valid input for ``processor fold``.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.agent.adapters.mock import Fail, MaxTokens, Overflow, Say, ToolCall
from processor.agent.context import message_text
from processor.agent.request import Request
from processor.agent.tool_history import tool_history
from processor.cli.main import cli
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import KNOWN_TYPES, Event
from processor.core.frozen import thaw
from processor.core.header import canonical_header
from processor.core.session import Session
from processor.examples.make_example import (
    EXAMPLE_PATH,
    ScriptedRun,
    TurnScript,
    example_session,
    random_script,
    run_script,
    session_header,
)
from processor.files import read_session_file, write_session_file
from tests.corpus.runtime_checker import check_log

# ---------------------------------------------------------------- the check


def rebuild(events: list[Event], as_of_seq: int) -> dict[str, Any]:
    """Fold the prefix through ``as_of_seq`` from scratch (independent of the loop)."""
    prefix = events[: as_of_seq + 1]
    assert [e.seq for e in prefix] == list(range(as_of_seq + 1))
    folded = Session.fold(
        prefix, message_projections=default_message_projections(), projections=default_registry()
    )
    header = next(e for e in reversed(prefix) if e.type == "request/header")
    return {
        "messages": thaw(folded.derive_messages()),
        # the runtime's tool-history fold of the prefix (what its provider replays)
        "tool_history": thaw(tool_history(prefix)),
        "header": thaw(canonical_header(header.data["header"])),
    }


def assert_requests_rebuild_from_log(run: ScriptedRun) -> None:
    events = run.events
    requests: list[Request] = run.adapter.requests
    assert requests, "the script made no request"
    for n, request in enumerate(requests):
        expected = rebuild(events, request.as_of_seq)
        assert thaw(request.messages) == expected["messages"], f"request {n}: messages"
        assert thaw(request.tool_history) == expected["tool_history"], f"request {n}: tools"
        assert thaw(request.header) == expected["header"], f"request {n}: header"
        # the request was dispatched right after it was built: the next event is its outcome
        outcome = events[request.as_of_seq + 1]
        assert outcome.type in ("assistant/attempt", "assistant/message")
        assert (outcome.data["turn"], outcome.data["step"]) == (request.turn, request.step)
        assert isinstance(outcome.data["stream"], list)


def assert_runtime_loads(events: list[Event]) -> None:
    """The runtime's own load checks (an independent checker, not our fold) accept the log."""
    assert check_log([e.to_json() for e in events], 4) is None


def fold_exit_code(tmp: Path, run: ScriptedRun, name: str = "session.jsonl") -> int:
    assert_runtime_loads(run.events)
    path = tmp / name
    write_session_file(path, run.session.header, run.events)
    result = CliRunner().invoke(cli, ["fold", str(path), "--compact"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert doc["asOfSeq"] == run.events[-1].seq
    assert doc["messages"] == thaw(run.session.derive_messages())
    return result.exit_code


# ---------------------------------------------------------------- the scripted session

SCRIPT = [
    # tools offered from the start; a tool call round trip
    TurnScript(
        inputs=("Find where the config is loaded.",),
        add_tools=("read", "grep"),
        context="cwd: /work",
        items=(
            Say("Searching.", [ToolCall("grep", {"pattern": "load_config"})]),
            Say("It is in config.py."),
        ),
    ),
    # a tool is added; the prompt changes on a capable route (appended in history)
    TurnScript(
        inputs=("Open it.",),
        add_tools=("edit",),
        prompt="You are a careful coding agent. Be brief.",
        items=(Say("", [ToolCall("read", {"path": "config.py"})]), Say("Opened.")),
    ),
    # a retry after a failed attempt, with a route switch between the attempts
    TurnScript(
        inputs=("Now explain it.",),
        context="cwd: /work/src",
        items=(Fail(), Say("It parses TOML.", route="other")),
    ),
    # the prompt changes on an incapable route (consolidated into the head)
    TurnScript(
        inputs=("Shorter.",), prompt="You are terse.", items=(Say("TOML.", route="incapable"),)
    ),
    # a tool is removed; the runtime context is cleared
    TurnScript(
        inputs=("Edit it.",),
        remove_tools=("grep",),
        context="",
        items=(Say("", [ToolCall("edit", {"path": "config.py"})]), Say("Edited.")),
    ),
    # the context window overflows: the compaction plugin replaces a range, then retries
    TurnScript(
        inputs=("Summarise everything.",),
        items=(Overflow(), Say("Summary: config loading was fixed.")),
    ),
    TurnScript(inputs=("One more thing?",), items=(MaxTokens("Well, "),)),
]


def test_acceptance_scripted_session_rebuilds_every_request(tmp_path: Path) -> None:
    run = run_script(SCRIPT, "acceptance")
    events = run.events
    kinds = Counter(e.type for e in events)
    # the script really exercised what it claims to
    assert kinds["tool/call"] == 3 and kinds["tool/result"] == 3
    devs = [
        b["type"]
        for e in events
        if e.type == "developer/message"
        for b in e.data["message"]["content"]
    ]
    assert "tool-addition" in devs and "tool-removal" in devs
    # one policy retry (llm/retry); the overflow is answered by the compaction
    assert kinds["assistant/attempt"] == 2 and kinds["llm/retry"] == 1
    assert kinds["compaction/start"] == kinds["compaction/end"] == 1
    compactions = [
        e
        for e in events
        if e.type == "user/message" and e.data["source"]["kind"] == "compact-checkpoint"
    ]
    assert len(compactions) == 1 and isinstance(compactions[0].surface_op, dict)
    system_ops = [e.surface_op for e in events if e.type == "system/message"]
    assert "append" in system_ops[1:] and any(isinstance(op, dict) for op in system_ops)
    contexts = [
        message_text(e.data)
        for e in events
        if e.type == "user/message" and e.data["source"]["kind"] == "runtime-context"
    ]
    # sent, changed, CLEARED; the compaction shadows CLEARED, so it is sent again
    assert len(contexts) == 4 and contexts[-1].startswith("Current runtime context: none.")
    providers = {r.header["config"]["model"] for r in run.adapter.requests}
    assert providers == {"mock-1", "mock-2"}
    assert {r.context.get("systemPromptUpdate") for r in run.adapter.requests} == {
        "in-history",
        "consolidate",
    }

    assert_requests_rebuild_from_log(run)
    assert fold_exit_code(tmp_path, run) == 0


def test_acceptance_resumed_loop_rebuilds_every_request(tmp_path: Path) -> None:
    run = run_script(SCRIPT[:3], "resumed")
    run.resume()
    for turn in SCRIPT[3:]:
        run.play(turn)
    reasons = [e.data["reason"] for e in run.events if e.type == "request/header"]
    assert "resume" in reasons
    assert_requests_rebuild_from_log(run)
    assert fold_exit_code(tmp_path, run, "resumed.jsonl.zst") == 0


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rng=st.randoms(use_true_random=False), turns=st.integers(1, 6))
def test_acceptance_property_generated_scripts(
    rng: random.Random, turns: int, tmp_path: Path
) -> None:
    run = run_script(random_script(rng, turns), "generated")
    assert_requests_rebuild_from_log(run)
    assert fold_exit_code(tmp_path, run) == 0


def test_fold_via_subprocess(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = run_script(SCRIPT, "subprocess")
    path = tmp_path / "session.jsonl"
    write_session_file(path, session_header("subprocess"), run.events)
    proc = subprocess.run(
        [sys.executable, "-m", "processor", "fold", str(path), "--compact"],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert orjson.loads(proc.stdout)["asOfSeq"] == run.events[-1].seq


# ---------------------------------------------------------------- the example file


#: What the example holds: every type the step loop writes, the fork cut and the
#: image offload (the runtime's vocabulary has ~60 types; the rest belong to plugins
#: the reference loop does not model and are covered by the core's corpus).
EXAMPLE_TYPES = frozenset(
    {
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "system/message",
        "developer/message",
        "user/message",
        "assistant/message",
        "assistant/attempt",
        "tool/call",
        "tool/result",
        "request/header",
        "request/context",
        "llm/retry",
        "llm/retry-started",
        "agent/inbox/spliced",
        "session/end-seed",
        "image/offload",
        "compaction/start",
        "compaction/summary",
        "compaction/end",
    }
)


def test_example_file_is_regenerated_from_the_script() -> None:
    header, events = example_session()
    stored = read_session_file(EXAMPLE_PATH)
    assert stored.header == header
    assert [e.to_json() for e in stored.events] == [e.to_json() for e in events]


def test_example_file_has_every_event_type_and_folds(tmp_path: Path) -> None:
    stored = read_session_file(EXAMPLE_PATH)
    assert stored.header["version"] == 4
    assert_runtime_loads(stored.events)
    kinds = {e.type for e in stored.events}
    assert kinds >= EXAMPLE_TYPES
    unknown = [e for e in stored.events if e.type not in KNOWN_TYPES]
    assert len(unknown) == 1 and unknown[0].ignorable is True
    result = CliRunner().invoke(cli, ["fold", str(EXAMPLE_PATH), "--compact"])
    assert result.exit_code == 0, result.output
