"""Writes tests/corpus/invalid/*.jsonl: one rule violation per file.

Each case is a valid prefix followed by one bad event (or a bad checkpoint
for the P cases).  ``<name>.expected`` holds the exact stderr line that
``processor fold`` must print.  Regenerate with

    python -m tests.corpus.make_corpus
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from processor.core.builder import LogBuilder, text, tool_def

OUT = Path(__file__).parent / "invalid"
Raw = dict[str, Any]
Case = Callable[[LogBuilder], list[Raw]]


#: Cases written as format v3 files (header version 3, v3 message shapes).
V3_CASES = frozenset(
    {
        "D6-tool-result-wrapper-two-blocks",
        "D6-v4-system-source-in-v3-file",
        "D6-v4-tool-result-in-v3-file",
        "D6-v3-system-message-user-role-in-v3-file",
    }
)


def prefix(form: int = 4) -> LogBuilder:
    b = LogBuilder(form=form)
    b.system("You are a careful agent.")  # 0
    b.turn_start()  # 1
    b.step_start()  # 2
    b.user("hello")  # 3
    call = b.tool_call("c1", "read", {"path": "a"})  # 4
    b.tool_result("c1", "contents", call_seq=call.seq)  # 5
    b.add_raw(
        "user/message",
        {
            "id": "img",
            "role": "user",
            "source": {"kind": "user"},
            "content": [text("pic"), {"type": "image", "data": "AA"}],
        },
        surfaceOp="append",
    )  # 6
    b.header([tool_def("grep")])  # 7
    return b


CFG = {"provider": "mock", "model": "mock-1"}


def raws(b: LogBuilder) -> list[Raw]:
    return [e.to_json() for e in b.events]


def env(b: LogBuilder, etype: str, data: Any, **extra: Any) -> Raw:
    return b.envelope(etype, data, **extra)


def msg(b: LogBuilder, role: str, content: list[Any] | None = None, **kw: Any) -> Raw:
    return b.message(role, content if content is not None else [text("x")], **kw)


def tool_res(b: LogBuilder) -> Raw:
    return copy.deepcopy(b.events[5].to_json()["data"])


CASES: dict[str, Callable[[LogBuilder], Raw | list[Raw]]] = {
    "E1-unknown-envelope-key": lambda b: {
        **env(b, "turn/end", {"turn": 1, "reason": "x"}),
        "extra": 1,
    },
    "E2-time-not-integer": lambda b: {**env(b, "turn/end", {"turn": 1}), "time": "now"},
    "E4-unknown-type": lambda b: env(b, "vendor/thing", {}),
    "E5-log-only-with-surface-op": lambda b: env(b, "turn/end", {"turn": 1}, surfaceOp="append"),
    "D1-user-type-developer-role": lambda b: env(
        b, "user/message", msg(b, "developer"), surfaceOp="append"
    ),
    "D2-tool-block-in-user-message": lambda b: env(
        b,
        "user/message",
        msg(b, "user", [{"type": "tool-removal", "toolName": "a"}]),
        surfaceOp="append",
    ),
    "D2-inline-tool-definition": lambda b: env(
        b,
        "developer/message",
        {
            "headerSeq": 7,
            "message": msg(
                b,
                "developer",
                [{"type": "tool-addition", "toolName": "grep", "tool": tool_def("grep")}],
            ),
        },
        surfaceOp="append",
    ),
    "D3-addition-without-header-seq": lambda b: env(
        b,
        "developer/message",
        {"message": msg(b, "developer", [{"type": "tool-addition", "toolName": "grep"}])},
        surfaceOp="append",
    ),
    "D3-header-seq-not-a-header": lambda b: env(
        b,
        "developer/message",
        {
            "headerSeq": 3,
            "message": msg(b, "developer", [{"type": "tool-addition", "toolName": "grep"}]),
        },
        surfaceOp="append",
    ),
    "D3-tool-not-in-header": lambda b: env(
        b,
        "developer/message",
        {
            "headerSeq": 7,
            "message": msg(b, "developer", [{"type": "tool-addition", "toolName": "find"}]),
        },
        surfaceOp="append",
    ),
    "D4-header-system": lambda b: env(
        b, "request/header", {"header": {"config": CFG, "system": "prompt"}, "reason": "change"}
    ),
    "D4-empty-tools": lambda b: env(
        b, "request/header", {"header": {"config": CFG, "tools": []}, "reason": "change"}
    ),
    "D4-config-without-provider-model": lambda b: env(
        b, "request/header", {"header": {"config": {"model": "m"}}, "reason": "change"}
    ),
    "D4-starts-series-false": lambda b: env(
        b, "request/header", {"header": {"config": CFG}, "reason": "change", "startsSeries": False}
    ),
    "D4-adapter-default-without-config-field": lambda b: env(
        b,
        "request/header",
        {"header": {"config": CFG, "adapterDefaults": {"maxTokens": True}}, "reason": "change"},
    ),
    "D4-adapter-default-not-true": lambda b: env(
        b,
        "request/header",
        {
            "header": {"config": {**CFG, "maxTokens": 9}, "adapterDefaults": {"maxTokens": False}},
            "reason": "change",
        },
    ),
    "D4-empty-reasoning-effort": lambda b: env(
        b,
        "request/header",
        {"header": {"config": {**CFG, "reasoningEffort": ""}}, "reason": "change"},
    ),
    "D4-unknown-reason": lambda b: env(
        b, "request/header", {"header": {"config": CFG}, "reason": "fallback"}
    ),
    "D5-error-without-is-error": lambda b: env(
        b,
        "tool/result",
        {
            "turn": 1,
            "step": 1,
            "error": {"name": "E", "code": "x"},
            "message": msg(b, "tool", toolCallId="c9", source={"kind": "tool", "callId": "c9"}),
        },
        surfaceOp="append",
    ),
    "D6-message-without-id": lambda b: env(
        b,
        "assistant/message",
        {"turn": 1, "step": 1, "stream": [], "message": {"role": "assistant", "content": []}},
        surfaceOp="append",
    ),
    "D6-role-mismatch": lambda b: env(
        b, "tool/result", {"message": msg(b, "assistant")}, surfaceOp="append"
    ),
    "D6-message-without-source-kind": lambda b: env(
        b, "user/message", {**msg(b, "user"), "source": {}}, surfaceOp="append"
    ),
    "D6-tool-result-call-id-mismatch": lambda b: env(
        b,
        "tool/result",
        {
            "turn": 1,
            "step": 1,
            "message": msg(b, "tool", toolCallId="c2", source={"kind": "tool", "callId": "c1"}),
        },
        surfaceOp="append",
    ),
    "D6-tool-result-wrapper-two-blocks": lambda b: env(
        b,
        "tool/result",
        {
            "turn": 1,
            "step": 1,
            "message": msg(
                b,
                "user",
                [{"type": "tool-result", "toolCallId": "c1", "content": []}, text("extra")],
                source={"kind": "tool", "callId": "c1"},
            ),
        },
        surfaceOp="append",
    ),
    "D6-tool-result-without-tool-source": lambda b: env(
        b,
        "tool/result",
        {"turn": 1, "step": 1, "message": msg(b, "tool", toolCallId="c1")},
        surfaceOp="append",
    ),
    "D6-assistant-source-not-model": lambda b: env(
        b,
        "assistant/message",
        {
            "turn": 1,
            "step": 1,
            "stream": [],
            "message": msg(b, "assistant", source={"kind": "user"}),
        },
        surfaceOp="append",
    ),
    "D6-system-source-not-system-prompt": lambda b: env(
        b,
        "system/message",
        {"turn": 1, "step": 1, "message": msg(b, "system", source={"kind": "runtime-context"})},
        surfaceOp="append",
    ),
    "D6-v3-tool-result-in-v4-file": lambda b: env(
        b,
        "tool/result",
        {
            "turn": 1,
            "step": 1,
            "message": msg(
                b,
                "user",
                [{"type": "tool-result", "toolCallId": "c1", "content": [text("r")]}],
                source={"kind": "tool", "callId": "c1"},
            ),
        },
        surfaceOp="append",
    ),
    "D6-v4-system-source-in-v3-file": lambda b: env(
        b,
        "system/message",
        {"turn": 1, "step": 1, "message": msg(b, "system", source={"kind": "system-prompt"})},
        surfaceOp="append",
    ),
    "D6-v4-tool-result-in-v3-file": lambda b: env(
        b,
        "tool/result",
        {
            "turn": 1,
            "step": 1,
            "message": msg(
                b, "tool", [text("r")], toolCallId="c1", source={"kind": "tool", "callId": "c1"}
            ),
        },
        surfaceOp="append",
    ),
    "D6-v3-system-message-user-role-in-v3-file": lambda b: env(
        b,
        "system/message",
        {"turn": 1, "step": 1, "message": {**msg(b, "system"), "role": "user"}},
        surfaceOp="append",
    ),
    "D7-attempt-without-stream": lambda b: env(b, "assistant/attempt", {"turn": 1, "step": 1}),
    "D7-attempt-without-settlement-fields": lambda b: env(b, "assistant/attempt", {}),
    "D7-assistant-step-negative": lambda b: env(
        b,
        "assistant/message",
        {"turn": 1, "step": -1, "stream": [], "message": msg(b, "assistant")},
        surfaceOp="append",
    ),
    "E2-ignorable-false": lambda b: {**env(b, "vendor/thing", {}), "ignorable": False},
    "E2-seq-beyond-safe-integer": lambda b: {**env(b, "turn/end", {"turn": 1}), "seq": 2**53},
    "E2-time-beyond-safe-integer": lambda b: {**env(b, "turn/end", {"turn": 1}), "time": 2**53},
    "S1-gap": lambda b: {**env(b, "user/message", msg(b, "user"), surfaceOp="append"), "seq": 12},
    "S2-missing-surface-op": lambda b: env(b, "user/message", msg(b, "user")),
    "S2-malformed-replace": lambda b: env(
        b, "user/message", msg(b, "user"), surfaceOp={"op": "replace", "startSeq": 3}
    ),
    "S2-replace-range-in-future": lambda b: env(
        b,
        "user/message",
        msg(b, "user"),
        surfaceOp={"op": "replace", "startSeq": 3, "endSeq": 99},
        sourceEventSeqs=[3],
    ),
    "S3-sources-on-assistant": lambda b: env(
        b,
        "assistant/message",
        {"turn": 1, "step": 1, "stream": [], "message": msg(b, "assistant")},
        surfaceOp="append",
        sourceEventSeqs=[3],
    ),
    "S3-duplicate-sources": lambda b: env(
        b, "user/message", msg(b, "user"), surfaceOp="append", sourceEventSeqs=[3, 3]
    ),
    "S4-endpoint-not-on-surface": lambda b: env(
        b,
        "user/message",
        msg(b, "user"),
        surfaceOp={"op": "replace", "startSeq": 4, "endSeq": 5},
        sourceEventSeqs=[4, 5],
    ),
    "S4-missing-citation": lambda b: env(
        b,
        "user/message",
        msg(b, "user"),
        surfaceOp={"op": "replace", "startSeq": 3, "endSeq": 6},
        sourceEventSeqs=[3, 6],
    ),
    "S5-tool-result-changes-id": lambda b: env(
        b,
        "tool/result",
        {**tool_res(b), "message": {**tool_res(b)["message"], "id": "new"}},
        surfaceOp={"op": "replace", "startSeq": 5, "endSeq": 5},
        sourceEventSeqs=[5],
    ),
    "S5-tool-result-replaces-two": lambda b: env(
        b,
        "tool/result",
        tool_res(b),
        surfaceOp={"op": "replace", "startSeq": 5, "endSeq": 6},
        sourceEventSeqs=[5, 6],
    ),
    "S6-summary-over-system-head": lambda b: env(
        b,
        "user/message",
        msg(b, "user"),
        surfaceOp={"op": "replace", "startSeq": 0, "endSeq": 3},
        sourceEventSeqs=[0, 3],
    ),
    "M5-offload-index-missing": lambda b: env(
        b, "image/offload", {"targets": [{"seq": 6, "imageIndexes": [1]}]}
    ),
    "M5-offload-not-on-surface": lambda b: env(
        b, "image/offload", {"targets": [{"seq": 4, "imageIndexes": [0]}]}
    ),
    "M5-offload-bad-payload": lambda b: env(b, "image/offload", {"targets": []}),
    "M5-offload-our-old-payload": lambda b: env(
        b, "image/offload", {"images": [{"seq": 6, "index": 1, "uri": "blob://x"}]}
    ),
    "M5-offload-system-message": lambda b: env(
        b, "image/offload", {"targets": [{"seq": 0, "imageIndexes": [0]}]}
    ),
    "M5-offload-twice": lambda b: [
        env(b, "image/offload", {"targets": [{"seq": 6, "imageIndexes": [0]}]}),
        {
            **env(b, "image/offload", {"targets": [{"seq": 6, "imageIndexes": [0]}]}),
            "seq": b.next_seq + 1,
        },
    ],
    "M5-offload-indexes-not-increasing": lambda b: env(
        b, "image/offload", {"targets": [{"seq": 6, "imageIndexes": [0, 0]}]}
    ),
}


def write_case(name: str, make: Callable[[LogBuilder], Raw | list[Raw]]) -> str:
    version = 3 if name in V3_CASES else 4
    b = prefix(version)
    lines = raws(b)
    bad = make(b)
    lines += bad if isinstance(bad, list) else [bad]
    header = {
        "type": "session",
        "version": version,
        "id": name,
        "createdAt": 0,
        "isSeeded": False,
        "delegationDepth": 0,
    }
    body = b"".join(orjson.dumps(x) + b"\n" for x in [header, *lines])
    (OUT / f"{name}.jsonl").write_bytes(body)
    return name


def _session_checkpoint(events: list[Any]) -> dict[str, Any]:
    from processor.offline import fold_events

    return fold_events(events).checkpoint()


def write_checkpoint_cases() -> int:
    """P cases: a log plus ``<name>.checkpoint.json`` for ``--from-checkpoint``."""
    b = prefix()
    events = list(b.events)
    header = {
        "type": "session",
        "version": 4,
        "id": "p",
        "createdAt": 0,
        "isSeeded": False,
        "delegationDepth": 0,
    }
    full = _session_checkpoint(events)

    def write(name: str, log: list[Any], checkpoint: Any) -> None:
        lines = [header, *(e.to_json() for e in log)]
        (OUT / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
        (OUT / f"{name}.checkpoint.json").write_bytes(orjson.dumps(checkpoint))

    # the log was rewritten at the checkpoint's anchor (same seq, other event)
    other = prefix()
    other.events[-1] = other.events[-1].__class__(
        **{
            **{
                f: getattr(other.events[-1], f)
                for f in ("type", "seq", "data", "surface_op", "source_event_seqs", "ignorable")
            },
            "time": 1,
        }
    )
    write("P6-anchor-event-rewritten", other.events, full)
    # the log was shortened below the rows' watermark
    write("P7-log-shortened-below-rows", events[:4], full["rows"])
    # a session checkpoint whose rows have another stateVersion cannot skip the prefix
    bumped = copy.deepcopy(full)
    for row in bumped["rows"].values():
        row["ver"] = 99
    write("P7-row-of-another-state-version", events, bumped)
    return 3


def main() -> None:
    from tests.corpus.make_valid import FORMATS, VALID, write_formats, write_valid

    OUT.mkdir(exist_ok=True)
    for name, make in CASES.items():
        write_case(name, make)
    n = write_checkpoint_cases()
    print(f"wrote {len(CASES) + n} cases to {OUT}")
    print(f"wrote {write_valid()} valid logs to {VALID}")
    print(f"wrote {write_formats()} refused format versions to {FORMATS}")
    from tests.corpus.make_requests import OUT as REQUESTS
    from tests.corpus.make_requests import write_requests

    print(f"wrote {write_requests()} request-building cases to {REQUESTS}")


if __name__ == "__main__":
    main()
