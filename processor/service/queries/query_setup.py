"""Wiring of queries by session into a member (issue 13).

``processor run --queries`` (and the tests) start the HTTP port first, so
the member can advertise the bound URL in its ``client.id`` (owners.py),
then build the :class:`~processor.service.loop.runner.Processor` with that config
and the :class:`Queries` (``Processor(config, queries=...)``): it makes its
:class:`~processor.service.queries.query_cache.QueryCache` with
:func:`member_cache`; the member feeds the cache, the cache answers the queries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from processor.codec import Codec
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.owners import GroupView, OwnerDirectory, describe_group
from processor.kafka.reads import topic_partitions
from processor.kafka.transport import Reader
from processor.service.ops.http import PathHandler, serve
from processor.service.queries.queries import Queries
from processor.service.queries.query_cache import QueryCache
from processor.telemetry.metrics import Metrics


def query_endpoint(
    config: ServiceConfig,
    metrics: Metrics,
    serve_with: Callable[[PathHandler], Any] | None = None,
) -> tuple[Any, Queries, ServiceConfig]:
    """The HTTP port with the query routes, and ``config`` advertising its URL.

    ``serve_with(handler)``: another server of the port (the inspector's), which
    must expose ``server_port``; default: ``ops.http.serve``.
    """
    queries = Queries(None, registry=metrics.registry)
    if serve_with is not None:
        server = serve_with(queries.http)
    else:
        server = serve(metrics, config.metrics_host, config.metrics_port, queries=queries.http)
    url = config.query_advertise or f"http://{config.metrics_host}:{server.server_port}"
    queries.self_url = url
    return server, queries, config.with_overrides(query_advertise=url, queries=True)


def member_cache(
    config: ServiceConfig,
    codec: Codec,
    plain: Callable[[str], Reader],
    registry: CollectorRegistry,
    queries: Queries,
) -> QueryCache:
    """A member's query cache, which ``queries`` answers from; ``plain(purpose)``:
    a consumer without a group (the cache's fill reads the views topic with one)."""
    topics = config.topics
    cache = QueryCache(
        codec,
        topic=topics.views,
        reader=lambda: plain("query"),
        partition_count=lambda reader: len(topic_partitions(reader, topics.events, 10)),
        budget_bytes=config.query_cache_bytes,
        directory=config.query_cache_dir or None,
        registry=registry,
        stall_s=float(config.fill_stall_s),
    )
    admin = clients.admin(config)  # one for the member's life

    def describe() -> GroupView:
        try:
            return describe_group(admin, config.group_id, topics.events)
        finally:
            admin.poll(
                0
            )  # its queued librdkafka log lines, to logging (a broker down: one a second)

    directory = OwnerDirectory(describe)

    def owner(sid: str) -> tuple[int, str | None] | None:
        try:
            partition, url, _ = directory.view().owner_of(sid)
            if url is None or url == queries.self_url:  # a stale description: ask again
                partition, url, _ = directory.view(fresh=True).owner_of(sid)
        except Exception:  # the coordinator is moving: the client retries
            return None
        return partition, url

    queries.serve(cache, owner)
    return cache
