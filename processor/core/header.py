"""Request-header canonical form and equality as the runtime computes them (H-1).

A ``request/header`` records what a provider request is keyed on: the model
``config``, the adapter-default markers and the tools (the system prompt lives
on the surface, never in the header, D-4).  The step loop decides with
:func:`header_equals` whether a new header must be logged (H-2) and whether
the assembled tools differ from the logged ones; the ``requestHeader`` unit
publishes :func:`canonical_header`.  Both must agree with the runtime that
reads (and later extends) the same log, or a resumed session would log
headers the runtime would not, or skip ones it would.  The facts
(``canonicalHeader``, ``headerEquals`` and ``callConfigEquals`` of the
runtime, issue 17 items 9-11):

* canonical form: ``{config}``, plus ``adapterDefaults`` *as given* when its
  ``reasoningEffort`` or ``maxTokens`` marker is ``true`` (no other marker
  makes it kept), plus ``tools`` when non-empty;
* config equality is JavaScript ``===`` per field: ``provider``, ``model``,
  ``reasoningEffort``, ``temperature``, ``maxTokens`` (so ``null`` differs
  from absent, ``1`` equals ``1.0``, ``True`` never equals ``1``; other
  config keys do not take part), and ``stop``: absent only equals absent,
  otherwise element-wise;
* adapter defaults compare only the two known markers, by ``===``;
* tools compare in order by their JSON serialisation, where key order
  matters (a reordered schema is a new prefix for a provider's cache) and
  numbers print as JavaScript prints them.

For a logged header (D-4 admits only the known markers, each ``true``, and
non-empty tools) the canonical form is the header's own fields.  Pure; inputs
are never mutated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = [
    "ADAPTER_DEFAULT_FLAGS",
    "call_config_equals",
    "canonical_header",
    "header_equals",
    "js_json",
    "js_strict_equals",
]

#: The adapter-default markers the runtime knows (``LlmCallConfigAdapterDefaults``).
ADAPTER_DEFAULT_FLAGS: Final = ("reasoningEffort", "maxTokens")
_CONFIG_SCALARS: Final = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")

_ABSENT: Final = object()


def canonical_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime's ``canonicalHeader``: config, known-flag adapter defaults, non-empty tools."""
    out: dict[str, Any] = {}
    if "config" in header:  # an absent config stays absent (JavaScript: undefined)
        out["config"] = header["config"]
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, Mapping) and any(
        defaults.get(f) is True for f in ADAPTER_DEFAULT_FLAGS
    ):
        out["adapterDefaults"] = defaults
    tools = header.get("tools")
    if tools is None and "tools" in header:
        raise TypeError("canonical_header: tools is null (the runtime fails on it too)")
    if isinstance(tools, Sequence) and not isinstance(tools, bytes) and len(tools) > 0:
        out["tools"] = tools  # any non-empty list (or string: JavaScript's length test)
    return out


def js_strict_equals(a: Any, b: Any) -> bool:
    """JavaScript ``===`` over JSON values (``_ABSENT`` plays ``undefined``).

    Numbers compare by value (``1 === 1.0``), booleans only with booleans,
    ``null`` only with ``null``; objects and arrays are compared by identity,
    which for values parsed from JSON means never equal.
    """
    if a is _ABSENT or b is _ABSENT:
        return a is b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return a is b


def call_config_equals(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The runtime's ``callConfigEquals`` (item 9: ``stop: []`` and null are not absent)."""
    for key in _CONFIG_SCALARS:
        if not js_strict_equals(a.get(key, _ABSENT), b.get(key, _ABSENT)):
            return False
    sa, sb = a.get("stop", _ABSENT), b.get("stop", _ABSENT)
    if sa is _ABSENT or sb is _ABSENT:
        return sa is sb
    if not isinstance(sa, list | tuple) or not isinstance(sb, list | tuple):
        return js_strict_equals(sa, sb)
    return len(sa) == len(sb) and all(js_strict_equals(x, y) for x, y in zip(sa, sb, strict=True))


def header_equals(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The runtime's ``headerEquals`` of the two headers' canonical forms.

    Canonicalising here (idempotent) keeps a caller from comparing a raw
    header whose unknown or false markers the runtime would have dropped.
    """
    a, b = canonical_header(a), canonical_header(b)
    ca, cb = a.get("config"), b.get("config")
    if not isinstance(ca, Mapping) or not isinstance(cb, Mapping) or not call_config_equals(ca, cb):
        return False
    da, db = a.get("adapterDefaults"), b.get("adapterDefaults")
    for flag in ADAPTER_DEFAULT_FLAGS:
        fa = da.get(flag, _ABSENT) if isinstance(da, Mapping) else _ABSENT
        fb = db.get(flag, _ABSENT) if isinstance(db, Mapping) else _ABSENT
        if not js_strict_equals(fa, fb):
            return False
    ta, tb = a.get("tools") or [], b.get("tools") or []
    return len(ta) == len(tb) and all(js_json(x) == js_json(y) for x, y in zip(ta, tb, strict=True))


# ------------------------------------------------------------ JSON.stringify


def _js_number(value: float | int) -> str:
    """A number as JavaScript's ``String(number)`` prints it (shortest round trip)."""
    if isinstance(value, int):
        if abs(value) <= 2**53:
            return str(value)
        value = float(value)  # JavaScript holds it as the nearest double
    if not math.isfinite(value):
        return "null"  # JSON.stringify turns NaN/Infinity into null
    if value == 0:
        return "0"
    text = repr(value)
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    digits = mantissa.lstrip("-").replace(".", "")
    point = mantissa.lstrip("-").find(".")
    point = point if point >= 0 else len(mantissa.lstrip("-"))
    # Normalise to digits d1..dk and decimal exponent n: value = 0.d1..dk * 10**n.
    stripped = digits.lstrip("0")
    n = point + exponent - (len(digits) - len(stripped))
    digits = stripped.rstrip("0") or "0"
    k = len(digits)
    sign = "-" if value < 0 else ""
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exp = f"e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + digits[0] + ("." + digits[1:] if k > 1 else "") + exp


def js_json(value: Any) -> str:
    """``JSON.stringify(value)`` for JSON data: key order kept, numbers printed as in JS."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return _js_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return (
            "{"
            + ",".join(
                json.dumps(str(k), ensure_ascii=False) + ":" + js_json(v) for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(js_json(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")
