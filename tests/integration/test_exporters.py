"""The Prometheus and OpenTelemetry exporters, over clients that talked to a real memcached.

Each part is skipped only when its extra (``prometheus``, ``otel``) is not installed; the
``test`` extra installs both."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.metrics import LATENCY_BOUNDS
from django_fastcache.errors import NetworkError
from django_fastcache.testing.servers import MemcachedServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("own_stacks")]


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    process = MemcachedServer().start()
    try:
        yield process
    finally:
        process.kill()


def busy_clients(server: MemcachedServer) -> tuple[Client, BlockingClient]:
    """An async client (timed) that made 2 sets and 3 gets, a blocking one that made 4 gets."""
    client = Client([server.location], autobatching=False, latency_metrics=True)

    async def calls() -> None:
        try:
            for n in range(2):
                await client.set(b"k%d" % n, b"v")
            for n in range(3):
                await client.get(b"k%d" % n)
        finally:
            await client.aclose()

    asyncio.run(calls())
    blocking = BlockingClient(client.cluster, client.health)
    for _ in range(4):
        run_blocking(blocking.get(b"k0"))
    return client, blocking


# -- Prometheus ------------------------------------------------------------------------------------
def scrape(collector: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one scrape, by name and labels, as Prometheus would read it."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def test_prometheus_scrape(server: MemcachedServer) -> None:
    pytest.importorskip("prometheus_client")
    from django_fastcache.exporters.prometheus import FastCacheCollector

    client, blocking = busy_clients(server)
    samples = scrape(FastCacheCollector({"main": client, "sync": blocking}))
    node = server.location

    def labels(cache: str, kind: str, **extra: str) -> frozenset[tuple[str, str]]:
        return frozenset({"cache": cache, "client": kind, "node": node, **extra}.items())

    get_async = labels("main", "async", operation="get")
    assert samples[("fastcache_requests_total", get_async)] == 3
    assert samples[("fastcache_requests_total", labels("main", "async", operation="store"))] == 2
    assert samples[("fastcache_request_errors_total", get_async)] == 0
    assert samples[("fastcache_request_duration_seconds_count", get_async)] == 3
    assert 0 < samples[("fastcache_request_duration_seconds_sum", get_async)] < 3
    buckets = [
        samples[("fastcache_request_duration_seconds_bucket", get_async | {("le", le)})]
        for le in [*(repr(b) for b in LATENCY_BOUNDS), "+Inf"]
    ]
    assert buckets == sorted(buckets)  # cumulative
    assert buckets[-1] == 3
    get_sync = labels("sync", "blocking", operation="get")
    assert samples[("fastcache_requests_total", get_sync)] == 4
    # The blocking client is not timed: no histogram for it.
    assert ("fastcache_request_duration_seconds_count", get_sync) not in samples
    assert ("fastcache_requests_total", labels("main", "async", operation="delete")) not in samples
    assert samples[("fastcache_node_healthy", labels("main", "async"))] == 1
    assert samples[("fastcache_pool_connections_opened_total", labels("main", "async"))] == 1
    assert samples[("fastcache_pool_connections", labels("sync", "blocking", state="open"))] == 1


def test_prometheus_sees_a_node_go_down(server: MemcachedServer) -> None:
    pytest.importorskip("prometheus_client")
    from django_fastcache.exporters.prometheus import FastCacheCollector

    client, blocking = busy_clients(server)
    server.kill()
    with pytest.raises(NetworkError):
        blocking.get_now(b"k0")
    samples = scrape(FastCacheCollector(lambda: {"main": client, "sync": blocking}))
    node = server.location
    for cache, kind in (("main", "async"), ("sync", "blocking")):
        key = frozenset({"cache": cache, "client": kind, "node": node}.items())
        assert samples[("fastcache_node_healthy", key)] == 0  # one health for both
    sync_get = frozenset(
        {"cache": "sync", "client": "blocking", "node": node, "operation": "get"}.items()
    )
    assert samples[("fastcache_request_errors_total", sync_get)] == 1


def test_prometheus_reads_every_fastcache_alias_by_default(
    server: MemcachedServer, settings: Any
) -> None:
    pytest.importorskip("prometheus_client")
    from django.core.cache import caches

    from django_fastcache.exporters.prometheus import FastCacheCollector

    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "fast": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": server.location,
            "OPTIONS": {"disk_tier": False},
        },
    }
    cache = caches["fast"]
    assert isinstance(cache, FastCache)
    cache.set("a", 1)
    assert cache.get("a") == 1
    samples = scrape(FastCacheCollector())
    key = frozenset(
        {"cache": "fast", "client": "blocking", "node": server.location, "operation": "get"}.items()
    )
    assert samples[("fastcache_requests_total", key)] == 1
    assert {dict(labels)["cache"] for _, labels in samples} == {"fast"}


# -- OpenTelemetry ---------------------------------------------------------------------------------
def test_opentelemetry_observable_instruments(server: MemcachedServer) -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_fastcache.exporters.otel import instrument

    client, blocking = busy_clients(server)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        instrument(provider.get_meter("test"), {"main": client, "sync": blocking})
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    points: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = [
                    (dict(p.attributes), p.value) for p in metric.data.data_points
                ]

    def value(name: str, **attributes: Any) -> float:
        found = [v for a, v in points[name] if all(a.get(k) == w for k, w in attributes.items())]
        assert len(found) == 1, (name, attributes, points[name])
        return found[0]

    node = server.location
    assert value("fastcache.requests", cache="main", operation="get", node=node) == 3
    assert value("fastcache.requests", cache="sync", client="blocking", operation="get") == 4
    assert value("fastcache.request.errors", cache="main", operation="store") == 0
    assert value("fastcache.request.duration.count", cache="main", operation="get") == 3
    assert value("fastcache.request.duration.bucket", cache="main", operation="get", le="+Inf") == 3
    assert 0 < value("fastcache.request.duration.sum", cache="main", operation="get") < 3
    assert value("fastcache.node.healthy", cache="main") == 1
    assert value("fastcache.pool.connections.opened", cache="main") == 1
    assert value("fastcache.pool.connections", cache="sync", state="open") == 1
