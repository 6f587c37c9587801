"""Data checks of the events — rule D (D-1..D-7): message shapes per format
version, tool blocks and their header, settlement, the request header, as
the runtime's load path checks them.  ``lookup(seq)`` returns an earlier event
or None (D-3 looks up a ``request/header``).  The envelope (rule E) is
``events.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from processor.core.errors import SessionError
from processor.core.events import (
    HEADER_REASONS,
    KNOWN_TYPES,
    ROLE_OF_TYPE,
    SURFACE_TYPES,
    Event,
    is_seq,
    safe_int,
)

EventLookup = Callable[[int], "Event | None"]


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _has_provider_model(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _nonempty_str(value.get("provider"))
        and _nonempty_str(value.get("model"))
    )


def _check_tool_result_v4(seq: int, message: Mapping[str, Any], call_id: str) -> None:
    """Format v4: a first-class ``tool`` message answering ``source.callId``."""
    if message.get("toolCallId") != call_id:
        raise SessionError(seq, "D-6", "tool/result message toolCallId must equal source.callId")
    if "isError" in message and not isinstance(message["isError"], bool):
        raise SessionError(seq, "D-6", "tool/result message isError must be a boolean")
    for block in message["content"]:
        if isinstance(block, dict) and block.get("type") == "tool-result":
            raise SessionError(seq, "D-6", "a tool-role message must not wrap a tool-result block")


def _check_tool_result_v3(seq: int, message: Mapping[str, Any], call_id: str) -> None:
    """Released v3 form: a ``user`` message with exactly one ``tool-result`` block."""
    content = message["content"]
    block = content[0] if len(content) == 1 else None
    if (
        not isinstance(block, dict)
        or block.get("type") != "tool-result"
        or not isinstance(block.get("content"), list)
    ):
        raise SessionError(
            seq,
            "D-6",
            "a user-role tool/result message must contain exactly one tool-result "
            "block with a content list",
        )
    if block.get("toolCallId") != call_id:
        raise SessionError(seq, "D-6", "tool-result block toolCallId must equal source.callId")


def _v3_system_source(message: Mapping[str, Any]) -> bool:
    """The v3 system source ``{kind: 'plugin', plugin}``.

    Where no file header names the format, a system message in this form is
    read as the runtime's Session reads it: its load path checks no role of a
    ``system/message`` (only the v3 file reader does), issue 36 item 4.
    """
    source = message.get("source")
    return (
        isinstance(source, dict)
        and source.get("kind") == "plugin"
        and _nonempty_str(source.get("plugin"))
    )


def check_message_shape(event: Event, dialect: int | None = None) -> None:
    """D-6 (with D-1): a surface event carries a message the runtime can replay.

    ``dialect`` selects the session format whose message rules apply: 4 (the
    runtime's newest: tool results are ``tool`` messages, system messages come
    from ``system-prompt``), 3 (the released v3 form: a tool result is a
    ``user`` message wrapping one ``tool-result`` block, a system message has a
    ``plugin`` source) or None, used where no file header names the format
    (Kafka, header-less files): each message may take either form.
    """
    _check_message_shape(event, event.message, dialect)


#: Roles a tool/result message may have, by dialect (3, 4; None: either).
_TOOL_RESULT_ROLES: Final[dict[int | None, tuple[str, ...]]] = {
    3: ("user",),
    4: ("tool",),
    None: ("tool", "user"),
}


def _check_message_shape(
    event: Event, message: Any, dialect: int | None, d1_checked: bool = False
) -> None:
    """:func:`check_message_shape` with ``event.message`` already in hand.

    ``d1_checked``: the caller already ran D-1 on this very message (it did
    whenever data and message are objects, the only way past the D-6 checks
    before D-1 here), so the second test is skipped, not the rule.
    """
    seq, etype = event.seq, event.type
    if etype != "user/message" and not isinstance(event.data, dict):
        raise SessionError(seq, "D-6", f"{etype} data must be an object")
    where = "data" if etype == "user/message" else "data.message"
    if not isinstance(message, dict):
        raise SessionError(seq, "D-6", f"{etype} lacks an identified message ({where}.id)")
    mid = message.get("id")
    if not isinstance(mid, str) or mid == "":
        raise SessionError(seq, "D-6", f"{etype} lacks an identified message ({where}.id)")
    role = message.get("role")
    if not d1_checked and (isinstance(role, str) and role == "developer") != (
        etype == "developer/message"
    ):
        raise SessionError(
            seq,
            "D-1",
            f"developer/message type and role developer must occur together "
            f"(type {etype}, role {role!r})",
        )
    if etype == "tool/result":
        allowed = _TOOL_RESULT_ROLES.get(dialect, _TOOL_RESULT_ROLES[None])
        if role not in allowed:
            raise SessionError(
                seq,
                "D-6",
                f"{where}.role must be {' or '.join(map(repr, allowed))} for "
                f"tool/result, got {role!r}",
            )
    elif not (isinstance(role, str) and role == ROLE_OF_TYPE[etype]) and not (
        dialect is None and etype == "system/message" and _v3_system_source(message)
    ):
        raise SessionError(
            seq, "D-6", f"{where}.role must be {ROLE_OF_TYPE[etype]!r} for {etype}, got {role!r}"
        )
    source = message.get("source")
    if not isinstance(source, dict):
        raise SessionError(seq, "D-6", f"{where}.source must be an object with a non-empty kind")
    kind = source.get("kind")
    if not isinstance(kind, str) or kind == "":
        raise SessionError(seq, "D-6", f"{where}.source must be an object with a non-empty kind")
    if not isinstance(message.get("content"), list):
        raise SessionError(seq, "D-6", f"{where}.content must be a list of blocks")
    if dialect == 4 and kind == "plugin":
        raise SessionError(
            seq,
            "D-6",
            f"{where}.source.kind 'plugin' is the v3 form; format v4 needs a producer-owned kind",
        )
    if etype == "system/message":
        v4_ok = kind == "system-prompt"
        v3_ok = kind == "plugin" and _nonempty_str(source.get("plugin"))
        if not (v4_ok if dialect == 4 else v3_ok if dialect == 3 else v4_ok or v3_ok):
            raise SessionError(
                seq,
                "D-6",
                f"system/message source must be {{kind: 'system-prompt'}} (v4) or "
                f"{{kind: 'plugin', plugin}} (v3), got kind {kind!r}",
            )
    elif etype == "assistant/message":
        if kind != "model" or not _has_provider_model(source):
            raise SessionError(
                seq, "D-6", "assistant/message source must be {kind: 'model', provider, model}"
            )
    elif etype == "tool/result":
        call_id = source.get("callId")
        if kind != "tool" or not _nonempty_str(call_id):
            raise SessionError(
                seq,
                "D-6",
                "tool/result source must be {kind: 'tool', callId} with a non-empty callId",
            )
        if role == "tool":
            _check_tool_result_v4(seq, message, str(call_id))
        else:
            _check_tool_result_v3(seq, message, str(call_id))


def _check_settlement(event: Event) -> None:
    """D-7: assistant/attempt and assistant/message settle one step of one turn."""
    data = event.data
    if (
        not isinstance(data, dict)
        or not is_seq(data.get("turn"))
        or not is_seq(data.get("step"))
        or not isinstance(data.get("stream"), list)
    ):
        raise SessionError(
            event.seq,
            "D-7",
            f"{event.type} needs turn and step (non-negative safe integers) and a stream list",
        )


def _check_tool_blocks(event: Event, message: Any) -> list[str]:
    """D-2: tool-addition/removal blocks of ``message`` (the event's); returns the added names."""
    added: list[str] = []
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return added
    is_dev = event.type == "developer/message"
    for block in content:
        btype = block.get("type") if isinstance(block, dict) else None
        if not (isinstance(btype, str) and (btype == "tool-addition" or btype == "tool-removal")):
            continue
        if not is_dev:
            raise SessionError(
                event.seq, "D-2", f"{btype} blocks are only allowed in developer messages"
            )
        name = block.get("toolName")
        if not isinstance(name, str) or not name:
            raise SessionError(event.seq, "D-2", f"{btype} block needs a non-empty toolName")
        if btype == "tool-addition":
            if "tool" in block:
                raise SessionError(
                    event.seq,
                    "D-2",
                    f"tool-addition {name!r} must not inline a tool definition",
                )
            added.append(name)
    return added


def _check_header_seq_presence(event: Event, added: list[str]) -> None:
    """D-3, relation-free part: headerSeq exactly when there are additions."""
    seq = event.seq
    has = isinstance(event.data, dict) and "headerSeq" in event.data
    if not added and has:
        raise SessionError(seq, "D-3", "headerSeq is only allowed with tool additions")
    if added and not has:
        raise SessionError(seq, "D-3", "developer message with tool additions needs headerSeq")


def _check_header_seq(event: Event, added: list[str], lookup: EventLookup) -> None:
    """D-3: the headerSeq of tool additions points at a header declaring them."""
    seq = event.seq
    if not added:
        return
    header_seq = safe_int(event.data["headerSeq"])
    if header_seq is None or header_seq < 0 or header_seq >= seq:
        raise SessionError(
            seq, "D-3", f"headerSeq {event.data['headerSeq']!r} must be an earlier seq"
        )
    target = lookup(header_seq)
    if target is None or target.type != "request/header":
        raise SessionError(seq, "D-3", f"headerSeq {header_seq} is not a request/header")
    tools = target.data["header"].get("tools")
    if not isinstance(tools, list):
        tools = []  # a header whose tools are not a list declares none (as the runtime reads it)
    for name in added:
        matches = [t for t in tools if isinstance(t, dict) and t.get("name") == name]
        if len(matches) != 1:
            raise SessionError(
                seq,
                "D-3",
                f"header {header_seq} must declare exactly one tool {name!r}, found {len(matches)}",
            )
        tool = matches[0]
        if not isinstance(tool.get("description"), str):
            raise SessionError(
                seq, "D-3", f"tool {name!r} in header {header_seq} needs a string description"
            )
        if not isinstance(tool.get("parameters"), dict):
            raise SessionError(
                seq, "D-3", f"tool {name!r} in header {header_seq} needs object parameters"
            )
        if "deferLoading" in tool and tool["deferLoading"] is not True:
            raise SessionError(seq, "D-3", f"tool {name!r} deferLoading must be true when present")


_ADAPTER_DEFAULT_KEYS: Final = frozenset({"reasoningEffort", "maxTokens"})


def _check_header(event: Event) -> None:
    """D-4: the request/header payload, as the runtime's load path checks it."""
    seq, data = event.seq, event.data
    if not isinstance(data, dict):
        raise SessionError(seq, "D-4", "request/header data must be an object")
    header = data.get("header")
    if not isinstance(header, dict):
        raise SessionError(seq, "D-4", "request/header data.header must be an object")
    if "system" in header:
        raise SessionError(
            seq,
            "D-4",
            "header.system is refused: the prompt lives on the surface as system/message",
        )
    if "tools" in header:
        # The runtime's load path refuses only ``tools: []``; any other value
        # loads (its D-3 lookup then finds no tool in a non-list).  ``null``
        # breaks the runtime's canonicalHeader (``tools.length``), so it is refused.
        tools = header["tools"]
        if tools is None:
            raise SessionError(seq, "D-4", "header.tools: null is refused (omit it instead)")
        if isinstance(tools, list) and not tools:
            raise SessionError(seq, "D-4", "header.tools: [] is refused (omit it instead)")
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, dict) and not defaults:
        raise SessionError(seq, "D-4", "header.adapterDefaults: {} is refused (omit it instead)")
    config = header.get("config")
    if not isinstance(config, dict) or not _has_provider_model(config):
        raise SessionError(
            seq, "D-4", "header.config must name a provider and a model (non-empty strings)"
        )
    effort = config.get("reasoningEffort")
    if "reasoningEffort" in config and not _nonempty_str(effort):
        raise SessionError(seq, "D-4", "header.config.reasoningEffort must be a non-empty string")
    if "adapterDefaults" in header:
        if not isinstance(defaults, dict):
            raise SessionError(seq, "D-4", "header.adapterDefaults must be an object")
        for key, flag in defaults.items():
            if key not in _ADAPTER_DEFAULT_KEYS or flag is not True:
                raise SessionError(
                    seq,
                    "D-4",
                    f"header.adapterDefaults.{key} is invalid (only reasoningEffort "
                    "and maxTokens, each exactly true)",
                )
            if key not in config:
                raise SessionError(
                    seq, "D-4", f"header.adapterDefaults.{key} requires header.config.{key}"
                )
    if data.get("reason") not in HEADER_REASONS:
        raise SessionError(
            seq,
            "D-4",
            f"request/header reason must be one of initial|resume|change|series, "
            f"got {data.get('reason')!r}",
        )
    if "startsSeries" in data and data["startsSeries"] is not True:
        raise SessionError(seq, "D-4", "request/header startsSeries must be absent or true")


def check_event_data(event: Event, lookup: EventLookup, dialect: int | None = None) -> None:
    """Run the data checks D-1..D-7 that apply to ``event``.

    Log-only types other than request/header and assistant/attempt are opaque:
    their ``data`` may be any JSON value, as in the runtime.
    """
    etype = event.type
    if etype not in KNOWN_TYPES:
        return  # ignorable unknown type: opaque
    if etype in SURFACE_TYPES:
        check_surface_data(event, lookup, dialect)
    elif etype == "request/header":
        check_header(event)
    elif etype == "assistant/attempt" and event.ignorable is not True:
        check_settlement(event)  # D-7; an ignorable attempt is opaque (issue 36 item 5)


#: D-4 and D-7 under the names the planner calls directly (it already knows the type).
check_header = _check_header
check_settlement = _check_settlement
check_header_seq = _check_header_seq


def check_surface_data(event: Event, lookup: EventLookup, dialect: int | None = None) -> None:
    """:func:`check_event_data` of a surface event (the planner knows its type)."""
    added = check_surface_fields(event, dialect)
    if added:
        check_header_seq(event, added, lookup)


def check_surface_fields(event: Event, dialect: int | None = None) -> list[str]:
    """:func:`check_surface_data` but D-3's look-up: returns the tool additions.

    The caller runs :func:`check_header_seq` when the list is not empty (the
    planner: its ``lookup`` is a bound method, built only for those events).
    """
    etype = event.type
    # The runtime's order: relation-free data checks (D-1, D-2, headerSeq
    # presence, D-5), then the message shape (D-6), then the settlement
    # fields (D-7), then the header the additions point at (D-3).
    data = event.data
    if etype == "user/message":
        message: Any = data
    else:
        message = data.get("message") if isinstance(data, dict) else None
    d1_checked = False
    if isinstance(data, dict) and isinstance(message, dict):
        role = message.get("role")
        # (isinstance first, here and below: compiled, a str compares as a
        # str instead of through the generic rich compare of Any values)
        if (isinstance(role, str) and role == "developer") != (etype == "developer/message"):
            raise SessionError(
                event.seq,
                "D-1",
                f"developer/message type and role developer must occur "
                f"together (type {etype}, role {role!r})",
            )
        d1_checked = True
    added = _check_tool_blocks(event, message)
    if etype == "developer/message":
        _check_header_seq_presence(event, added)
    elif etype == "tool/result":
        if not isinstance(data, dict):
            raise SessionError(event.seq, "D-6", "tool/result data must be an object")
        if "error" in data and not (isinstance(message, dict) and message.get("isError") is True):
            raise SessionError(
                event.seq, "D-5", "tool/result with error requires message.isError === true"
            )
    _check_message_shape(event, message, dialect, d1_checked)
    if etype == "assistant/message":
        _check_settlement(event)
        return []
    # D-3 runs last; only a developer/message may carry additions (D-2)
    return added if etype == "developer/message" else []
