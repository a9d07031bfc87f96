"""The Django cache contract FastCache must keep, point by point, against real memcached.

Each section is one point of "Django contract, the points most often gotten wrong" in the
design brief. Server-side facts (remaining TTLs, command counters, connections accepted)
are read over a separate raw socket with memcached's ``stats`` and meta ``mg`` commands.

The contract holds however FastCache stores: every test that takes ``tier_options`` (the
``cache`` fixture does) runs three times, over memcached alone, with the disk tier behind
it, and over memcached alone with ``stale_on_delete`` (deletes keep stale copies, which no
operation here may see).
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from django.core import checks
from django.core.cache import caches
from django.core.cache.backends.base import InvalidCacheKey
from django.core.signals import request_finished
from django.db import close_old_connections
from django.test import override_settings

from django_fastcache.backends import FastCache
from django_fastcache.errors import FastCacheError, InvalidArgumentError, ValueTooLargeError
from django_fastcache.testing.servers import MemcachedServer, free_port
from tests.conftest import MEMCACHED_ONLY

pytestmark = pytest.mark.integration

BACKEND = "django_fastcache.backends.FastCache"
DAY = 24 * 60 * 60
# memcached's clock ticks once a second and trails the wall clock, so an absolute expiry
# can read back a second or two longer than asked.
CLOCK_LAG = 5
MIB = 1024 * 1024
# Commands that would show in the server's counters had a request reached it.
COMMAND_COUNTERS = (
    "cmd_get",
    "cmd_set",
    "cmd_touch",
    "cmd_flush",
    "delete_hits",
    "delete_misses",
    "incr_hits",
    "incr_misses",
    "decr_hits",
    "decr_misses",
    "touch_hits",
    "touch_misses",
)
STATS_REQUEST = b"stats\r\n"


class Probe:
    """A raw text-protocol connection to one memcached, to look at it from outside."""

    def __init__(self, server: MemcachedServer) -> None:
        if server.socket_path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(server.socket_path)
        else:
            self.sock = socket.create_connection((server.host, server.port))
        self.sock.settimeout(5)
        self.buffer = b""

    def _until(self, ending: bytes) -> bytes:
        while ending not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "memcached closed the probe connection"
            self.buffer += chunk
        reply, _, self.buffer = self.buffer.partition(ending)
        return reply

    def stats(self) -> dict[str, int]:
        self.sock.sendall(STATS_REQUEST)
        lines = self._until(b"END\r\n").decode().splitlines()
        values: dict[str, int] = {}
        for line in lines:
            _stat, name, value = line.split(" ", 2)
            with contextlib.suppress(ValueError):
                values[name] = int(value)
        return values

    def ttl(self, key: str) -> int | None:
        """Seconds the item has left (-1: no expiry), or None when it is not there."""
        self.sock.sendall(b"mg " + key.encode() + b" t\r\n")
        line = self._until(b"\r\n")
        if line == b"EN":
            return None
        flag = line.split()[1]
        assert flag.startswith(b"t"), line
        return int(flag[1:])

    def close(self) -> None:
        self.sock.close()


def _finish_request() -> None:
    """Send request_finished as Django does after a response, without the database part.

    Django's own receiver that closes database connections is left out: these tests use
    no database, and pytest-django refuses database access outside marked tests."""
    request_finished.disconnect(close_old_connections)
    try:
        request_finished.send(sender=None)
    finally:
        request_finished.connect(close_old_connections)


@pytest.fixture
def probe(memcached: MemcachedServer) -> Iterator[Probe]:
    probe = Probe(memcached)
    yield probe
    probe.close()


@pytest.fixture(params=["memcached-only", "tiered", "stale-on-delete"])
def tier_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The conftest's two ways of storing, and a third: deletes keeping stale copies."""
    if request.param == "memcached-only":
        return dict(MEMCACHED_ONLY)
    if request.param == "stale-on-delete":
        return {**MEMCACHED_ONLY, "stale_on_delete": 60}
    return {"disk_directory": request.getfixturevalue("disk_directory")}


@pytest.fixture
def cache(memcached: MemcachedServer, tier_options: dict[str, Any]) -> FastCache:
    return FastCache(memcached.location, {"TIMEOUT": 300, "OPTIONS": tier_options})


def arun(cache: FastCache, work: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``work`` on a fresh event loop, then close that loop's connections."""

    async def main() -> Any:
        try:
            return await work()
        finally:
            await cache.client.aclose()

    return asyncio.run(main())


@contextlib.contextmanager
def nothing_reaches(probe: Probe) -> Iterator[None]:
    """Assert that not one byte but the probe's own ``stats`` reached the server."""
    before = probe.stats()
    yield
    after = probe.stats()
    assert after["bytes_read"] - before["bytes_read"] == len(STATS_REQUEST)
    for name in COMMAND_COUNTERS:
        assert after[name] == before[name], name


class Unpicklable:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("this object refuses to be pickled")


# -- 1. instances per thread and task share process-global clients; close() keeps them -----


def test_close_keeps_the_sync_connection(cache: FastCache, probe: Probe) -> None:
    cache.set("k", "v")
    connection = cache.blocking_client._local.by_node[0]
    accepted = probe.stats()["total_connections"]
    cache.close()
    _finish_request()
    assert cache.get("k") == "v"
    assert cache.blocking_client._local.by_node[0] is connection
    assert probe.stats()["total_connections"] == accepted


def test_close_keeps_the_async_pool(cache: FastCache, probe: Probe) -> None:
    node = cache.client.addresses[0].node_id

    async def work() -> None:
        await cache.aset("k", "v")
        # A read opens the async pool in both modes (with the disk tier, writes go through
        # the blocking client under the key's disk lock).
        assert await cache.aget("k") == "v"
        before = cache.client.pool_metrics()[node]
        accepted = probe.stats()["total_connections"]
        await cache.aclose()
        cache.close()
        assert await cache.aget("k") == "v"
        after = cache.client.pool_metrics()[node]
        assert after["opened"] == before["opened"]
        assert after["closed"] == before["closed"]
        assert after["open"] >= 1
        assert probe.stats()["total_connections"] == accepted

    arun(cache, work)


def test_instances_per_thread_share_one_client(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    settings = {
        "default": {"BACKEND": BACKEND, "LOCATION": memcached.location, "OPTIONS": tier_options}
    }
    with override_settings(CACHES=settings):
        found: list[FastCache] = []

        def use() -> None:
            instance = caches["default"]
            instance.set(f"from-{threading.get_ident()}", 1)
            found.append(instance)

        threads = [threading.Thread(target=use) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found.append(caches["default"])
        assert len({id(instance) for instance in found}) == len(found)  # one per thread
        assert len({id(instance.client) for instance in found}) == 1
        assert len({id(instance.blocking_client) for instance in found}) == 1
        _finish_request()  # Django closes every cache after a request
        assert found[-1].get("missing", "default") == "default"


def test_instances_per_task_share_one_client(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    settings = {
        "default": {"BACKEND": BACKEND, "LOCATION": memcached.location, "OPTIONS": tier_options}
    }
    with override_settings(CACHES=settings):

        async def task(n: int) -> FastCache:
            instance = caches["default"]
            await instance.aset(f"task-{n}", n)
            assert await instance.aget(f"task-{n}") == n
            await instance.aclose()
            return instance

        async def work() -> list[FastCache]:
            return list(await asyncio.gather(*[task(n) for n in range(4)]))

        instances = arun(caches["default"], work)
        assert len({id(instance.client) for instance in instances}) == 1
        assert caches["default"].get_many([f"task-{n}" for n in range(4)]) == {
            f"task-{n}": n for n in range(4)
        }


def test_clients_are_shared_by_configuration(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    first = FastCache(memcached.location, {"OPTIONS": tier_options})
    second = FastCache(
        [memcached.location], {"KEY_PREFIX": "other", "TIMEOUT": 5, "OPTIONS": dict(tier_options)}
    )
    different = FastCache(
        memcached.location, {"OPTIONS": {**tier_options, "operation_timeout": 2.5}}
    )
    assert first.client is second.client
    assert first.blocking_client is second.blocking_client
    assert first._store is second._store
    assert different.client is not first.client


# -- 2. incr/decr: atomic on the server, keep the TTL, missing key -> ValueError -----------


def test_incr_and_decr_keep_the_ttl(cache: FastCache, probe: Probe) -> None:
    cache.set("n", 10, timeout=1000)
    assert cache.incr("n") == 11
    assert cache.incr("n", 5) == 16
    assert cache.decr("n", 4) == 12
    assert cache.incr("n", -2) == 10
    assert cache.decr("n", -3) == 13
    ttl = probe.ttl(":1:n")
    assert ttl is not None
    assert 990 <= ttl <= 1000
    assert cache.get("n") == 13
    assert type(cache.get("n")) is int


def test_incr_keeps_no_expiry(cache: FastCache, probe: Probe) -> None:
    cache.set("n", 1, timeout=None)
    assert cache.incr("n", 41) == 42
    assert probe.ttl(":1:n") == -1


def test_async_incr_and_decr_keep_the_ttl(cache: FastCache, probe: Probe) -> None:
    async def work() -> None:
        await cache.aset("n", 7, timeout=2000)
        assert await cache.aincr("n", 3) == 10
        assert await cache.adecr("n") == 9

    arun(cache, work)
    ttl = probe.ttl(":1:n")
    assert ttl is not None
    assert 1990 <= ttl <= 2000


def test_incr_respects_versions(cache: FastCache) -> None:
    cache.set("n", 1, version=2)
    assert cache.incr("n", version=2) == 2
    with pytest.raises(ValueError):
        cache.incr("n")
    assert cache.get("n", version=2) == 2


def test_decr_stops_at_zero(cache: FastCache) -> None:
    cache.set("n", 3)
    assert cache.decr("n", 10) == 0
    assert cache.get("n") == 0


@pytest.mark.parametrize("operation", ["incr", "decr"])
def test_incr_decr_of_a_missing_key_raise_value_error(cache: FastCache, operation: str) -> None:
    with pytest.raises(ValueError, match="not found"):
        getattr(cache, operation)("missing")
    assert cache.get("missing", "absent") == "absent"  # not created either


@pytest.mark.parametrize("operation", ["aincr", "adecr"])
def test_async_incr_decr_of_a_missing_key_raise_value_error(
    cache: FastCache, operation: str
) -> None:
    async def work() -> None:
        with pytest.raises(ValueError, match="not found"):
            await getattr(cache, operation)("missing", 2)
        assert await cache.aget("missing", "absent") == "absent"

    arun(cache, work)


BAD_DELTAS = ["1", None, True, 1.5, float("nan"), 2**64, -(2**64)]


@pytest.mark.parametrize("delta", BAD_DELTAS)
@pytest.mark.parametrize("operation", ["incr", "decr", "aincr", "adecr"])
def test_a_delta_that_is_not_an_int_memcached_counts_by_is_refused_alike(
    cache: FastCache, operation: str, delta: Any
) -> None:
    # The same typed error with the tier on or off, sync or async, and the count untouched.
    cache.set("n", 5)
    method = getattr(cache, operation)
    if operation.startswith("a"):
        call: Callable[[], Any] = lambda: arun(cache, lambda: method("n", delta))  # noqa: E731
    else:
        call = lambda: method("n", delta)  # noqa: E731
    with pytest.raises(InvalidArgumentError, match="delta must be"):
        call()
    assert cache.get("n") == 5


@pytest.mark.parametrize("delta", [2**64, -(2**64), "1"])
@pytest.mark.parametrize("operation", ["incr", "aincr"])
def test_a_bad_delta_on_a_missing_key_is_refused_before_any_request(
    cache: FastCache, operation: str, delta: Any
) -> None:
    # Not "not found" (a store may ask memcached about the key before it counts): the
    # delta is refused first, whatever the key.
    method = getattr(cache, operation)
    if operation.startswith("a"):
        call: Callable[[], Any] = lambda: arun(cache, lambda: method("missing", delta))  # noqa: E731
    else:
        call = lambda: method("missing", delta)  # noqa: E731

    def requests() -> int:
        metrics = cache.metrics()
        return sum(
            stats.calls
            for snapshot in (metrics["blocking"], metrics["async"])
            for node in snapshot.nodes.values()
            for stats in node.operations.values()
        )

    before = requests()
    with pytest.raises(InvalidArgumentError, match="delta must be"):
        call()
    assert requests() == before


@pytest.mark.parametrize("timeout", ["5", float("nan"), [1], b"5"])
@pytest.mark.parametrize("operation", ["set", "add", "touch", "set_many", "aset", "atouch"])
def test_a_timeout_that_is_not_a_number_is_refused(
    cache: FastCache, operation: str, timeout: Any
) -> None:
    cache.set("k", "old")
    calls: dict[str, Callable[[], Any]] = {
        "set": lambda: cache.set("k", "new", timeout),
        "add": lambda: cache.add("other", "new", timeout),
        "touch": lambda: cache.touch("k", timeout),
        "set_many": lambda: cache.set_many({"k": "new"}, timeout),
        "aset": lambda: arun(cache, lambda: cache.aset("k", "new", timeout)),
        "atouch": lambda: arun(cache, lambda: cache.atouch("k", timeout)),
    }
    with pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds"):
        calls[operation]()
    assert cache.get("k") == "old"
    assert cache.get("other") is None


def test_incr_is_atomic_across_threads(cache: FastCache) -> None:
    cache.set("n", 0)
    threads, per_thread = 6, 150
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [cache.incr("n") for _ in range(per_thread)]
        with lock:
            seen.extend(mine)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = threads * per_thread
    assert cache.get("n") == total
    # Each increment saw its own result: no two callers read the same value.
    assert sorted(seen) == list(range(1, total + 1))


# -- 3. timeouts ---------------------------------------------------------------------------


def test_timeout_none_never_expires(cache: FastCache, probe: Probe) -> None:
    cache.set("k", "v", timeout=None)
    assert probe.ttl(":1:k") == -1
    assert cache.get("k") == "v"


def test_default_timeout_comes_from_settings(
    memcached: MemcachedServer, probe: Probe, tier_options: dict[str, Any]
) -> None:
    FastCache(memcached.location, {"TIMEOUT": 1000, "OPTIONS": tier_options}).set("a", 1)
    FastCache(memcached.location, {"TIMEOUT": None, "OPTIONS": tier_options}).set("b", 1)
    ttl = probe.ttl(":1:a")
    assert ttl is not None
    assert 995 <= ttl <= 1000
    assert probe.ttl(":1:b") == -1


@pytest.mark.parametrize("timeout", [0, -1, -100, 0.0, -0.5])
def test_zero_and_negative_timeouts_expire_at_once(
    cache: FastCache, probe: Probe, timeout: float
) -> None:
    cache.set("old", "previous value")
    cache.set("old", "new value", timeout=timeout)
    assert cache.get("old") is None
    assert probe.ttl(":1:old") is None
    cache.set("fresh", "v", timeout=timeout)
    assert not cache.has_key("fresh")


@pytest.mark.parametrize("timeout", [0, -1])
def test_add_with_zero_timeout_returns_true(cache: FastCache, timeout: int) -> None:
    result = cache.add("k", "v", timeout=timeout)
    assert result is True
    assert cache.get("k") is None


def test_async_zero_timeout_expires_and_add_returns_true(cache: FastCache) -> None:
    async def work() -> None:
        await cache.aset("k", "v")
        await cache.aset("k", "w", timeout=0)
        assert await cache.aget("k") is None
        assert await cache.aadd("k", "v", timeout=0) is True
        assert await cache.aget("k") is None

    arun(cache, work)


@pytest.mark.parametrize("days", [31, 90, 365])
def test_timeouts_over_30_days_keep_their_length(cache: FastCache, probe: Probe, days: int) -> None:
    cache.set("k", "v", timeout=days * DAY)
    assert cache.get("k") == "v"
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert days * DAY - 60 <= ttl <= days * DAY + CLOCK_LAG


def test_timeout_of_exactly_30_days_is_relative(cache: FastCache, probe: Probe) -> None:
    cache.set("k", "v", timeout=30 * DAY)
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert 30 * DAY - 60 <= ttl <= 30 * DAY


@pytest.mark.parametrize("timeout", [100 * 365 * DAY, 10.0**20, float("inf"), 10**400])
def test_timeout_beyond_memcached_clock_is_kept_as_long_as_possible(
    cache: FastCache, probe: Probe, timeout: float
) -> None:
    cache.set("k", "v", timeout=timeout)
    assert cache.get("k") == "v"
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert ttl >= 2**31 - 1 - int(time.time()) - 60


def test_async_timeout_over_30_days(cache: FastCache, probe: Probe) -> None:
    arun(cache, lambda: cache.aset("k", "v", timeout=40 * DAY))
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert 40 * DAY - 60 <= ttl <= 40 * DAY + CLOCK_LAG


@pytest.mark.parametrize(("timeout", "seconds"), [(0.5, 1), (0.001, 1), (1.5, 2), (99.2, 100)])
def test_float_timeouts_round_up(cache: FastCache, timeout: float, seconds: int) -> None:
    assert cache.get_backend_timeout(timeout) == seconds


def test_float_timeouts_are_accepted(cache: FastCache, probe: Probe) -> None:
    cache.set("short", "v", timeout=2.5)
    assert cache.get("short") == "v"
    cache.set("k", "v", timeout=600.25)
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert 595 <= ttl <= 601
    assert cache.add("a", 1, timeout=1.5) is True
    assert cache.touch("k", 300.5) is True
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert 295 <= ttl <= 301


def test_touch_sets_the_ttl(cache: FastCache, probe: Probe) -> None:
    cache.set("k", "v", timeout=10)
    assert cache.touch("k", 500) is True
    ttl = probe.ttl(":1:k")
    assert ttl is not None
    assert 495 <= ttl <= 500
    assert cache.touch("k", None) is True
    assert probe.ttl(":1:k") == -1
    assert cache.touch("k", 0) is True
    assert cache.get("k") is None


# -- 4. results: None is a hit, iterators, failed keys, bools, None --------------------------

MISSING = object()


def test_a_stored_none_is_a_hit(cache: FastCache) -> None:
    cache.set("k", None)
    assert cache.get("k", MISSING) is None
    assert cache.has_key("k") is True
    assert "k" in cache
    assert cache.get_many(["k", "absent"]) == {"k": None}
    assert cache.get_or_set("k", "other") is None
    assert cache.add("k", "other") is False
    assert cache.get("absent", MISSING) is MISSING
    assert cache.has_key("absent") is False


def test_async_stored_none_is_a_hit(cache: FastCache) -> None:
    async def work() -> None:
        await cache.aset("k", None)
        assert await cache.aget("k", MISSING) is None
        assert await cache.ahas_key("k") is True
        assert await cache.aget_many(["k"]) == {"k": None}
        assert await cache.aget_or_set("k", "other") is None
        assert await cache.aget("absent", MISSING) is MISSING

    arun(cache, work)


def test_get_many_takes_an_iterator_and_returns_found_keys(cache: FastCache) -> None:
    cache.set_many({"a": 1, "b": "two", 3: [3]})
    keys = (key for key in ["a", "missing", "b", 3, "also-missing"])
    assert cache.get_many(keys) == {"a": 1, "b": "two", 3: [3]}
    assert cache.get_many(iter([])) == {}
    assert cache.get_many(key for key in ["missing"]) == {}


def test_async_get_many_takes_an_iterator(cache: FastCache) -> None:
    async def work() -> None:
        await cache.aset_many({"a": 1, "b": 2})
        found = await cache.aget_many(key for key in ["a", "x", "b"])
        assert found == {"a": 1, "b": 2}

    arun(cache, work)


def test_set_many_returns_the_original_keys_that_failed(cache: FastCache) -> None:
    cache.set_many({"small": "old", 7: "old", "refused": "old"})
    data = {
        "small": "new",
        7: b"x" * (MIB + 1),  # over max_value_size: never sent
        "refused": b"y" * (MIB - 16),  # under max_value_size, over memcached's item limit
        "other": 1,
    }
    failed = cache.set_many(data)
    assert sorted(map(str, failed)) == ["7", "refused"]
    assert 7 in failed
    assert cache.get_many(["small", 7, "refused", "other"]) == {"small": "new", "other": 1}


def test_set_many_returns_an_empty_list_when_all_are_stored(cache: FastCache) -> None:
    assert cache.set_many({"a": 1, "b": 2}) == []
    assert cache.set_many({}) == []
    assert cache.get_many(["a", "b"]) == {"a": 1, "b": 2}


def test_async_set_many_returns_failed_keys(cache: FastCache) -> None:
    async def work() -> None:
        await cache.aset("big", "old")
        failed = await cache.aset_many({"ok": 1, "big": b"z" * (2 * MIB)})
        assert failed == ["big"]
        assert await cache.aget_many(["ok", "big"]) == {"ok": 1}

    arun(cache, work)


def test_add_delete_touch_return_real_bools(cache: FastCache) -> None:
    results = [
        cache.add("k", 1),
        cache.add("k", 2),
        cache.touch("k", 100),
        cache.touch("absent", 100),
        cache.delete("k"),
        cache.delete("k"),
    ]
    assert results == [True, False, True, False, True, False]
    assert all(type(result) is bool for result in results)


def test_async_add_delete_touch_return_real_bools(cache: FastCache) -> None:
    async def work() -> list[Any]:
        return [
            await cache.aadd("k", 1),
            await cache.aadd("k", 2),
            await cache.atouch("k", 100),
            await cache.atouch("absent", 100),
            await cache.adelete("k"),
            await cache.adelete("k"),
        ]

    results = arun(cache, work)
    assert results == [True, False, True, False, True, False]
    assert all(type(result) is bool for result in results)


def test_delete_many_returns_none(cache: FastCache) -> None:
    cache.set_many({"a": 1, "b": 2, "c": 3})
    assert cache.delete_many(key for key in ["a", "b", "missing"]) is None
    assert cache.get_many(["a", "b", "c"]) == {"c": 3}
    assert cache.delete_many([]) is None

    async def work() -> None:
        assert await cache.adelete_many(["c", "gone"]) is None
        assert await cache.aget("c") is None

    arun(cache, work)


# -- 5. invalid keys ----------------------------------------------------------------------

CHARACTER_MESSAGE = "Cache key contains characters that will cause errors if used with memcached: "
LENGTH_MESSAGE = "Cache key will cause errors if used with memcached: "

BAD_CHARACTER_KEYS = [
    "with space",
    "carriage\rreturn",
    "line\nfeed",
    "crlf\r\nget other",
    "tab\there",
    "nul\x00byte",
    "bell\x07",
    "unit\x1fseparator",
    "del\x7f",
]
# Made keys are ":1:" + key: 3 bytes more than the key.
TOO_LONG_KEYS = [
    "a" * 248,  # 251 bytes
    "é" * 124,  # 127 characters, 251 bytes
    "é" * 200,  # 200 characters, 403 bytes
    "日本" * 42,  # 84 characters, 255 bytes
]


def expected_message(made: str) -> str:
    if len(made.encode()) > 250:
        return f"{LENGTH_MESSAGE}{made!r} (longer than 250)"
    return f"{CHARACTER_MESSAGE}{made!r}"


def sync_operations(cache: FastCache) -> dict[str, Callable[[str], Any]]:
    return {
        "get": lambda key: cache.get(key),
        "set": lambda key: cache.set(key, 1),
        "add": lambda key: cache.add(key, 1),
        "touch": lambda key: cache.touch(key),
        "delete": lambda key: cache.delete(key),
        "get_many": lambda key: cache.get_many(["fine", key]),
        "set_many": lambda key: cache.set_many({"fine": 1, key: 2}),
        "delete_many": lambda key: cache.delete_many(["fine", key]),
        "incr": lambda key: cache.incr(key),
        "decr": lambda key: cache.decr(key),
        "has_key": lambda key: cache.has_key(key),
        "contains": lambda key: key in cache,
        "get_or_set": lambda key: cache.get_or_set(key, 1),
        "incr_version": lambda key: cache.incr_version(key),
        "decr_version": lambda key: cache.decr_version(key, version=2),
    }


def async_operations(cache: FastCache) -> dict[str, Callable[[str], Awaitable[Any]]]:
    return {
        "aget": lambda key: cache.aget(key),
        "aset": lambda key: cache.aset(key, 1),
        "aadd": lambda key: cache.aadd(key, 1),
        "atouch": lambda key: cache.atouch(key),
        "adelete": lambda key: cache.adelete(key),
        "aget_many": lambda key: cache.aget_many(["fine", key]),
        "aset_many": lambda key: cache.aset_many({"fine": 1, key: 2}),
        "adelete_many": lambda key: cache.adelete_many(["fine", key]),
        "aincr": lambda key: cache.aincr(key),
        "adecr": lambda key: cache.adecr(key),
        "ahas_key": lambda key: cache.ahas_key(key),
        "aget_or_set": lambda key: cache.aget_or_set(key, 1),
        "aincr_version": lambda key: cache.aincr_version(key),
        "adecr_version": lambda key: cache.adecr_version(key, version=2),
    }


SYNC_NAMES = list(sync_operations(FastCache("127.0.0.1:9", {})))
ASYNC_NAMES = list(async_operations(FastCache("127.0.0.1:9", {})))
REPRESENTATIVE_KEYS = ["with space", "crlf\r\nget other", "nul\x00byte", "é" * 124]


@pytest.mark.parametrize("key", REPRESENTATIVE_KEYS)
@pytest.mark.parametrize("name", SYNC_NAMES)
def test_invalid_keys_raise_for_every_sync_operation(
    cache: FastCache, probe: Probe, name: str, key: str
) -> None:
    cache.set("fine", "v")  # so that the key-version operations get that far
    operation = sync_operations(cache)[name]
    version = 2 if name == "decr_version" else 1
    with nothing_reaches(probe), pytest.raises(InvalidCacheKey) as caught:
        operation(key)
    assert str(caught.value) == expected_message(f":{version}:{key}")
    assert cache.get("fine") == "v"


@pytest.mark.parametrize("key", REPRESENTATIVE_KEYS)
@pytest.mark.parametrize("name", ASYNC_NAMES)
def test_invalid_keys_raise_for_every_async_operation(
    cache: FastCache, probe: Probe, name: str, key: str
) -> None:
    cache.set("fine", "v")
    version = 2 if name == "adecr_version" else 1

    async def work() -> None:
        operation = async_operations(cache)[name]
        with nothing_reaches(probe), pytest.raises(InvalidCacheKey) as caught:
            await operation(key)
        assert str(caught.value) == expected_message(f":{version}:{key}")

    arun(cache, work)
    assert cache.get("fine") == "v"


@pytest.mark.parametrize("key", BAD_CHARACTER_KEYS + TOO_LONG_KEYS)
def test_every_kind_of_invalid_key_is_refused(cache: FastCache, probe: Probe, key: str) -> None:
    with nothing_reaches(probe):
        for operation in (cache.get, cache.delete, lambda k: cache.set(k, 1)):
            with pytest.raises(InvalidCacheKey) as caught:
                operation(key)
            assert str(caught.value) == expected_message(f":1:{key}")


def test_key_length_is_measured_in_bytes_after_prefix_and_version(
    memcached: MemcachedServer, probe: Probe, tier_options: dict[str, Any]
) -> None:
    cache = FastCache(memcached.location, {"KEY_PREFIX": "site", "OPTIONS": tier_options})
    longest = "a" * (250 - len("site:1:"))
    cache.set(longest, 1)
    assert cache.get(longest) == 1
    assert probe.ttl(f"site:1:{longest}") is not None
    with nothing_reaches(probe), pytest.raises(InvalidCacheKey) as caught:
        cache.set(longest + "a", 1)
    assert str(caught.value) == expected_message(f"site:1:{longest}a")
    # 123 two-byte characters: 246 + 7 bytes, over the limit at 130 characters.
    with nothing_reaches(probe), pytest.raises(InvalidCacheKey):
        cache.get("é" * 123)
    cache.set("é" * 121, 2)  # 242 + 7 = 249 bytes
    assert cache.get("é" * 121) == 2
    with nothing_reaches(probe), pytest.raises(InvalidCacheKey):
        cache.get("a", version=10**250)


@pytest.mark.parametrize("key", ["lone\ud800surrogate", "\udfff"])
def test_keys_without_a_utf8_form_are_invalid(cache: FastCache, probe: Probe, key: str) -> None:
    with nothing_reaches(probe):
        for operation in (cache.get, cache.delete, lambda k: cache.set(k, 1), cache.has_key):
            with pytest.raises(InvalidCacheKey) as caught:
                operation(key)
            assert str(caught.value) == f"{CHARACTER_MESSAGE}{':1:' + key!r}"
        with pytest.raises(InvalidCacheKey):
            cache.validate_key(":1:" + key)
        with pytest.raises(InvalidCacheKey):
            arun(cache, lambda: cache.aget(key))


def test_valid_unicode_keys_work(cache: FastCache) -> None:
    keys = ["ключ", "日本語", "émoji-🙂", "a" * 247]
    cache.set_many({key: key for key in keys})
    assert cache.get_many(keys) == {key: key for key in keys}


def test_validate_key_uses_django_messages(cache: FastCache) -> None:
    with pytest.raises(InvalidCacheKey, match="contains characters"):
        cache.validate_key(":1:bad key")
    with pytest.raises(InvalidCacheKey, match=r"\(longer than 250\)"):
        cache.validate_key(":1:" + "é" * 124)
    cache.validate_key(":1:" + "a" * 247)


def test_hash_invalid_keys_makes_them_work(
    memcached: MemcachedServer, probe: Probe, tier_options: dict[str, Any]
) -> None:
    cache = FastCache(memcached.location, {"OPTIONS": {**tier_options, "hash_invalid_keys": True}})
    keys = [*BAD_CHARACTER_KEYS, *TOO_LONG_KEYS, "é" * 125, "\ud800", "\udc00"]
    cache.set_many({key: index for index, key in enumerate(keys)})
    assert cache.get_many(keys) == {key: index for index, key in enumerate(keys)}
    assert cache.incr("with space", 10) == 10
    assert cache.add("line\nfeed", "x") is False
    assert cache.touch("tab\there", 100) is True
    assert cache.delete("a" * 248) is True
    assert cache.get("a" * 248) is None
    assert cache.get("with space", version=2) is None  # the version is part of the digest
    cache.validate_key("any key\r\n" * 100)
    # A valid key is sent as it is.
    cache.set("plain", 1)
    assert probe.ttl(":1:plain") is not None

    async def work() -> None:
        assert await cache.aget("del\x7f") == keys.index("del\x7f")
        await cache.aset("é" * 200, "async")
        assert await cache.aget("é" * 200) == "async"

    arun(cache, work)


# -- 6. a failed set removes the old value ------------------------------------------------


def test_set_too_large_for_max_value_size_removes_the_old_value(cache: FastCache) -> None:
    cache.set("k", "old")
    with pytest.raises(ValueTooLargeError):
        cache.set("k", b"x" * (MIB + 1))
    assert cache.get("k", MISSING) is MISSING


def test_set_refused_by_the_server_removes_the_old_value(cache: FastCache) -> None:
    cache.set("k", "old")
    with pytest.raises(ValueTooLargeError):
        cache.set("k", b"x" * (MIB - 16))  # within max_value_size, not within memcached's
    assert cache.get("k", MISSING) is MISSING
    cache.set("k", "again")  # the connection is still in step
    assert cache.get("k") == "again"


def test_set_over_a_small_max_value_size_removes_the_old_value(
    memcached: MemcachedServer, probe: Probe, tier_options: dict[str, Any]
) -> None:
    cache = FastCache(memcached.location, {"OPTIONS": {**tier_options, "max_value_size": 100}})
    cache.set("k", "old")
    sets = probe.stats()["cmd_set"]
    with pytest.raises(ValueTooLargeError):
        cache.set("k", "z" * 101)
    assert probe.stats()["cmd_set"] == sets  # refused before sending
    assert cache.get("k") is None
    cache.set("k", "z" * 100)
    assert cache.get("k") == "z" * 100


def test_async_failed_set_removes_the_old_value(cache: FastCache) -> None:
    async def work() -> None:
        await cache.aset("a", "old")
        await cache.aset("b", "old")
        with pytest.raises(ValueTooLargeError):
            await cache.aset("a", b"x" * (2 * MIB))
        with pytest.raises(ValueTooLargeError):
            await cache.aset("b", b"x" * (MIB - 16))
        assert await cache.aget_many(["a", "b"]) == {}
        await cache.aset("b", "fine")
        assert await cache.aget("b") == "fine"

    arun(cache, work)


# -- 7. unpicklable values raise pickle.PickleError and store nothing ---------------------


@pytest.mark.parametrize(
    "operation",
    [
        lambda cache: cache.set("k", Unpicklable()),
        lambda cache: cache.add("k", Unpicklable()),
        lambda cache: cache.set_many({"a": 1, "k": Unpicklable(), "z": 2}),
        lambda cache: cache.get_or_set("k", Unpicklable),
        lambda cache: cache.set("k", [1, {"nested": Unpicklable()}]),
    ],
)
def test_unpicklable_values_raise_and_store_nothing(
    cache: FastCache, probe: Probe, operation: Callable[[FastCache], Any]
) -> None:
    sets = probe.stats()["cmd_set"]
    with pytest.raises(pickle.PickleError):
        operation(cache)
    assert probe.stats()["cmd_set"] == sets
    assert cache.get_many(["a", "k", "z"]) == {}


def test_async_unpicklable_values_raise_and_store_nothing(cache: FastCache, probe: Probe) -> None:
    sets = probe.stats()["cmd_set"]

    async def work() -> None:
        with pytest.raises(pickle.PickleError):
            await cache.aset("k", Unpicklable())
        with pytest.raises(pickle.PickleError):
            await cache.aadd("k", Unpicklable())
        with pytest.raises(pickle.PickleError):
            await cache.aset_many({"a": 1, "k": Unpicklable()})

    arun(cache, work)
    assert probe.stats()["cmd_set"] == sets
    assert cache.get_many(["a", "k"]) == {}


# -- 8. __init__ does no I/O ------------------------------------------------------------------


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise AssertionError(f"connection attempted to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_construction_does_no_io(no_connections: list[Any]) -> None:
    down = f"127.0.0.1:{free_port()}"
    FastCache(down, {})
    FastCache([down, "unix:/nonexistent/memcached.sock"], {"OPTIONS": {"min_connections": 2}})
    settings = {
        "default": {"BACKEND": BACKEND, "LOCATION": down},
        "bad": {"BACKEND": BACKEND, "LOCATION": "not-a-port:x", "OPTIONS": {"bogus": 1}},
    }
    with override_settings(CACHES=settings):
        assert isinstance(caches["default"], FastCache)
        assert isinstance(caches["bad"], FastCache)
        messages = checks.run_checks(tags=[checks.Tags.caches])  # builds every alias
    assert {message.id for message in messages} == {
        "django_fastcache.E001",
        "django_fastcache.E012",
    }
    assert no_connections == []


def test_first_use_of_an_unreachable_server_raises_a_fastcache_error() -> None:
    # memcached alone: there is nothing else to answer, so the failure is the caller's.
    # (With the disk tier, the default, the tier answers instead: see the next test.)
    cache = FastCache(
        f"127.0.0.1:{free_port()}", {"OPTIONS": {**MEMCACHED_ONLY, "connect_timeout": 2}}
    )
    with pytest.raises(FastCacheError):
        cache.get("k")
    with pytest.raises(FastCacheError):
        cache.set("k", 1)

    async def work() -> None:
        with pytest.raises(FastCacheError):
            await cache.aget("k")

    arun(cache, work)


def test_first_use_of_an_unreachable_server_with_the_disk_tier_is_answered_from_disk(
    disk_directory: str,
) -> None:
    # Tiered behaviour: the unreachable node is marked out on the first failure and the
    # disk tier answers, reads and writes alike; nothing is raised to the caller.
    location = f"127.0.0.1:{free_port()}"
    cache = FastCache(
        location, {"OPTIONS": {"disk_directory": disk_directory, "connect_timeout": 2}}
    )
    assert cache.get("k", "default") == "default"
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["nodes"][location]["state"] == "out"
    cache.set("k", 1)
    assert cache.get("k") == 1
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["nodes"][location]["journal_length"] == 1  # to replay when it is back

    async def work() -> None:
        assert await cache.aget("k") == 1
        await cache.aset("k", 2)
        assert await cache.aget("k") == 2

    arun(cache, work)
    assert cache.get("k") == 2


def test_first_use_of_a_malformed_address_raises_a_fastcache_error() -> None:
    cache = FastCache("127.0.0.1:notaport", {})
    with pytest.raises(FastCacheError):
        cache.get("k")
