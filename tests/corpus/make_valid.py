"""Writes tests/corpus/valid (logs that must fold) and tests/corpus/formats
(format versions the reader refuses).  Run through ``python -m tests.corpus.make_corpus``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson

from processor.core.builder import LogBuilder, text, tool_def

Raw = dict[str, Any]


def raws(b: LogBuilder) -> list[Raw]:
    return [e.to_json() for e in b.events]


VALID = Path(__file__).parent / "valid"


def number_forms_session() -> list[Raw]:
    """Issue 36: what the runtime's load path accepts and we used to refuse.

    Integral float seqs (JSON ``1.0``) in a replace, its sources and an
    image/offload target; a request/header whose tools are not a list; a goal
    created, run one round, then a goal/change breaking its rules (the goal
    view keeps the last valid goal, the session loads).
    """
    b = LogBuilder()
    b.system("s")
    img = {"type": "image", "data": "AA"}
    b.add_raw("user/message", b.message("user", [img, text("look")]), surfaceOp="append")
    b.add_raw("image/offload", {"targets": [{"seq": 1, "imageIndexes": [0]}]})
    b.summary("summary", 1, 1, [1])
    b.add_raw(
        "request/header",
        {
            "header": {"config": {"provider": "mock", "model": "m"}, "tools": "x"},
            "reason": "initial",
        },
    )
    goal = {"id": "g1", "revision": 1, "objective": "ship", "phase": "active", "maxGoalRounds": 2}
    change = {
        "kind": "goal/change",
        "version": 1,
        "operation": "create",
        "goal": goal,
        "roundsStarted": 0,
        "createdAt": 5,
        "updatedAt": 5,
    }
    b.add_raw("goal/change", change)
    b.user("round 1", source={"kind": "goal", "goalId": "g1", "revision": 1, "round": 1})
    b.add_raw("goal/change", {**change, "operation": "edit", "createdAt": 6})  # GL-4: breaks
    out = [orjson.loads(orjson.dumps(e)) for e in raws(b)]  # thawed: the floats go in
    out[2]["data"]["targets"][0]["seq"] = 1.0
    out[2]["data"]["targets"][0]["imageIndexes"] = [0.0]
    out[3]["surfaceOp"] = {"op": "replace", "startSeq": 1.0, "endSeq": 1.0}
    out[3]["sourceEventSeqs"] = [1.0]
    return out


#: A payload for every log-only type of the runtime's vocabulary: the plugin's
#: own shape where we know it, otherwise a small object (log-only data is
#: opaque to the runtime's load path).
LOG_ONLY_SAMPLES: dict[str, Any] = {
    "agent-preset/selected": {"preset": "coder"},
    "agent/inbox/spliced": {
        "target": "next-turn",
        "start": 0,
        "inserted": [
            {"id": "inbox-1", "role": "user", "content": [text("ping")], "source": {"kind": "user"}}
        ],
    },
    "approval/asked": {"id": "ap-1", "toolName": "edit", "callId": "c1", "reason": "writes a file"},
    "approval/decided": {"id": "ap-1", "outcome": "allowed-once"},
    "approval/policy": {"policy": "on-request"},
    "command/run": {"name": "plan", "commandId": "cmd-1", "args": ""},
    "command/done": {"commandId": "cmd-1", "kind": "success"},
    "compaction/prune": {"removedSeqs": [3]},
    "deliverables/presented": {"paths": ["/work/out.md"]},
    "feedback/message-delete": {"messageId": "asst-1"},
    "feedback/message-put": {"messageId": "asst-1", "rating": "up"},
    "feedback/record": {"rating": "up"},
    "goal/change": {  # the runtime goal service's create (the goal unit folds it)
        "kind": "goal/change",
        "version": 1,
        "operation": "create",
        "goal": {
            "id": "g1",
            "revision": 1,
            "objective": "ship it",
            "phase": "active",
            "maxGoalRounds": 8,
        },
        "roundsStarted": 0,
        "createdAt": 1700000000000,
        "updatedAt": 1700000000000,
    },
    "hook/invoked": {"turn": 1, "point": "pre-tool", "dialect": "claude-code", "handlerId": "h1"},
    "hook/result": {
        "turn": 1,
        "point": "pre-tool",
        "handlerId": "h1",
        "decision": "allow",
        "durationMs": 3,
    },
    "llm/retry": {"turn": 1, "step": 1, "attempt": 1, "delayMs": 10},
    "llm/retry-started": {"turn": 1, "step": 1},
    "model/selection": {"provider": "mock", "model": "mock-2"},
    "permission/preset": {"preset": "default"},
    "plan/mode": {"active": True},
    "request/context": {
        "provider": "mock",
        "model": "mock-1",
        "contextWindow": 200000,
        "systemPromptUpdate": "in-history",
    },
    "sandbox/mode": {"mode": "workspace-write"},
    "schedule/change": {"operation": "create", "id": "cron-1"},
    "session-log-deepseek/delivery-accepted": {"deliveryId": "d1"},
    "session/title": {
        "title": "Fix the config loader",
        "messageSeqs": [3],
        "source": {"kind": "fallback"},
    },
    "session/title-llm-request": {"provider": "mock", "model": "mock-1"},
    "slots/dispatch": {"slot": "plan"},
    "subagent/catalog": {"agents": []},
    "subagent/descriptor": {"name": "helper", "depth": 1},
    "subagent/model-selection-policy": {"policy": "inherit"},
    "team/member": {"id": "m1", "name": "reviewer"},
    "team/message/delivered": {"id": "tm1"},
    "team/message/queued": {"id": "tm1", "to": "m1"},
    "team/task": {"id": "t1", "status": "open"},
    "todo/write": {
        "todos": [
            {"content": "read the loader", "status": "completed"},
            {"content": "fix the bug", "status": "in_progress"},
        ]
    },
    "tool-workflow/agent-end": {"runId": "r1", "seq": 0, "outcome": "completed"},
    "tool-workflow/agent-start": {"runId": "r1", "seq": 0, "label": "a", "childId": "k1"},
    "tool-workflow/run-end": {"runId": "r1", "stopReason": "done"},
    "tool-workflow/run-start": {"runId": "r1", "name": "wf"},
    "tool/ptc-dispatch": {"callId": "c1"},
    "tool/ptc-dispatch-start": {"callId": "c1"},
    "web/deepseek-search-llm-request": {"query": "python zstd"},
    "workspace/changes": {"files": ["/work/config.py"]},
}


def every_type_session(form: int) -> list[Raw]:
    """A session holding every type of the runtime's vocabulary at least once."""
    b = LogBuilder(form=form)
    b.system("You are a careful agent.")  # 0
    b.turn_start()
    b.step_start()
    h = b.header([tool_def("read"), tool_def("edit")])
    b.add_raw("request/context", LOG_ONLY_SAMPLES["request/context"])
    b.tool_update(h.seq, added=["read", "edit"])
    b.user("fix the config loader")
    b.add_raw(
        "user/message",
        b.message(
            "user",
            [text("see"), {"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="}],
        ),
        surfaceOp="append",
    )
    img_user = b.events[-1].seq
    b.attempt()
    b.add_raw("llm/retry", LOG_ONLY_SAMPLES["llm/retry"])
    b.add_raw("llm/retry-started", LOG_ONLY_SAMPLES["llm/retry-started"])
    b.assistant(
        "reading",
        tool_calls=[{"id": "c1", "name": "read", "arguments": "{}"}],
        usage={"inputTokens": 10, "outputTokens": 2},
    )
    call = b.tool_call("c1", "read", '{"path": "config.py"}')
    res = b.tool_result("c1", "x = 1", call_seq=call.seq)
    raw = res.to_json()
    b.events.pop()
    b.next_seq -= 1
    data = copy.deepcopy(raw["data"])
    shot = {"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="}
    if form == 3:
        data["message"]["content"][0]["content"].append(shot)
    else:
        data["message"]["content"].append(shot)
    b.add({**raw, "data": data})
    img_tool = b.events[-1].seq
    bad_call = b.tool_call("c2", "edit", "{}")
    b.tool_result("c2", "denied", call_seq=bad_call.seq, error={"name": "edit", "code": "E"})
    b.tool_result("", "[elided]", like=b.events[-1], replace=(b.next_seq - 1, b.next_seq - 1))
    for etype in (
        "approval/asked",
        "approval/decided",
        "todo/write",
        "session/title",
        "command/run",
        "command/done",
        "plan/mode",
    ):
        b.add_raw(etype, LOG_ONLY_SAMPLES[etype])
    b.add_raw(
        "image/offload",
        {
            "targets": [
                {"seq": img_user, "imageIndexes": [0]},
                {"seq": img_tool, "imageIndexes": [0]},
            ]
        },
    )
    b.step_end()
    b.turn_end()
    b.turn_start()
    b.step_start()
    b.add_raw("compaction/start", {"trigger": "manual"})
    nodes_before = [e.seq for e in b.events if e.surface_op == "append"]
    start, end = nodes_before[1], nodes_before[4]
    b.summary("summary of the first turn", start, end, nodes_before[1:5])
    b.add_raw("compaction/summary", {"tokensBefore": 900, "tokensAfter": 120})
    b.add_raw("compaction/prune", LOG_ONLY_SAMPLES["compaction/prune"])
    b.add_raw("compaction/end", {"ok": True})
    b.system("You are a careful agent. Be brief.", replace=(0, 0), sources=[0])
    b.header([tool_def("read")], reason="change", starts_series=True)
    b.tool_update(None, removed=["edit"])
    done = {e.type for e in b.events}
    for etype, payload in LOG_ONLY_SAMPLES.items():
        if etype not in done:
            b.add_raw(etype, payload)
    b.add_raw("vendor/telemetry", {"n": 1}, ignorable=True)
    b.assistant("done", usage={"inputTokens": 5, "outputTokens": 1})
    b.step_end()
    b.turn_end()
    b.add_raw("session/end-seed", {})
    return raws(b)


FORMATS = Path(__file__).parent / "formats"


def write_formats() -> int:
    """tests/corpus/formats/vN/<runtime name>: every format version the reader refuses.

    Versions 0-2 predate what we read (the runtime migrates them; we name the
    version); 5 is newer than the runtime.  Each has a header and the first
    events of a session in the old shape (a tool result without source).
    """
    import shutil

    from processor.files import log_filename

    if FORMATS.exists():
        shutil.rmtree(FORMATS)
    old_events = [
        {
            "type": "user/message",
            "seq": 0,
            "time": 1,
            "data": {"id": "u1", "role": "user", "content": [text("hi")]},
            "surfaceOp": "append",
        },
        {
            "type": "tool/result",
            "seq": 1,
            "time": 2,
            "data": {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "t1",
                    "role": "tool",
                    "content": [text("ok")],
                    "toolCallId": "c1",
                },
            },
            "surfaceOp": "append",
        },
    ]
    for version in (0, 1, 2, 5):
        folder = FORMATS / f"v{version}"
        folder.mkdir(parents=True)
        header = {
            "type": "session",
            "version": version,
            "id": f"format-v{version}",
            "createdAt": 1,
            "isSeeded": False,
            "delegationDepth": 0,
        }
        (folder / log_filename(version)).write_bytes(
            b"".join(orjson.dumps(x) + b"\n" for x in [header, *old_events])
        )
    return 4


def write_valid() -> int:
    """tests/corpus/valid/<case>/<runtime file name>: logs that must fold."""
    import shutil

    import zstandard

    from processor.files import log_filename

    if VALID.exists():
        shutil.rmtree(VALID)

    def write(
        case: str,
        version: int | None,
        events: list[Raw],
        *,
        compressed: bool = False,
        header_extra: dict[str, Any] | None = None,
    ) -> None:
        folder = VALID / case
        folder.mkdir(parents=True)
        lines: list[Any] = []
        if version is not None:
            lines.append(
                {
                    "type": "session",
                    "version": version,
                    "id": case,
                    "createdAt": 1_700_000_000_000,
                    "isSeeded": False,
                    "delegationDepth": 0,
                    "cwd": "/work/example",
                    **(header_extra or {}),
                }
            )
        body = b"".join(orjson.dumps(x) + b"\n" for x in [*lines, *events])
        name = log_filename(version if version is not None else 0, compressed)
        if compressed:
            body = zstandard.ZstdCompressor(level=3).compress(body)
        (folder / name).write_bytes(body)

    v4, v3 = every_type_session(4), every_type_session(3)
    write("every-type-v4", 4, v4)
    write("every-type-v3", 3, v3)
    write("every-type-v4-zstd", 4, v4, compressed=True)
    write("headerless", None, [*v4[:20]])
    mixed = LogBuilder(form=4)
    mixed.system("s")
    mixed.user("two tools")
    for form, cid in ((4, "c1"), (3, "c2")):  # without a header either form is read
        call = mixed.tool_call(cid, "read", "{}")
        mixed.tool_result(cid, f"result {cid}", call_seq=call.seq, form=form)
    mixed.add_raw("todo/write", {"todos": []})
    write("headerless-mixed-forms", None, raws(mixed))
    # issue 36 items 4, 5: the Session's load path checks no system/message role, and
    # an ignorable attempt is opaque
    loose = LogBuilder(form=3)
    loose.turn_start()
    loose.step_start()
    head = loose.message("system", [text("s")])
    loose.add_raw(
        "system/message",
        {"turn": 1, "step": 1, "message": {**head, "role": "user"}},
        surfaceOp="append",
    )
    loose.user("hi")
    loose.add_raw("assistant/attempt", {}, ignorable=True)
    loose.assistant("hello")
    loose.step_end()
    loose.turn_end()
    write("headerless-v3-system-role-and-ignorable-attempt", None, raws(loose))
    write("headerless-number-forms-tools-and-goal", None, number_forms_session())
    fork = every_type_session(4)
    cut = next(i for i, e in enumerate(fork) if e["type"] == "turn/start" and i > 2)
    seed = {
        "type": "session/end-seed",
        "seq": cut,
        "time": fork[cut - 1]["time"] + 1,
        "data": {"inherited": True},
    }
    kept = [
        e
        for e in fork[cut:]
        if e["type"]
        not in (
            "tool/result",
            "developer/message",
            "user/message",
            "system/message",
            "assistant/message",
            "image/offload",
        )
    ]
    tail = [{**e, "seq": cut + 1 + i} for i, e in enumerate(kept)]
    write(
        "forked-subagent",
        4,
        [*fork[:cut], seed, *tail],
        header_extra={
            "isSeeded": True,
            "parentSession": "every-type-v4",
            "origin": "subagent",
            "delegationDepth": 1,
            "agentPreset": "coder",
        },
    )
    return 7
