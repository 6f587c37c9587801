"""The runtime's ``tokenUsage`` unit (TU-1..TU-3, docs/projection-rules.md).

The cases are the runtime token meter's own projection cases, written as logs.
"""

from __future__ import annotations

from typing import Any

import pytest

from processor.core.builder import LogBuilder
from processor.core.builtin import TOKEN_USAGE, default_registry
from processor.core.defaults import default_message_projections
from processor.core.session import Session

ZERO = {"uncachedInputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0, "cacheWriteTokens": 0}


def usage_record(usage: dict[str, Any]) -> dict[str, Any]:
    return {"type": "chunk", "time": 0, "chunk": {"type": "usage", "usage": usage}}


class Log:
    def __init__(self) -> None:
        self.b = LogBuilder()
        self.b.system("s")

    def chunk(self, usage: dict[str, Any], turn: int, step: int) -> None:
        """A settled attempt whose stream carries a usage chunk."""
        self.b.add_raw(
            "assistant/attempt", {"turn": turn, "step": step, "stream": [usage_record(usage)]}
        )

    def final(self, usage: dict[str, Any] | None, turn: int, step: int, **extra: Any) -> None:
        data: dict[str, Any] = {
            "turn": turn,
            "step": step,
            "stream": [usage_record(usage)] if usage is not None else [],
            "message": self.b.message("assistant", []),
            **extra,
        }
        if usage is not None:
            data["usage"] = usage
        self.b.add_raw("assistant/message", data, surfaceOp="append")

    def retry_started(self, turn: int, step: int) -> None:
        self.b.add_raw(
            "llm/retry-started", {"retryId": "r1", "turn": turn, "step": step, "retry": 1}
        )

    def session(self) -> Session:
        return Session.fold(
            self.b.events,
            projections=default_registry(),
            message_projections=default_message_projections(),
        )

    def view(self) -> Any:
        return self.session().projections.view_of("tokenUsage")


def test_TU1_zero_buckets_without_samples() -> None:
    log = Log()
    assert log.view() == ZERO
    log.retry_started(1, 1)
    assert log.view() == ZERO
    assert TOKEN_USAGE.state_version == 2


def test_TU1_buckets_map_the_usage_fields_and_reasoning_is_not_added() -> None:
    log = Log()
    log.chunk(
        {"inputTokens": 10, "outputTokens": 6, "reasoningTokens": 5, "cacheReadTokens": 2}, 1, 1
    )
    log.final(
        {"inputTokens": 10, "outputTokens": 6, "reasoningTokens": 5, "cacheReadTokens": 2}, 1, 1
    )
    log.chunk(
        {"inputTokens": 20, "outputTokens": 9, "reasoningTokens": 7, "cacheWriteTokens": 4}, 1, 2
    )
    log.final(
        {"inputTokens": 20, "outputTokens": 9, "reasoningTokens": 7, "cacheWriteTokens": 4}, 1, 2
    )
    assert log.view() == {
        "uncachedInputTokens": 30,
        "outputTokens": 15,
        "cacheReadTokens": 2,
        "cacheWriteTokens": 4,
    }


def test_TU1_a_chunk_without_a_final_message_is_kept_and_a_message_may_carry_it_in_its_stream() -> (
    None
):
    log = Log()
    log.chunk({"inputTokens": 9, "outputTokens": 1}, 1, 1)
    assert log.view() == {**ZERO, "uncachedInputTokens": 9, "outputTokens": 1}
    log.final(None, 1, 2, stream=[usage_record({"inputTokens": 1, "outputTokens": 1})])
    assert log.view() == {**ZERO, "uncachedInputTokens": 10, "outputTokens": 2}


@pytest.mark.parametrize(
    "usage",
    [
        {"inputTokens": -1, "outputTokens": 1},
        {"outputTokens": 1},
        {"inputTokens": 1.5, "outputTokens": 1},
        "x",
    ],
)
def test_TU1_a_sample_that_is_not_usage_leaves_the_totals(usage: Any) -> None:
    log = Log()
    log.chunk({"inputTokens": 3, "outputTokens": 1}, 1, 1)
    before = log.session().projections.state_of("tokenUsage")
    log.chunk(usage, 1, 2)
    assert log.session().projections.state_of("tokenUsage") == before


def test_TU3_a_same_step_sample_replaces_the_earlier_one() -> None:
    log = Log()
    usage = {"inputTokens": 10, "outputTokens": 4, "cacheReadTokens": 7, "cacheWriteTokens": 2}
    log.chunk(usage, 1, 1)
    s = log.session()
    s.projections.drain_view_changes()
    before = s.projections.state_of("tokenUsage")
    s.append(
        log.b.add_raw(
            "assistant/message",
            {
                "turn": 1,
                "step": 1,
                "stream": [],
                "message": log.b.message("assistant", []),
                "usage": usage,
            },
            surfaceOp="append",
        )
    )
    assert s.projections.state_of("tokenUsage") is before  # identical sample: no change (P-1)
    log2 = Log()
    log2.chunk({"inputTokens": 10, "outputTokens": 2, "cacheReadTokens": 3}, 1, 1)
    log2.final(
        {"inputTokens": 14, "outputTokens": 5, "cacheReadTokens": 8, "cacheWriteTokens": 1}, 1, 1
    )
    assert log2.view() == {
        "uncachedInputTokens": 14,
        "outputTokens": 5,
        "cacheReadTokens": 8,
        "cacheWriteTokens": 1,
    }


def test_TU2_a_retried_request_adds_to_the_totals() -> None:
    log = Log()
    log.chunk({"inputTokens": 10, "outputTokens": 2, "cacheReadTokens": 3}, 1, 1)
    log.retry_started(1, 1)
    log.chunk({"inputTokens": 12, "outputTokens": 4, "cacheReadTokens": 6}, 1, 1)
    log.final(
        {"inputTokens": 14, "outputTokens": 5, "cacheReadTokens": 8, "cacheWriteTokens": 1}, 1, 1
    )
    assert log.view() == {
        "uncachedInputTokens": 24,
        "outputTokens": 7,
        "cacheReadTokens": 11,
        "cacheWriteTokens": 1,
    }
    other = Log()
    other.chunk({"inputTokens": 10, "outputTokens": 2}, 1, 1)
    other.retry_started(1, 2)  # another step's retry does not close this slot
    other.final({"inputTokens": 10, "outputTokens": 2}, 1, 1)
    assert other.view() == {**ZERO, "uncachedInputTokens": 10, "outputTokens": 2}


def test_TU1_checkpoint_rows_are_validated() -> None:
    log = Log()
    log.chunk({"inputTokens": 8, "outputTokens": 2, "cacheReadTokens": 5}, 1, 1)
    state = log.session().projections.state_of("tokenUsage")
    TOKEN_USAGE.validate_state(state)
    with pytest.raises(ValueError):
        TOKEN_USAGE.validate_state({**state, "totals": {**ZERO, "outputTokens": -1}})
    with pytest.raises(ValueError):
        TOKEN_USAGE.validate_state({**state, "last": [1, 1, 0]})


def test_TU1_a_message_s_own_usage_wins_over_its_stream() -> None:
    log = Log()
    log.final(
        {"inputTokens": 5, "outputTokens": 5},
        1,
        1,
        stream=[usage_record({"inputTokens": 1, "outputTokens": 1})],
    )
    assert log.view() == {**ZERO, "uncachedInputTokens": 5, "outputTokens": 5}
