"""FastCache's async API against real memcached: every ``a*`` method, natively async.

Each test runs its coroutines on a fresh event loop (stock asyncio, and uvloop where it is
installed) and closes that loop's connections at the end. Tests over the ``cache`` and
``cluster_cache`` fixtures run twice: over memcached alone and with the disk tier behind it
(``tier_options``). The few that check how the memcached-only store uses the wire take the
``memcached_only_*`` fixtures, each next to a test of what the tiered store does instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest

from django_fastcache import compiled
from django_fastcache.backends import FastCache
from django_fastcache.client import Client
from django_fastcache.client.batching import GetBatcher
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.connection import Connection
from django_fastcache.protocol import ReplyKind
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import LANDING_WAIT, MEMCACHED_ONLY

#: For tests that watch the blocking client by patching its methods: compiled code calls
#: them directly, past the patch. The pure-Python run of the suite covers them.
watches_blocking_client_methods = pytest.mark.skipif(
    compiled.is_compiled("django_fastcache.client.blocking"),
    reason="patches blocking client methods, which compiled code calls directly",
)

if TYPE_CHECKING:
    from tests.conftest import MemcachedCluster

pytestmark = pytest.mark.integration

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
MISSING = object()


def arun(cache: FastCache, work: Callable[[], Awaitable[Any]], loop: str = "asyncio") -> Any:
    """Run ``work`` on a new event loop of the given kind, then close its connections."""

    async def main() -> Any:
        try:
            return await work()
        finally:
            await cache.client.aclose()

    if loop == "uvloop":
        import uvloop

        event_loop = uvloop.new_event_loop()
        try:
            return event_loop.run_until_complete(main())
        finally:
            event_loop.close()
    return asyncio.run(main())


def server_stats(server: MemcachedServer) -> dict[str, int]:
    family = socket.AF_UNIX if server.socket_path else socket.AF_INET
    address: Any = server.socket_path or (server.host, server.port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address)
        sock.sendall(b"stats\r\n")
        reply = b""
        while not reply.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            assert chunk
            reply += chunk
    values: dict[str, int] = {}
    for line in reply.decode().splitlines()[:-1]:
        _stat, name, value = line.split(" ", 2)
        with contextlib.suppress(ValueError):
            values[name] = int(value)
    return values


def remaining_ttl(server: MemcachedServer, key: str) -> int | None:
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"mg " + key.encode() + b" t\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(256)
    if reply == b"EN\r\n":
        return None
    return int(reply.split()[1][1:])


@pytest.fixture
def cache(memcached: MemcachedServer, tier_options: dict[str, Any]) -> FastCache:
    return FastCache(memcached.location, {"TIMEOUT": 300, "OPTIONS": tier_options})


@pytest.fixture
def cluster_cache(memcached_cluster: MemcachedCluster, tier_options: dict[str, Any]) -> FastCache:
    return FastCache(memcached_cluster.locations, {"TIMEOUT": 300, "OPTIONS": tier_options})


@pytest.fixture
def memcached_only_cache(memcached: MemcachedServer) -> FastCache:
    return FastCache(memcached.location, {"TIMEOUT": 300, "OPTIONS": MEMCACHED_ONLY})


@pytest.fixture
def memcached_only_cluster_cache(memcached_cluster: MemcachedCluster) -> FastCache:
    return FastCache(memcached_cluster.locations, {"TIMEOUT": 300, "OPTIONS": MEMCACHED_ONLY})


@pytest.fixture
def tiered_cache(memcached: MemcachedServer, disk_directory: str) -> FastCache:
    return FastCache(
        memcached.location, {"TIMEOUT": 300, "OPTIONS": {"disk_directory": disk_directory}}
    )


@pytest.fixture
def tiered_cluster_cache(memcached_cluster: MemcachedCluster, disk_directory: str) -> FastCache:
    return FastCache(
        memcached_cluster.locations, {"TIMEOUT": 300, "OPTIONS": {"disk_directory": disk_directory}}
    )


# -- every a* method, with its result ------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_get_set_add_delete(cache: FastCache, loop: str) -> None:
    async def work() -> None:
        assert await cache.aget("k") is None
        assert await cache.aget("k", "fallback") == "fallback"
        assert await cache.aset("k", {"v": [1, 2]}) is None
        assert await cache.aget("k") == {"v": [1, 2]}
        assert await cache.aadd("k", "other") is False
        assert await cache.aget("k") == {"v": [1, 2]}
        assert await cache.aadd("new", b"\x00raw") is True
        assert await cache.aget("new") == b"\x00raw"
        assert await cache.adelete("k") is True
        assert await cache.adelete("k") is False
        assert await cache.aget("k", MISSING) is MISSING
        await cache.aset("v", "two", version=2)
        assert await cache.aget("v") is None
        assert await cache.aget("v", version=2) == "two"

    arun(cache, work, loop)
    assert cache.get("new") == b"\x00raw"  # and the sync API sees what async wrote


@pytest.mark.parametrize("loop", LOOPS)
def test_many_operations(cluster_cache: FastCache, loop: str) -> None:
    cache = cluster_cache
    data = {f"key-{n}": n * 10 for n in range(50)}

    async def work() -> None:
        assert await cache.aset_many(data) == []
        assert await cache.aget_many(data) == data
        assert await cache.aget_many(k for k in ["key-1", "nope", "key-2"]) == {
            "key-1": 10,
            "key-2": 20,
        }
        assert await cache.aget_many([]) == {}
        assert await cache.adelete_many([f"key-{n}" for n in range(25)]) is None
        assert await cache.aget_many(data) == {f"key-{n}": n * 10 for n in range(25, 50)}
        assert await cache.aset_many({"a": 1}, timeout=0) == []
        assert await cache.aget("a") is None

    arun(cache, work, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_touch(cache: FastCache, memcached: MemcachedServer, loop: str) -> None:
    async def work() -> None:
        await cache.aset("k", 1, timeout=10)
        assert await cache.atouch("k", 700) is True
        assert await cache.atouch("missing", 700) is False

    arun(cache, work, loop)
    ttl = remaining_ttl(memcached, ":1:k")
    assert ttl is not None
    assert 690 <= ttl <= 700
    arun(cache, lambda: cache.atouch("k", None), loop)
    assert remaining_ttl(memcached, ":1:k") == -1
    assert arun(cache, lambda: cache.atouch("k", 0), loop) is True
    assert cache.get("k") is None


@pytest.mark.parametrize("loop", LOOPS)
def test_incr_decr(cache: FastCache, loop: str) -> None:
    async def work() -> None:
        await cache.aset("n", 5)
        assert await cache.aincr("n") == 6
        assert await cache.aincr("n", 10) == 16
        assert await cache.adecr("n") == 15
        assert await cache.adecr("n", 5) == 10
        assert await cache.aincr("n", -4) == 6
        assert await cache.adecr("n", -1) == 7
        assert await cache.aget("n") == 7
        with pytest.raises(ValueError, match="not found"):
            await cache.aincr("missing")
        with pytest.raises(ValueError, match="not found"):
            await cache.adecr("missing")

    arun(cache, work, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_has_key(cache: FastCache, loop: str) -> None:
    async def work() -> list[bool]:
        await cache.aset("present", 0)
        await cache.aset("none", None)
        return [
            await cache.ahas_key("present"),
            await cache.ahas_key("none"),
            await cache.ahas_key("absent"),
            await cache.ahas_key("present", version=2),
        ]

    assert arun(cache, work, loop) == [True, True, False, False]


@pytest.mark.parametrize("loop", LOOPS)
def test_clear_empties_every_node(cluster_cache: FastCache, loop: str) -> None:
    cache = cluster_cache
    keys = [f"k{n}" for n in range(40)]
    cache.set_many(dict.fromkeys(keys, 1))
    nodes = {cache.client.cluster.node_index(cache.wire_key(k)) for k in keys}
    assert len(nodes) == len(cache.client.addresses)  # the keys do reach every node

    async def work() -> Any:
        assert await cache.aget_many(keys) == dict.fromkeys(keys, 1)
        result = await cache.aclear()
        return result, await cache.aget_many(keys)

    assert arun(cache, work, loop) == (None, {})
    assert cache.get_many(keys) == {}


@pytest.mark.parametrize("loop", LOOPS)
def test_close_leaves_the_cache_usable(cache: FastCache, loop: str) -> None:
    async def work() -> None:
        await cache.aset("k", "v")
        assert await cache.aclose() is None
        assert await cache.aget("k") == "v"
        assert await cache.aclose() is None
        await cache.aset("k", "w")
        assert await cache.aget("k") == "w"

    arun(cache, work, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_get_or_set(cache: FastCache, loop: str) -> None:
    calls: list[int] = []

    def make() -> str:
        calls.append(1)
        return "made"

    async def work() -> None:
        assert await cache.aget_or_set("k", make) == "made"
        assert await cache.aget_or_set("k", make) == "made"
        assert await cache.aget_or_set("plain", "value", timeout=None) == "value"
        assert await cache.aget_or_set("plain", "other") == "value"
        assert await cache.aget_or_set("gone", "x", timeout=0) == "x"
        assert await cache.aget("gone") is None

    arun(cache, work, loop)
    assert calls == [1]
    assert cache.get("k") == "made"


@pytest.mark.parametrize("loop", LOOPS)
def test_incr_and_decr_version(cache: FastCache, loop: str) -> None:
    async def work() -> None:
        await cache.aset("k", "value")
        assert await cache.aincr_version("k") == 2
        assert await cache.aget("k") is None
        assert await cache.aget("k", version=2) == "value"
        assert await cache.aincr_version("k", delta=3, version=2) == 5
        assert await cache.aget("k", version=5) == "value"
        assert await cache.adecr_version("k", version=5) == 4
        assert await cache.aget("k", version=4) == "value"
        assert await cache.aget("k", version=5) is None
        assert await cache.adecr_version("k", delta=3, version=4) == 1
        assert await cache.aget("k") == "value"
        with pytest.raises(ValueError):
            await cache.aincr_version("missing")
        with pytest.raises(ValueError):
            await cache.adecr_version("missing")

    arun(cache, work, loop)


# -- aincr: TTL kept, atomic under concurrent callers, async and sync at once ------------


@pytest.mark.parametrize("timeout", [1000, None])
def test_aincr_keeps_the_ttl(cache: FastCache, memcached: MemcachedServer, timeout: Any) -> None:
    async def work() -> int:
        await cache.aset("n", 1, timeout=timeout)
        await cache.aincr("n", 5)
        return await cache.adecr("n", 2)

    assert arun(cache, work) == 4
    ttl = remaining_ttl(memcached, ":1:n")
    if timeout is None:
        assert ttl == -1
    else:
        assert ttl is not None
        assert 990 <= ttl <= 1000


def test_aincr_is_atomic_with_concurrent_tasks_and_threads(cache: FastCache) -> None:
    tasks, threads, per_thread = 200, 3, 100
    cache.set("n", 0, timeout=1000)
    go = threading.Event()
    from_threads: list[int] = []
    lock = threading.Lock()

    def sync_worker() -> None:
        go.wait(10)
        mine = [cache.incr("n") for _ in range(per_thread)]
        with lock:
            from_threads.extend(mine)

    workers = [threading.Thread(target=sync_worker) for _ in range(threads)]
    for worker in workers:
        worker.start()

    async def work() -> list[int]:
        go.set()
        return list(await asyncio.gather(*[cache.aincr("n") for _ in range(tasks)]))

    try:
        from_tasks = arun(cache, work)
    finally:
        go.set()
        for worker in workers:
            worker.join()
    total = tasks + threads * per_thread
    assert cache.get("n") == total
    # Every increment, sync or async, got a value no other increment got.
    assert sorted(from_tasks + from_threads) == list(range(1, total + 1))


# -- natively async: no thread hop, no sync_to_async ----------------------------------------


def every_method(cache: FastCache) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    return [
        ("aset", lambda: cache.aset("k", 1)),
        ("aget", lambda: cache.aget("k")),
        ("aadd", lambda: cache.aadd("a", 1)),
        ("atouch", lambda: cache.atouch("k", 100)),
        ("aincr", lambda: cache.aincr("k")),
        ("adecr", lambda: cache.adecr("k")),
        ("ahas_key", lambda: cache.ahas_key("k")),
        ("aset_many", lambda: cache.aset_many({"m1": 1, "m2": 2})),
        ("aget_many", lambda: cache.aget_many(["m1", "m2"])),
        ("adelete_many", lambda: cache.adelete_many(["m1", "m2"])),
        ("aget_or_set", lambda: cache.aget_or_set("g", 1)),
        ("aincr_version", lambda: cache.aincr_version("g")),
        ("adecr_version", lambda: cache.adecr_version("g", version=2)),
        ("adelete", lambda: cache.adelete("k")),
        ("aclear", lambda: cache.aclear()),
    ]


@pytest.fixture
def io_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    """Record (thread, running loop) for each of the async client's I/O primitives, and
    fail any use of sync_to_async or of an executor."""
    calls: list[tuple[int, Any]] = []
    # GetBatcher.submit: an autobatched get joining its node's batch (on the running loop).
    for owner, name in [
        *((Client, name) for name in ("_request", "_pipelines", "_send_noreply")),
        (GetBatcher, "submit"),
    ]:
        original = getattr(owner, name)

        def wrapped(self: Any, *args: Any, _original: Any = original) -> Any:
            calls.append((threading.get_ident(), asyncio.get_running_loop()))
            return _original(self, *args)

        monkeypatch.setattr(owner, name, wrapped)

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async API hopped to a thread")

    monkeypatch.setattr("asgiref.sync.sync_to_async", forbidden)
    monkeypatch.setattr("django.core.cache.backends.base.sync_to_async", forbidden)
    monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", forbidden)
    return calls


@pytest.mark.parametrize("loop", LOOPS)
def test_async_methods_run_on_the_callers_thread_and_loop(
    memcached_only_cache: FastCache, io_calls: list[tuple[int, Any]], loop: str
) -> None:
    # memcached alone: every method is its command(s) on the async client.
    cache = memcached_only_cache
    caller = threading.get_ident()

    async def work() -> None:
        running = asyncio.get_running_loop()
        for name, call in every_method(cache):
            before = len(io_calls)
            await call()
            assert len(io_calls) > before, f"{name} did no I/O through the async client"
            assert all(thread == caller for thread, _loop in io_calls[before:]), name
            assert all(used is running for _thread, used in io_calls[before:]), name
        await cache.aclose()

    arun(cache, work, loop)
    assert io_calls


@watches_blocking_client_methods
def test_async_methods_do_not_use_the_blocking_client(
    memcached_only_cache: FastCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memcached alone (the tiered store is checked by
    # test_tiered_async_methods_stay_on_the_callers_thread).
    cache = memcached_only_cache

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async API used the blocking client")

    monkeypatch.setattr(type(cache.blocking_client), "_exchange", forbidden)
    monkeypatch.setattr(type(cache.blocking_client), "_connection", forbidden)

    async def work() -> None:
        for _name, call in every_method(cache):
            await call()

    arun(cache, work)


@watches_blocking_client_methods
@pytest.mark.parametrize("loop", LOOPS)
def test_tiered_async_methods_stay_on_the_callers_thread(
    tiered_cache: FastCache,
    io_calls: list[tuple[int, Any]],
    monkeypatch: pytest.MonkeyPatch,
    loop: str,
) -> None:
    """With the disk tier, every round trip goes through the async client too (the disk
    copy is written behind, by a thread of its own, so nothing holds a disk lock across a
    round trip), on the caller's thread: nothing hops (``io_calls`` fails any sync_to_async
    or executor), and the async client only ever runs on the caller's loop."""
    cache = tiered_cache
    caller = threading.get_ident()
    blocking_calls: list[int] = []
    original = BlockingClient._connection

    # Every request of the blocking client starts by taking the thread's connection.
    def connection(self: BlockingClient, *args: Any, **kwargs: Any) -> Any:
        blocking_calls.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BlockingClient, "_connection", connection)

    async def work() -> None:
        running = asyncio.get_running_loop()
        for name, call in every_method(cache):
            before, blocking_before = len(io_calls), len(blocking_calls)
            await call()
            did_io = len(io_calls) > before or len(blocking_calls) > blocking_before
            assert did_io, f"{name} reached no memcached"
            assert all(thread == caller for thread, _loop in io_calls[before:]), name
            assert all(used is running for _thread, used in io_calls[before:]), name
            assert all(thread == caller for thread in blocking_calls[blocking_before:]), name
        await cache.aclose()

    arun(cache, work, loop)
    assert io_calls
    assert blocking_calls == []  # the blocking client is the sync API's alone


# -- one round trip per node ------------------------------------------------------------------


@pytest.fixture
def pipelines(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the pipelined writes each node receives from the async client."""
    writes: Counter[str] = Counter()
    original = Connection.request_many

    def request_many(self: Connection, *args: Any) -> Any:
        transport = self._transport  # type: ignore[attr-defined]
        name = transport.get_extra_info("peername") or transport.get_extra_info("sockname")
        writes[str(name)] += 1
        return original(self, *args)

    monkeypatch.setattr(Connection, "request_many", request_many)
    return writes


@pytest.mark.parametrize("count", [60, 1000])
def test_aget_many_makes_one_round_trip_per_node(
    cluster_cache: FastCache,
    memcached_cluster: MemcachedCluster,
    pipelines: Counter[str],
    count: int,
) -> None:
    cache = cluster_cache
    data = {f"item-{n}": n for n in range(count)}
    cache.set_many(data)
    cluster = cache.client.cluster
    per_node = Counter(cluster.node_index(cache.wire_key(key)) for key in data)
    assert len(per_node) == len(memcached_cluster.servers)  # every node holds some keys
    before = [server_stats(server) for server in memcached_cluster.servers]

    async def work() -> dict[Any, Any]:
        return await cache.aget_many([*data, "absent-1", "absent-2"])

    assert arun(cache, work) == data
    after = [server_stats(server) for server in memcached_cluster.servers]
    # One pipelined write per node, however many keys (and get lines) it holds.
    assert sorted(pipelines.values()) == [1] * len(memcached_cluster.servers)
    # Each node was asked for its own keys, each once.
    asked = [a["cmd_get"] - b["cmd_get"] for a, b in zip(after, before)]
    found = [a["get_hits"] - b["get_hits"] for a, b in zip(after, before)]
    assert sum(asked) == count + 2
    assert found == [per_node[node] for node in range(len(memcached_cluster.servers))]


def test_aset_many_and_adelete_many_make_one_round_trip_per_node(
    memcached_only_cluster_cache: FastCache,
    memcached_cluster: MemcachedCluster,
    pipelines: Counter[str],
) -> None:
    # memcached alone. With the disk tier, adelete_many deletes key by key under each key's
    # disk lock: see the next test.
    cache = memcached_only_cluster_cache
    data = {f"item-{n}": n for n in range(200)}
    nodes = len(memcached_cluster.servers)

    async def store() -> list[Any]:
        return await cache.aset_many(data)

    assert arun(cache, store) == []
    assert sorted(pipelines.values()) == [1] * nodes
    pipelines.clear()
    arun(cache, lambda: cache.adelete_many(data))
    assert sorted(pipelines.values()) == [1] * nodes
    assert cache.get_many(data) == {}


@watches_blocking_client_methods
def test_tiered_aset_many_is_one_round_trip_per_node_and_adelete_many_clears_both_tiers(
    tiered_cluster_cache: FastCache, memcached_cluster: MemcachedCluster, pipelines: Counter[str]
) -> None:
    cache = tiered_cluster_cache
    data = {f"item-{n}": n for n in range(200)}
    nodes = len(memcached_cluster.servers)
    disk = cache._shared().tiered
    assert disk is not None

    async def store() -> list[Any]:
        return await cache.aset_many(data)

    # With the disk tier too, one pipelined write per node on the async client; the disk
    # copies follow behind.
    assert arun(cache, store) == []
    assert sorted(pipelines.values()) == [1] * nodes
    assert disk.flush(LANDING_WAIT)
    assert all(disk.disk.get(cache.wire_key(key)) is not None for key in data)
    pipelines.clear()
    arun(cache, lambda: cache.adelete_many(data))
    assert sorted(pipelines.values()) == [1] * nodes
    assert disk.flush(LANDING_WAIT)
    assert all(disk.disk.get(cache.wire_key(key)) is None for key in data)
    assert cache.get_many(data) == {}


def test_aget_many_asks_the_nodes_at_once(
    cluster_cache: FastCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node requests overlap: every node's request is written before any reply is read."""
    cache = cluster_cache
    keys = [f"k{n}" for n in range(100)]
    cache.set_many(dict.fromkeys(keys, "v"))
    events: list[str] = []
    original_many = Connection.request_many
    original_received = Connection.data_received

    def request_many(self: Connection, *args: Any) -> Any:
        events.append("write")
        return original_many(self, *args)

    def data_received(self: Connection, data: bytes) -> None:
        events.append("read")
        original_received(self, data)

    monkeypatch.setattr(Connection, "request_many", request_many)
    monkeypatch.setattr(Connection, "data_received", data_received)

    async def work() -> dict[Any, Any]:
        await cache.aget("warm-up")  # connections are open before the measured call
        for node in range(len(cache.client.addresses)):
            await cache.client._request(node, b"version\r\n", ReplyKind.VERSION)
        events.clear()
        return await cache.aget_many(keys)

    assert arun(cache, work) == dict.fromkeys(keys, "v")
    nodes = len(cache.client.addresses)
    assert events[:nodes] == ["write"] * nodes
    assert events.count("write") == nodes
