"""Canonical request headers — rule H-1 (SESSION-SEMANTICS.md §9, seed 6.10).

A ``request/header`` records what a provider request is keyed on: the model
``config``, the adapter-default markers and the tools (the system prompt lives
on the surface, never in the header, D-4).  Equality decides whether a new
header must be logged (H-2), so it must ignore noise — an absent optional vs
an empty one, key order inside a tool schema — and respect what matters,
such as tool order (it changes the provider's cache prefix).

Decisions where the spec is silent:

* ``adapterDefaults`` keeps only its flags that are ``True``: a false flag
  means the same as an absent one, and "only when a flag is true" would be
  contradicted by keeping false ones in a canonical value.
* Header keys other than ``config``, ``adapterDefaults`` and ``tools`` are
  dropped (D-4 already refuses ``system``).
* In :func:`header_equals`, an absent or null ``stop`` equals ``[]``; a
  boolean never equals a number (``True`` is not ``1``, as in JavaScript's
  ``===``); config keys other than the listed fields do not take part.

Both functions are pure and never mutate their inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

__all__ = ["CONFIG_FIELDS", "canonical_header", "header_equals"]

#: The scalar config fields :func:`header_equals` compares, in order (``stop`` follows).
CONFIG_FIELDS: Final = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")


def canonical_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """H-1: ``{config}`` plus adapterDefaults only when a flag is true, tools only when non-empty.

    The returned dict is new; ``config`` and the tool objects are shared with
    the input (freeze the result when it must be immutable).
    """
    config = header.get("config")
    out: dict[str, Any] = {"config": config if isinstance(config, Mapping) else {}}
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, Mapping):
        flags = {k: True for k, v in defaults.items() if v is True}
        if flags:
            out["adapterDefaults"] = flags
    tools = header.get("tools")
    if isinstance(tools, Sequence) and not isinstance(tools, str | bytes) and tools:
        out["tools"] = list(tools)
    return out


def _same(a: Any, b: Any) -> bool:
    """Strict scalar equality: booleans only equal booleans."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _stop(config: Mapping[str, Any]) -> list[Any]:
    stop = config.get("stop")
    if stop is None:
        return []
    if isinstance(stop, Sequence) and not isinstance(stop, str | bytes):
        return list(stop)
    return [stop]


def _canonical_json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def header_equals(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """H-1: config field by field, ``stop`` element-wise, the flags, then tools in order.

    Tools compare by canonical JSON (sorted keys), so key order inside a
    schema does not matter but tool order does.
    """
    ca, cb = canonical_header(a), canonical_header(b)
    fa, fb = ca["config"], cb["config"]
    if not all(_same(fa.get(k), fb.get(k)) for k in CONFIG_FIELDS):
        return False
    sa, sb = _stop(fa), _stop(fb)
    if len(sa) != len(sb) or not all(_same(x, y) for x, y in zip(sa, sb, strict=True)):
        return False
    if ca.get("adapterDefaults", {}) != cb.get("adapterDefaults", {}):
        return False
    ta, tb = ca.get("tools", []), cb.get("tools", [])
    return len(ta) == len(tb) and all(
        _canonical_json(x) == _canonical_json(y) for x, y in zip(ta, tb, strict=True))
