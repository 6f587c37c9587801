"""The broker's internal topics are never deleted, by the bench or by the service."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from bench import common
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.topic_admin import delete_topics


class _Admin:
    """Lists a topic set that grows inside the block; records what it is asked to delete."""

    def __init__(self) -> None:
        self.topics = {"events"}
        self.deleted: list[str] = []

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={name: None for name in self.topics})

    def delete_topics(self, names: list[str], operation_timeout: float) -> dict[str, Future[None]]:
        self.deleted += names
        done: Future[None] = Future()
        done.set_result(None)
        return {name: done for name in names}


def test_delete_topics_refuses_the_brokers_internal_topics() -> None:
    admin = _Admin()
    with pytest.raises(ValueError, match="__consumer_offsets"):
        delete_topics(admin, ["p.views", "__consumer_offsets"])  # type: ignore[arg-type]
    assert admin.deleted == []


def test_a_figures_topics_go_but_not_the_internal_ones_it_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A figure that first commits offsets or a transaction on a fresh broker
    # creates __consumer_offsets / __transaction_state; deleting them with the
    # figure's own topics stalled the next latency runs' first transactions.
    admin = _Admin()
    monkeypatch.setattr(clients, "admin", lambda config: admin)
    with common.topics_dropped_after(ServiceConfig()):
        admin.topics |= {"p.views", "__consumer_offsets", "__transaction_state"}
    assert admin.deleted == ["p.views"]
