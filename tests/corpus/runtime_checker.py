"""An independent checker of the agent runtime's load checks (tests only).

Written from the runtime's load path (``assertSessionEventEnvelope``,
``validateSessionEventData``, ``assertCurrentLlmShape``, the message shape
checks and the format reader's vocabulary rule), deliberately without
importing :mod:`processor.core`: it works on raw decoded JSON, so a property
test can hold the generator and the fold to the runtime's rules rather than to
each other.  It covers the per-event load checks, seq contiguity and the
vocabulary; surface planning (S-*) and message projections stay with the fold.

``check_log(records, version)`` returns ``None`` when the runtime would load
the log, else ``(index, what)`` of the first refusal.  ``version`` is the
file's format version (3 or 4) or ``None`` for a log without a header, where
a message may take either version's form.
"""

from __future__ import annotations

from typing import Any

SAFE = 9007199254740991

VOCABULARY = frozenset(
    [
        "agent-preset/selected",
        "agent/inbox/spliced",
        "approval/asked",
        "approval/decided",
        "approval/policy",
        "assistant/attempt",
        "assistant/message",
        "command/done",
        "command/run",
        "compaction/end",
        "compaction/prune",
        "compaction/start",
        "compaction/summary",
        "deliverables/presented",
        "developer/message",
        "feedback/message-delete",
        "feedback/message-put",
        "feedback/record",
        "goal/change",
        "hook/invoked",
        "hook/result",
        "image/offload",
        "llm/retry",
        "llm/retry-started",
        "model/selection",
        "permission/preset",
        "plan/mode",
        "request/context",
        "request/header",
        "sandbox/mode",
        "schedule/change",
        "session-log-deepseek/delivery-accepted",
        "session/end-seed",
        "session/title",
        "session/title-llm-request",
        "slots/dispatch",
        "step/end",
        "step/start",
        "subagent/catalog",
        "subagent/descriptor",
        "subagent/model-selection-policy",
        "system/message",
        "team/member",
        "team/message/delivered",
        "team/message/queued",
        "team/task",
        "todo/write",
        "tool-workflow/agent-end",
        "tool-workflow/agent-start",
        "tool-workflow/run-end",
        "tool-workflow/run-start",
        "tool/call",
        "tool/ptc-dispatch",
        "tool/ptc-dispatch-start",
        "tool/result",
        "turn/end",
        "turn/start",
        "user/message",
        "web/deepseek-search-llm-request",
        "workspace/changes",
    ]
)

MESSAGE_TYPES = {
    "system/message": "system",
    "developer/message": "developer",
    "user/message": "user",
    "assistant/message": "assistant",
    "tool/result": "tool",
}


def _obj(v: Any) -> bool:
    return isinstance(v, dict)


def _num_int(v: Any) -> bool:
    """JavaScript Number.isSafeInteger on a decoded JSON number."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    if isinstance(v, float) and (not v.is_integer() or (v == 0 and str(v).startswith("-"))):
        return False
    return abs(v) <= SAFE


def _seq(v: Any) -> bool:
    return _num_int(v) and v >= 0


def _str(v: Any) -> bool:
    return isinstance(v, str) and len(v) > 0


def _pair(v: Any) -> bool:
    return _obj(v) and _str(v.get("provider")) and _str(v.get("model"))


def _envelope(e: Any) -> str | None:
    if not _obj(e):
        return "envelope is not an object"
    if set(e) - {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"}:
        return "invalid envelope key"
    if not isinstance(e.get("type"), str) or not _seq(e.get("seq")) or not _num_int(e.get("time")):
        return "invalid type/seq/time"
    if "data" not in e:
        return "data missing"
    if "ignorable" in e and e["ignorable"] is not True:
        return "ignorable must be true when present"
    return None


def _event_data(t: str, d: Any) -> str | None:
    """validateSessionEventData: relation-free payload rules."""
    if t in MESSAGE_TYPES and _obj(d):
        m = d if t == "user/message" else d.get("message")
        if _obj(m):
            if (t == "developer/message") != (m.get("role") == "developer"):
                return "developer type/role pairing"
            blocks = m.get("content") if isinstance(m.get("content"), list) else []
            changes = [
                b for b in blocks if _obj(b) and b.get("type") in ("tool-addition", "tool-removal")
            ]
            if changes and m.get("role") != "developer":
                return "tool-change block outside developer"
            if t == "developer/message":
                for b in changes:
                    if not _str(b.get("toolName")):
                        return "tool-change without toolName"
                    if b["type"] == "tool-addition" and "tool" in b:
                        return "inline tool definition"
                adds = any(b["type"] == "tool-addition" for b in changes)
                if adds != ("headerSeq" in d) or (adds and not _seq(d["headerSeq"])):
                    return "headerSeq exactly with additions"
    if t == "request/header":
        if not _obj(d) or not _obj(d.get("header")):
            return "header must be an object"
        h = d["header"]
        if "system" in h or h.get("tools") == [] or h.get("adapterDefaults") == {}:
            return "retired or empty header field"
    if t == "tool/result":
        if not _obj(d):
            return "tool/result data"
        if "error" in d and not (_obj(d.get("message")) and d["message"].get("isError") is True):
            return "error without isError"
    return None


def _header(d: dict[str, Any]) -> str | None:
    h = d["header"]
    cfg = h.get("config")
    if not _pair(cfg):
        return "config lacks provider/model"
    if "reasoningEffort" in cfg and not _str(cfg["reasoningEffort"]):
        return "reasoningEffort"
    if "adapterDefaults" in h:
        ad = h["adapterDefaults"]
        if not _obj(ad):
            return "adapterDefaults"
        for k, v in ad.items():
            if k not in ("reasoningEffort", "maxTokens") or v is not True or k not in cfg:
                return "adapterDefaults marker"
    if d.get("reason") not in ("initial", "resume", "change", "series"):
        return "reason"
    if "startsSeries" in d and d["startsSeries"] is not True:
        return "startsSeries"
    return None


def _settled(d: Any) -> bool:
    return (
        _obj(d)
        and _seq(d.get("turn"))
        and _seq(d.get("step"))
        and isinstance(d.get("stream"), list)
    )


def _message(t: str, d: Any, version: int | None) -> str | None:
    m: Any = d if t == "user/message" else (d.get("message") if _obj(d) else None)
    if not _obj(m) or not _str(m.get("id")):
        return "unidentified message"
    role = m.get("role")
    if t == "tool/result":
        roles = {3: ["user"], 4: ["tool"]}.get(version or 0, ["user", "tool"])
        if role not in roles:
            return "tool/result role"
    elif role != MESSAGE_TYPES[t] and not (
        # header-less: the Session's load path checks no system/message role;
        # only the v3 file reader (payload.ts assertSystem) and v4 do
        t == "system/message"
        and version is None
        and _obj(m.get("source"))
        and m["source"].get("kind") == "plugin"
        and _str(m["source"].get("plugin"))
    ):
        return "role"
    src = m.get("source")
    if not _obj(src) or not _str(src.get("kind")):
        return "source"
    if not isinstance(m.get("content"), list):
        return "content"
    kind = src["kind"]
    if version == 4 and kind == "plugin":
        return "v4 plugin kind"
    if t == "system/message":
        ok4 = kind == "system-prompt"
        ok3 = kind == "plugin" and _str(src.get("plugin"))
        if not {3: ok3, 4: ok4}.get(version or 0, ok3 or ok4):
            return "system source"
    if t == "assistant/message" and (kind != "model" or not _pair(src)):
        return "model source"
    if t == "tool/result":
        if kind != "tool" or not _str(src.get("callId")):
            return "tool source"
        content = m["content"]
        if role == "tool":
            if m.get("toolCallId") != src["callId"]:
                return "tool call ids"
            if "isError" in m and not isinstance(m["isError"], bool):
                return "isError"
            if any(_obj(b) and b.get("type") == "tool-result" for b in content):
                return "nested tool-result"
        else:
            if (
                len(content) != 1
                or not _obj(content[0])
                or content[0].get("type") != "tool-result"
                or not isinstance(content[0].get("content"), list)
            ):
                return "one tool-result block"
            if content[0].get("toolCallId") != src["callId"]:
                return "tool call ids"
    return None


def check_event(e: Any, version: int | None) -> str | None:
    """The first load-check failure of one event, or None."""
    problem = _envelope(e)
    if problem:
        return problem
    t, d = e["type"], e["data"]
    if t not in VOCABULARY:
        return None if e.get("ignorable") is True else "unknown required type"
    if t not in MESSAGE_TYPES and ("surfaceOp" in e or "sourceEventSeqs" in e):
        return "surface metadata on a non-surface type"
    problem = _event_data(t, d)
    if problem:
        return problem
    if t == "request/header":
        return _header(d)
    if t == "assistant/attempt":  # an ignorable attempt is opaque
        return None if e.get("ignorable") is True or _settled(d) else "settlement fields"
    if t in MESSAGE_TYPES:
        problem = _message(t, d, version)
        if problem:
            return problem
        if t == "assistant/message" and not _settled(d):
            return "settlement fields"
    return None


def check_log(records: list[Any], version: int | None) -> tuple[int, str] | None:
    """``(index, problem)`` of the first event the runtime refuses, or None."""
    for index, e in enumerate(records):
        problem = check_event(e, version)
        if problem:
            return index, problem
        if e["seq"] != index:
            return index, "seq not contiguous"
    return None
