"""``tokenUsage``: the runtime's billed-token totals (its token meter's unit).

Every settlement of a model request (``assistant/message``, or
``assistant/attempt`` for one that failed) reports the provider's usage for
its turn and step: ``data.usage`` on a message, else the last
``{type: "chunk", chunk: {type: "usage", usage}}`` record of its embedded
``stream``.  Samples of the same turn and step replace each other (a usage
chunk and the final message report the same request); an
``llm/retry-started`` for that step closes the slot, so the retried request
adds to the totals.  Rules TU-1..TU-3 (docs/projection-rules.md).

State::

    {"totals": buckets, "last": [turn, step, *bucket values] | None}
    buckets = {"uncachedInputTokens", "outputTokens", "cacheReadTokens",
               "cacheWriteTokens"}   # usage inputTokens, outputTokens,
                                     # cacheReadTokens ?? 0, cacheWriteTokens ?? 0

(The runtime's ``last`` is ``{turn, step, buckets}``; ours is the same six
numbers in one list: a held session keeps one list instead of two objects.)

View: ``totals``.  A sample that is not the runtime's usage shape (token
counts that are not non-negative integers) or an event without integer
``turn``/``step`` leaves the state unchanged: the runtime trusts its writers,
we do not let one bad event poison the totals.
"""

from __future__ import annotations

from typing import Any, Final

from processor.core.builtin._common import require_dict
from processor.core.events import Event, safe_int
from processor.core.frozen import freeze, frozen_dict_of
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY: Final = "tokenUsage"
BUCKETS: Final = ("uncachedInputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")
_INIT: Final[Any] = freeze({"totals": dict.fromkeys(BUCKETS, 0), "last": None})


def _count(value: Any) -> int | None:
    n = safe_int(value)
    return n if n is not None and n >= 0 else None


def _optional(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return 0 if value is None else _count(value)


def _values(usage: Any) -> list[int] | None:
    """The buckets of one usage sample (TU-1) in :data:`BUCKETS` order, or None
    when it is not one."""
    if not isinstance(usage, dict):
        return None
    uncached = _count(usage.get("inputTokens"))
    output = _count(usage.get("outputTokens"))
    cache_read = _optional(usage, "cacheReadTokens")
    cache_write = _optional(usage, "cacheWriteTokens")
    if uncached is None or output is None or cache_read is None or cache_write is None:
        return None
    return [uncached, output, cache_read, cache_write]


def _sample(data: dict[str, Any], message: bool) -> Any:
    """The usage a settlement reports: ``data.usage`` of a message, else its stream's last."""
    if message and data.get("usage") is not None:
        return data["usage"]
    stream = data.get("stream")
    if not isinstance(stream, list):
        return None
    for record in reversed(stream):
        if isinstance(record, dict) and record.get("type") == "chunk":
            chunk = record.get("chunk")
            if isinstance(chunk, dict) and chunk.get("type") == "usage":
                return chunk.get("usage")
    return None


def init(header: SessionHeader, inherited: int) -> Any:
    return _INIT


def _state(totals: dict[str, Any], last: list[Any]) -> Any:
    """``freeze({"totals": totals, "last": last})`` for the two it has just built
    (the dicts become frozen in place where the build can: frozen_dict_of)."""
    return frozen_dict_of({"totals": frozen_dict_of(totals), "last": freeze(last)})


def apply(state: Any, event: Event) -> Any:
    data = event.data
    if not isinstance(data, dict):
        return state
    last = state["last"]
    etype = event.type
    if etype == "llm/retry-started":  # TU-2: the retried request adds
        if last is not None and last[0] == data.get("turn") and last[1] == data.get("step"):
            return freeze({**state, "last": None})
        return state
    if etype != "assistant/message" and etype != "assistant/attempt":
        return state
    turn, step = _count(data.get("turn")), _count(data.get("step"))
    values = _values(_sample(data, etype == "assistant/message"))
    if values is None or turn is None or step is None:
        return state
    totals = state["totals"]
    a, b, c, d = values
    if last is not None and last[0] == turn and last[1] == step:
        previous = last[2:]  # TU-3: a same-step sample replaces the earlier one
        if previous == values:
            return state
        # the bucket a sample replaces comes off: total - previous + new, per bucket
        a, b, c, d = a - previous[0], b - previous[1], c - previous[2], d - previous[3]
    # BUCKETS' order, as the state always had it
    new_totals: dict[str, Any] = {
        "uncachedInputTokens": totals["uncachedInputTokens"] + a,
        "outputTokens": totals["outputTokens"] + b,
        "cacheReadTokens": totals["cacheReadTokens"] + c,
        "cacheWriteTokens": totals["cacheWriteTokens"] + d,
    }
    return _state(new_totals, [turn, step, *values])


def _validate_buckets(value: Any, what: str) -> None:
    require_dict(value, BUCKETS, what)
    if set(value) != set(BUCKETS) or any(_count(value[k]) is None for k in BUCKETS):
        raise ValueError(f"{what} must hold exactly the four non-negative integer buckets")


def validate_view(view: Any) -> None:
    _validate_buckets(view, "tokenUsage totals")


def validate_state(state: Any) -> None:
    require_dict(state, ("totals", "last"), "tokenUsage state")
    validate_view(state["totals"])
    last = state["last"]
    if last is not None and not (
        isinstance(last, list)
        and len(last) == 2 + len(BUCKETS)
        and all(_count(v) is not None for v in last)
    ):
        raise ValueError("tokenUsage.last must be [turn, step, four buckets] or null")


def view(state: Any) -> Any:
    return state["totals"]


TOKEN_USAGE = ProjectionDefinition(
    key=KEY,
    state_version=2,
    init=init,
    apply=apply,
    validate_state=validate_state,
    wire=WireView(view=view, validate_view=validate_view),
    event_types=frozenset({"assistant/message", "assistant/attempt", "llm/retry-started"}),
)
