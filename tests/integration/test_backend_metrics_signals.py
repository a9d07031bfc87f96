"""The backend's metrics (both clients) and node signals, and the blocking client's counters,
against real memcached processes the tests stop, pause and start again."""

from __future__ import annotations

import asyncio
import os
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from django_fastcache import signals
from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.events import NodeEvent
from django_fastcache.errors import NetworkError, OperationTimeoutError
from django_fastcache.testing.servers import MemcachedServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("own_stacks")]


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    process = MemcachedServer().start()
    try:
        yield process
    finally:
        if process.running:
            process.resume()
        process.kill()


def make_cache(server: MemcachedServer, **options: Any) -> FastCache:
    return FastCache(
        [server.location], {"OPTIONS": {"disk_tier": False, "operation_timeout": 0.5, **options}}
    )


def test_the_backend_reports_both_clients(server: MemcachedServer) -> None:
    cache = make_cache(server)
    for n in range(4):
        cache.set(f"k{n}", n)
    for n in range(6):
        cache.get(f"k{n}")  # two misses: calls all the same
    cache.get_many(["k0", "k1", "k2"])  # one node: one request
    with pytest.raises(ValueError, match="not found"):
        cache.incr("absent")

    async def async_calls() -> None:
        await cache.aset("a", 1)
        assert await cache.aget("a") == 1

    asyncio.run(async_calls())
    taken = cache.metrics()
    blocking = taken["blocking"].nodes[server.location]
    assert taken["blocking"].client == "blocking"
    assert blocking.operations["store"].calls == 4
    assert blocking.operations["get"].calls == 7
    assert blocking.operations["incr"].calls == 1
    assert blocking.errors == 0  # NOT_FOUND is an answer, not an error
    assert blocking.operations["get"].latency is None  # not timed by default
    assert blocking.pool.open == 1  # this thread's connection
    assert blocking.healthy
    asynchronous = taken["async"].nodes[server.location]
    assert asynchronous.operations["store"].calls == 1
    assert asynchronous.operations["get"].calls + asynchronous.operations["meta"].calls >= 1
    assert asynchronous.pool.opened == 1


def test_blocking_counts_every_thread_and_keep_them_after_it_ends(
    server: MemcachedServer,
) -> None:
    client = BlockingClient(Cluster([server.location], ClientSettings(timeout=2.0)))
    started = threading.Barrier(4, timeout=10)
    finish = threading.Event()

    def worker() -> None:
        for _ in range(5):
            run_blocking(client.get(b"x"))
        started.wait()
        finish.wait(10)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    started.wait()
    node = client.metrics().nodes[server.location]
    assert node.pool.open == 3  # one connection per thread
    assert node.operations["get"].calls == 15
    finish.set()
    for thread in threads:
        thread.join()
    node = client.metrics().nodes[server.location]
    assert node.pool.open == 0  # the threads are gone
    assert node.operations["get"].calls == 15  # their counts are not


def test_blocking_timeouts_errors_and_latency(server: MemcachedServer) -> None:
    client = BlockingClient(Cluster([server.location], ClientSettings(timeout=0.2)))
    client.timed = True
    assert run_blocking(client.set(b"k", b"v")) is True
    server.pause()
    try:
        with pytest.raises(OperationTimeoutError):
            client.get_now(b"k")
    finally:
        server.resume()
    assert client.get_now(b"k") is not None
    node = client.metrics().nodes[server.location]
    get = node.operations["get"]
    assert (get.calls, get.errors, get.timeouts) == (2, 1, 1)
    assert get.latency is not None
    assert get.latency.count == 1  # the reply that came
    assert node.pool.opened == 0  # the blocking client has no pool counters
    assert node.healthy  # the reply after the timeout


def test_node_signals_follow_a_memcached_that_stops_and_starts(server: MemcachedServer) -> None:
    cache = make_cache(server)
    seen: list[tuple[str, str, NodeEvent]] = []

    def unhealthy(sender: type, node: str, event: NodeEvent, **kwargs: Any) -> None:
        assert sender is FastCache
        seen.append(("unhealthy", node, event))

    def healthy(sender: type, node: str, event: NodeEvent, **kwargs: Any) -> None:
        seen.append(("healthy", node, event))

    signals.node_unhealthy.connect(unhealthy)
    signals.node_healthy.connect(healthy)
    try:
        cache.set("k", "v")
        server.kill()
        for _ in range(3):
            with pytest.raises(NetworkError):
                cache.get("k")
        assert [s[0] for s in seen] == ["unhealthy"]
        assert not cache.metrics()["blocking"].nodes[server.location].healthy
        assert not cache.metrics()["async"].nodes[server.location].healthy  # one health
        server.restart()
        assert cache.get("k") is None  # a fresh memcached answers (empty)
        assert [s[0] for s in seen] == ["unhealthy", "healthy"]
        assert all(node == server.location for _, node, _ in seen)
        assert isinstance(seen[0][2].error, NetworkError)
        # The async API reports through the same health: it fails, then recovers.
        server.kill()

        async def async_call() -> None:
            with pytest.raises(NetworkError):
                await cache.aget("k")

        asyncio.run(async_call())
        assert [s[0] for s in seen] == ["unhealthy", "healthy", "unhealthy"]
    finally:
        signals.node_unhealthy.disconnect(unhealthy)
        signals.node_healthy.disconnect(healthy)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_keeps_the_counts_and_counts_on_its_own(server: MemcachedServer) -> None:
    client = BlockingClient(Cluster([server.location], ClientSettings(timeout=2.0)))
    for _ in range(3):
        client.get_now(b"x")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            node = client.metrics().nodes[server.location]
            # The parent's connection is not the child's: counted, no longer open.
            inherited = (node.operations["get"].calls, node.pool.open)
            client.get_now(b"x")
            node = client.metrics().nodes[server.location]
            own = (node.operations["get"].calls, node.pool.open)
            code = 0 if (inherited, own) == ((3, 0), (4, 1)) else 2
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    node = client.metrics().nodes[server.location]
    assert (node.operations["get"].calls, node.pool.open) == (3, 1)  # the parent's own
    client.get_now(b"x")  # and its connection still works
