"""Canonical request headers — rule H-1.

The header is what a provider cache keys on, so equality must ignore noise
(absent vs empty optionals, key order) and respect what matters (tool order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

_CONFIG_FIELDS = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")


def canonical_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """``{config}`` plus adapterDefaults only when a flag is true, tools only when non-empty.

    Only the true flags of ``adapterDefaults`` are kept: a false flag means
    the same as an absent one.
    """
    out: dict[str, Any] = {"config": header.get("config") or {}}
    flags = {k: v for k, v in (header.get("adapterDefaults") or {}).items() if v is True}
    if flags:
        out["adapterDefaults"] = flags
    tools = header.get("tools") or []
    if tools:
        out["tools"] = tools
    return out


def _tool_json(tool: Any) -> bytes:
    return orjson.dumps(tool, option=orjson.OPT_SORT_KEYS)


def header_equals(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """H-1: config field by field, stop element-wise, flags, then tools in order."""
    ca, cb = canonical_header(a), canonical_header(b)
    fa, fb = ca["config"], cb["config"]
    if any(fa.get(k) != fb.get(k) for k in _CONFIG_FIELDS):
        return False
    sa, sb = fa.get("stop"), fb.get("stop")
    if (sa is None) != (sb is None) or (
        sa is not None and (len(sa) != len(sb) or any(x != y for x, y in zip(sa, sb, strict=False)))
    ):
        return False
    if ca.get("adapterDefaults", {}) != cb.get("adapterDefaults", {}):
        return False
    ta, tb = ca.get("tools", []), cb.get("tools", [])
    return len(ta) == len(tb) and all(_tool_json(x) == _tool_json(y) for x, y in zip(ta, tb,
                                                                                     strict=True))
