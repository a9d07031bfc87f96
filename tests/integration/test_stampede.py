"""get_or_set's stampede protection against real memcached: leases, their release, stale
values, the protocol option (and a fake server without meta), and stubs never surfacing
through the classic commands. Every test that takes ``tier_options`` runs over memcached
alone and with the disk tier on. The herds of 50 callers are in test_stampede_herd.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import Cluster
from django_fastcache.client.commands import ADD_SEEING_MAX
from django_fastcache.client.metrics import MetricsSnapshot
from django_fastcache.protocol import MetaUnsupportedError
from django_fastcache.testing.fake_server import FakeMemcached
from django_fastcache.testing.servers import MemcachedServer, free_port
from tests.conftest import MEMCACHED_ONLY, forget_meta_answers

pytestmark = pytest.mark.integration

# Generous bounds: reached only when something is broken.
WAIT = 10.0


def make(location: str, options: dict[str, Any], **extra: Any) -> FastCache:
    return FastCache(location, {"TIMEOUT": 300, "OPTIONS": {**options, **extra}})


def arun(cache: FastCache, work: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        try:
            return await work()
        finally:
            await cache.client.aclose()

    return asyncio.run(main())


class Calls:
    """A default callable that counts its calls and returns ``value``."""

    def __init__(self, value: Any = "computed") -> None:
        self.value = value
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            self.count += 1
        return self.value


def memcached_gets(cache: FastCache) -> int:
    """Reads memcached has served (classic and meta), over every node."""
    stats = run_blocking(cache.blocking_client.stats())
    return sum(int(node["cmd_get"]) for node in stats.values())


def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def raw_mg(cache: FastCache, key: str, **flags: Any) -> Any:
    """memcached's view of a key, read with a meta get that changes nothing (by a client
    of its own: the cache's sends no meta command under protocol "classic")."""
    cluster = cache.blocking_client.cluster
    client = BlockingClient(
        Cluster(cluster.addresses, dataclasses.replace(cluster.settings, meta=True))
    )
    try:
        return run_blocking(client.meta_get(cache.wire_key(key), no_bump=True, **flags))
    finally:
        client.close_thread_connections()


def make_stub(cache: FastCache, key: str, lease: int = 30) -> None:
    """A lease's stub, as a get_or_set winner leaves it while it computes (or if it died)."""
    reply = run_blocking(cache.blocking_client.meta_get(cache.wire_key(key), vivify=lease))
    assert reply is not None
    assert reply.win
    assert reply.value == b""


# -- the plain cases ---------------------------------------------------------------------


def test_a_miss_is_computed_once_stored_and_then_hit(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    calls = Calls("value")
    assert cache.get_or_set("k", calls) == "value"
    assert cache.get_or_set("k", calls) == "value"
    assert calls.count == 1
    assert cache.get("k") == "value"
    assert 0 < raw_mg(cache, "k", ttl=True).ttl <= 300


def test_async_a_miss_is_computed_once_stored_and_then_hit(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    calls = Calls("value")

    async def coroutine_default() -> str:
        return "from a coroutine"

    async def work() -> Any:
        first = await cache.aget_or_set("k", calls)
        second = await cache.aget_or_set("k", calls)
        awaited = await cache.aget_or_set("c", coroutine_default)
        return first, second, awaited, await cache.aget("c")

    assert arun(cache, work) == ("value", "value", "from a coroutine", "from a coroutine")
    assert calls.count == 1


def test_plain_defaults_none_versions_and_zero_timeouts(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    assert cache.get_or_set("plain", "not callable") == "not callable"
    assert cache.get("plain") == "not callable"
    # A stored None is a hit.
    assert cache.get_or_set("none", None) is None
    assert cache.has_key("none")
    assert cache.get_or_set("none", Calls("other")) is None
    # timeout 0: the value is returned and nothing stays stored.
    assert cache.get_or_set("zero", "gone", timeout=0) == "gone"
    assert cache.get("zero") is None
    assert not cache.has_key("zero")
    assert raw_mg(cache, "zero") is None
    # Versions are separate keys.
    assert cache.get_or_set("v", "one", version=1) == "one"
    assert cache.get_or_set("v", "two", version=2) == "two"
    assert cache.get("v", version=1) == "one"


def test_a_value_too_large_raises_and_leaves_no_stub(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, max_value_size=1000)
    with pytest.raises(ValueError, match="max_value_size"):
        cache.get_or_set("big", lambda: b"x" * 5000)
    assert raw_mg(cache, "big") is None
    assert cache.get_or_set("big", "small") == "small"


# -- leases ------------------------------------------------------------------------------


def run_blocked_winner(
    cache: FastCache, key: str, value: Any = "winner's"
) -> tuple[threading.Thread, threading.Event, threading.Event, list[Any]]:
    """A get_or_set on another thread whose default waits for ``release``; returns once
    that default is running (the thread holds the lease)."""
    computing = threading.Event()
    release = threading.Event()
    results: list[Any] = []

    def default() -> Any:
        computing.set()
        assert release.wait(WAIT)
        return value

    def caller() -> None:
        try:
            results.append(cache.get_or_set(key, default))
        except BaseException as exc:  # reported by the test
            results.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert computing.wait(WAIT)
    return thread, release, computing, results


def test_the_winner_holds_a_stub_that_classic_reads_take_for_a_miss(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    thread, release, _computing, results = run_blocked_winner(cache, "k")
    try:
        stub = raw_mg(cache, "k", cas=True)
        assert stub is not None
        assert (stub.value, stub.client_flags) == (b"", 0)
        assert cache.get("k", "miss") == "miss"
        assert cache.get_many(["k"]) == {}
        assert not cache.has_key("k")
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["winner's"]
    assert cache.get("k") == "winner's"


def test_classic_protocol_takes_no_lease(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, protocol="classic")
    thread, release, _computing, results = run_blocked_winner(cache, "k")
    try:
        assert raw_mg(cache, "k") is None  # no stub: Django's own get, compute, add
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["winner's"]
    assert cache.get("k") == "winner's"


def test_a_delete_while_the_winner_computes_wins(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    thread, release, _computing, results = run_blocked_winner(cache, "k", "computed before")
    assert cache.delete("k")  # removes the stub: the lease's CAS no longer matches
    release.set()
    thread.join(WAIT)
    assert results == ["computed before"]  # the caller still gets its value...
    assert cache.get("k") is None  # ...but it is not stored over the delete


def test_a_set_while_the_winner_computes_wins(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    thread, release, _computing, results = run_blocked_winner(cache, "k", "old")
    cache.set("k", "newer")
    release.set()
    thread.join(WAIT)
    assert results == ["old"]
    assert cache.get("k") == "newer"


# A short value's add brings its get along; a long one's is followed by it (the sync API).
@pytest.mark.parametrize("added", ["added", "a" * (ADD_SEEING_MAX + 1)], ids=["short", "long"])
def test_an_add_while_the_winner_computes_replaces_the_stub(
    memcached: MemcachedServer, tier_options: dict[str, Any], added: str
) -> None:
    cache = make(memcached.location, tier_options)
    thread, release, _computing, results = run_blocked_winner(cache, "k", "old")
    assert cache.add("k", added)
    assert not cache.add("k", "again")  # a real value now
    release.set()
    thread.join(WAIT)
    assert results == ["old"]
    assert cache.get("k") == added


def test_waiters_get_the_winners_value(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    thread, release, _computing, results = run_blocked_winner(cache, "k")
    waiter_calls = Calls("the waiter's own")
    waiter_results: list[Any] = []
    gets = memcached_gets(cache)
    waiter = threading.Thread(
        target=lambda: waiter_results.append(cache.get_or_set("k", waiter_calls))
    )
    waiter.start()
    # The waiter polls (each poll an mg) until the winner stores; it never computes.
    assert wait_until(lambda: memcached_gets(cache) >= gets + 3)
    release.set()
    thread.join(WAIT)
    waiter.join(WAIT)
    assert results == waiter_results == ["winner's"]
    assert waiter_calls.count == 0


def test_a_winner_that_raises_lets_another_caller_win_at_once(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    # A long lease: only the release can explain a second winner within the test.
    cache = make(memcached.location, tier_options, stampede_lease=300, stampede_wait=60)
    callers = 10
    barrier = threading.Barrier(callers)
    lock = threading.Lock()
    calls: list[int] = []

    def default() -> str:
        with lock:
            calls.append(1)
            first = len(calls) == 1
        if first:
            raise RuntimeError("the first computation fails")
        return "second try"

    results: list[Any] = []

    def caller() -> None:
        barrier.wait(WAIT)
        try:
            value = cache.get_or_set("k", default)
        except RuntimeError as exc:
            value = exc
        with lock:
            results.append(value)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 3)
    assert len(calls) == 2
    assert sum(isinstance(result, RuntimeError) for result in results) == 1
    assert results.count("second try") == callers - 1


def test_async_a_winner_that_raises_releases_its_lease(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, stampede_lease=300)

    def failing() -> str:
        raise RuntimeError("fails")

    async def work() -> Any:
        with pytest.raises(RuntimeError):
            await cache.aget_or_set("k", failing)
        return await cache.aget_or_set("k", Calls("next"))

    assert arun(cache, work) == "next"


def test_a_winner_that_died_is_replaced_when_its_lease_expires(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, stampede_wait=WAIT)
    make_stub(cache, "k", lease=1)  # a winner that never comes back
    calls = Calls("recomputed")
    assert cache.get_or_set("k", calls) == "recomputed"
    assert calls.count == 1
    assert cache.get("k") == "recomputed"


def test_waiting_is_bounded_by_stampede_wait(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, stampede_wait=0.2)
    make_stub(cache, "k", lease=300)
    calls = Calls("mine")
    assert cache.get_or_set("k", calls) == "mine"
    assert calls.count == 1
    # Not stored: the lease holder's value will be.
    assert raw_mg(cache, "k").value == b""


# -- stale values ----------------------------------------------------------------------


def test_invalidate_serves_the_stale_value_while_one_caller_recomputes(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, stale_while_revalidate=30)
    cache.set("k", "old")
    # (Not looked at here: the first meta read of a stale value takes its win.)
    assert cache.invalidate("k", stale_timeout=60)
    thread, release, _computing, results = run_blocked_winner(cache, "k", "new")
    try:
        others = Calls("not me")
        assert cache.get_or_set("k", others) == "old"  # at once, while the winner computes
        assert others.count == 0
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["new"]
    assert cache.get_or_set("k", Calls()) == "new"
    assert not raw_mg(cache, "k").stale


def test_without_stale_while_revalidate_a_stale_value_is_waited_out(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    cache.set("k", "old")
    assert cache.invalidate("k")
    thread, release, _computing, results = run_blocked_winner(cache, "k", "new")
    waiter: list[Any] = []
    waiting = threading.Thread(target=lambda: waiter.append(cache.get_or_set("k", Calls())))
    waiting.start()
    release.set()
    thread.join(WAIT)
    waiting.join(WAIT)
    assert results == waiter == ["new"]


def test_a_winner_of_a_stale_value_that_raises_marks_it_stale_again(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, stale_while_revalidate=30)
    cache.set("k", "old")
    cache.invalidate("k")

    def failing() -> str:
        raise RuntimeError("fails")

    with pytest.raises(RuntimeError):
        cache.get_or_set("k", failing)
    calls = Calls("new")
    assert cache.get_or_set("k", calls) == "new"  # won again at once
    assert calls.count == 1


def test_async_invalidate(memcached: MemcachedServer, tier_options: dict[str, Any]) -> None:
    cache = make(memcached.location, tier_options, stale_while_revalidate=30)

    async def work() -> Any:
        await cache.aset("k", "old")
        assert await cache.ainvalidate("k")
        assert not await cache.ainvalidate("missing")
        return await cache.aget_or_set("k", Calls("new"))

    assert arun(cache, work) == "new"  # the first caller after invalidate wins


def test_invalidate_with_the_disk_tier_keeps_the_stale_copy_in_memcached_only(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    cache = make(memcached.location, {"disk_directory": disk_directory})
    cache.set("k", "old")
    assert cache.invalidate("k", stale_timeout=60)
    kept = raw_mg(cache, "k", ttl=True)
    assert kept is not None
    assert kept.stale
    assert 0 < kept.ttl <= 60
    assert cache.get("k") == "old"  # plain get: memcached's (stale) value, as documented
    landed_and_gone_from_memcached(cache, "k")
    assert cache.get("k") is None  # the disk copy went as a delete's would
    assert not cache.invalidate("k")


@pytest.mark.parametrize("operation", ["touch", "add", "a lease store that fails"])
def test_with_the_tier_a_read_that_takes_a_stale_items_win_gives_it_back(
    memcached: MemcachedServer, disk_directory: str, operation: str
) -> None:
    cache = make(memcached.location, {"disk_directory": disk_directory}, stampede_wait=0.3)
    if operation == "a lease store that fails":
        # The winner's stub is invalidated while it computes: its store fails, and the
        # tier's look at what memcached holds takes the stale stub's win.
        thread, release, _computing, results = run_blocked_winner(cache, "k", "lost")
        try:
            assert cache.invalidate("k")
        finally:
            release.set()
            thread.join(WAIT)
        assert results == ["lost"]
    else:
        cache.set("k", "old")
        assert cache.invalidate("k")
        if operation == "touch":
            assert cache.touch("k", 300) is True
        else:
            assert cache.add("k", "added") is False  # a value holds the key for add
    calls = Calls("new")
    assert cache.get_or_set("k", calls) == "new"
    assert calls.count == 1
    stored = raw_mg(cache, "k")
    assert stored is not None
    assert not stored.stale  # stored by a winner, not computed by a waiter that gave up


def test_one_caller_recomputes_ahead_of_expiry_while_others_get_the_value(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options, stale_while_revalidate=120)
    cache.set("k", "current", timeout=60)  # 60 s left: within the 120 s window
    thread, release, _computing, results = run_blocked_winner(cache, "k", "fresh")
    try:
        others = Calls()
        assert cache.get_or_set("k", others) == "current"
        assert others.count == 0
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["fresh"]
    assert cache.get("k") == "fresh"


# -- with the disk tier -------------------------------------------------------------------


def landed_and_gone_from_memcached(cache: FastCache, key: str) -> None:
    """The tier's disk copies landed; ``key`` then removed from memcached behind the tier's
    back (as an eviction or a restart would), so that only the disk tier can answer it."""
    tier = cache._shared().tiered
    assert tier is not None
    assert tier.flush(WAIT)
    run_blocking(cache.blocking_client.meta_delete(cache.wire_key(key)))


def test_with_the_tier_a_memcached_miss_is_answered_from_disk_under_the_lease(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    cache = make(memcached.location, {"disk_directory": disk_directory})
    cache.set("k", "on disk")
    landed_and_gone_from_memcached(cache, "k")
    calls = Calls()
    assert cache.get_or_set("k", calls) == "on disk"
    assert calls.count == 0
    put_back = raw_mg(cache, "k")
    assert put_back is not None
    assert put_back.value != b""  # the value, back in memcached (not a stub)
    assert cache.get("k") == "on disk"


def test_with_the_tier_the_winners_value_gets_its_disk_copy(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    cache = make(memcached.location, {"disk_directory": disk_directory})
    assert cache.get_or_set("k", Calls("computed")) == "computed"
    landed_and_gone_from_memcached(cache, "k")
    assert cache.get("k") == "computed"  # from the disk tier


def test_with_the_tier_a_set_while_the_winner_computes_wins_on_disk_too(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    cache = make(memcached.location, {"disk_directory": disk_directory})
    thread, release, _computing, results = run_blocked_winner(cache, "k", "winner's")
    try:
        cache.set("k", "set meanwhile")
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["winner's"]  # returned to its caller, not stored
    assert cache.get("k") == "set meanwhile"
    landed_and_gone_from_memcached(cache, "k")
    assert cache.get("k") == "set meanwhile"  # the disk copy is the set's


def test_with_the_tier_a_delete_while_the_winner_computes_leaves_nothing_on_disk(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    cache = make(memcached.location, {"disk_directory": disk_directory})
    cache.set("k", "old")
    cache.delete("k")
    thread, release, _computing, results = run_blocked_winner(cache, "k", "winner's")
    try:
        cache.delete("k")  # (True: memcached removed the stub)
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["winner's"]
    landed_and_gone_from_memcached(cache, "k")
    assert cache.get("k") is None


def test_with_the_tier_get_or_set_and_add_work_while_the_node_is_out(disk_directory: str) -> None:
    location = f"127.0.0.1:{free_port()}"  # nothing listens here
    cache = make(location, {"disk_directory": disk_directory}, protocol="meta")
    cache.set("k", "on disk")  # fails to connect, marks the node out, goes to disk
    assert cache.add("k", "other") is False  # refused by the disk tier, not raised
    calls = Calls("computed")
    assert cache.get_or_set("k", calls) == "on disk"
    assert cache.get_or_set("new", calls) == "computed"
    assert calls.count == 1
    assert cache.get("new") == "computed"


# -- stubs through the classic commands ----------------------------------------------------


@pytest.mark.parametrize("sign_values", [True, False])
def test_a_stub_is_a_miss_to_every_classic_read_and_write(
    memcached: MemcachedServer, tier_options: dict[str, Any], sign_values: bool
) -> None:
    # As in a process that never ran get_or_set: the stub is another process's lease.
    forget_meta_answers(memcached.location)
    cache = make(memcached.location, tier_options, sign_values=sign_values)
    make_stub(cache, "k")
    assert cache.get("k", "default") == "default"
    assert cache.get_many(["k"]) == {}
    assert not cache.has_key("k")
    with pytest.raises(ValueError, match="not found"):
        cache.incr("k")
    with pytest.raises(ValueError, match="not found"):
        cache.decr("k")
    assert cache.refused_values == 0  # a miss, not a refused value
    assert cache.add("k", 5)
    assert cache.incr("k") == 6


@pytest.mark.parametrize("sign_values", [True, False])
def test_async_a_stub_is_a_miss_to_every_classic_read_and_write(
    memcached: MemcachedServer, tier_options: dict[str, Any], sign_values: bool
) -> None:
    # As in a process that never ran get_or_set: the stub is another process's lease.
    forget_meta_answers(memcached.location)
    cache = make(memcached.location, tier_options, sign_values=sign_values)
    make_stub(cache, "k")

    async def work() -> Any:
        assert await cache.aget("k", "default") == "default"
        assert await cache.aget_many(["k"]) == {}
        assert not await cache.ahas_key("k")
        with pytest.raises(ValueError, match="not found"):
            await cache.aincr("k")
        assert await cache.aadd("k", "added")
        return await cache.aget("k")

    assert arun(cache, work) == "added"
    assert cache.refused_values == 0


@pytest.mark.parametrize("sign_values", [True, False])
def test_empty_bytes_stored_by_the_backend_are_a_hit(
    memcached: MemcachedServer, tier_options: dict[str, Any], sign_values: bool
) -> None:
    cache = make(memcached.location, tier_options, sign_values=sign_values)
    cache.set("empty", b"")
    assert cache.get("empty") == b""
    assert cache.has_key("empty")
    assert cache.get_or_set("empty", Calls()) == b""
    stored = raw_mg(cache, "empty")
    assert (stored.value, stored.client_flags) != (b"", 0)


def test_a_value_that_is_not_a_stub_still_fails_incr_as_before(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    cache = make(memcached.location, tier_options)
    cache.set("k", "text")
    with pytest.raises(TypeError):
        cache.incr("k")
    assert not cache.add("k", "other")


# -- the protocol option ---------------------------------------------------------------


# The fake keeps no flags: bytes values, unsealed, read back as they were stored.
FAKE_OPTIONS = {**MEMCACHED_ONLY, "sign_values": False}


def meta_requests(fake: FakeMemcached) -> list[bytes]:
    return [r.line.split()[0] for r in fake.requests if r.line[:2] in (b"mn", b"mg", b"ms", b"md")]


@contextlib.contextmanager
def new_fake() -> Iterator[FakeMemcached]:
    """A fake memcached this process has never asked whether it speaks meta (the answers
    are kept by node address, and an earlier test's server may have had this port)."""
    with FakeMemcached() as fake:
        forget_meta_answers(fake.location)
        yield fake


def test_auto_asks_once_and_falls_back_to_classic_on_a_server_without_meta() -> None:
    with new_fake() as fake:
        cache = make(fake.location, FAKE_OPTIONS)
        calls = Calls(b"v")
        assert cache.get_or_set("k", calls) == b"v"
        assert cache.get_or_set("k", calls) == b"v"
        assert calls.count == 1
        assert cache.get_or_set("other", b"w") == b"w"
        assert meta_requests(fake) == [b"mn"]  # one probe, then classic commands only
        assert cache.get("k") == b"v"


def test_async_auto_on_a_server_without_meta() -> None:
    with new_fake() as fake:
        cache = make(fake.location, FAKE_OPTIONS)
        assert arun(cache, lambda: cache.aget_or_set("k", Calls(b"v"))) == b"v"
        assert meta_requests(fake) == [b"mn"]


def verbs(fake: FakeMemcached) -> list[bytes]:
    return [r.line.split()[0] for r in fake.requests]


def test_a_refused_add_looks_for_a_stub_with_a_plain_get() -> None:
    """A refused add over a value costs one get more, and asks no node about meta."""
    with new_fake() as fake:
        cache = make(fake.location, FAKE_OPTIONS)
        cache.set("k", b"v")
        before = len(fake.requests)
        assert cache.add("k", b"w") is False
        assert arun(cache, lambda: cache.aadd("k", b"w")) is False
        assert verbs(fake)[before:] == [b"add", b"get", b"add", b"get"]
        assert cache.get("k") == b"v"


def separate_gets(metrics: MetricsSnapshot, location: str) -> int:
    """The gets a client sent as requests of their own (one sent with an add is counted as
    part of the add's)."""
    return metrics.nodes[location].operations["get"].calls


def test_a_short_values_add_sends_its_get_along_and_a_long_ones_after_it() -> None:
    long = b"w" * (ADD_SEEING_MAX + 1)
    with new_fake() as fake:
        cache = make(fake.location, FAKE_OPTIONS)
        cache.set("k", b"v")
        before = len(fake.requests)
        gets = separate_gets(cache.blocking_client.metrics(), fake.location)
        assert cache.add("k", b"w") is False
        assert separate_gets(cache.blocking_client.metrics(), fake.location) == gets
        assert cache.add("k", long) is False
        assert separate_gets(cache.blocking_client.metrics(), fake.location) == gets + 1
        assert cache.add("new", long) is True
        # Both refusals looked for a stub with a get; the stored long add did not.
        assert verbs(fake)[before:] == [b"add", b"get", b"add", b"get", b"add"]
        assert cache.get("k") == b"v"

        async def adds() -> list[int]:
            counts = [separate_gets(cache.client.metrics(), fake.location)]
            for key, value in (("k", b"w"), ("k", long), ("newer", long)):
                await cache.aadd(key, value)
                counts.append(separate_gets(cache.client.metrics(), fake.location))
            return counts

        before = len(fake.requests)
        first, *after = arun(cache, adds)
        assert after == [first, first + 1, first + 1]
        assert verbs(fake)[before:] == [b"add", b"get", b"add", b"get", b"add"]


@pytest.mark.parametrize("setting", [{"protocol": "classic"}, {"stampede_protection": False}])
def test_a_refused_add_looks_for_no_stub_where_the_settings_make_none(
    setting: dict[str, Any],
) -> None:
    with new_fake() as fake:
        cache = make(fake.location, FAKE_OPTIONS, **setting)
        cache.set("k", b"v")
        before = len(fake.requests)
        assert cache.add("k", b"w") is False
        assert arun(cache, lambda: cache.aadd("k", b"w")) is False
        assert verbs(fake)[before:] == [b"add", b"add"]


def test_classic_never_sends_a_meta_command() -> None:
    with FakeMemcached() as fake:
        cache = make(fake.location, FAKE_OPTIONS, protocol="classic")
        assert cache.get_or_set("k", b"v") == b"v"
        assert cache.invalidate("k")  # a plain delete
        assert cache.get("k") is None
        assert meta_requests(fake) == []


def test_meta_on_a_server_without_meta_names_the_fix() -> None:
    with FakeMemcached() as fake:
        cache = make(fake.location, FAKE_OPTIONS, protocol="meta")
        with pytest.raises(MetaUnsupportedError, match="'auto' or 'classic'"):
            cache.get_or_set("k", b"v")
        # No probe first: meta was promised. (The request's closing mn may or may not
        # reach the fake before the client resets the connection.)
        assert meta_requests(fake)[0] == b"mg"
        assert cache.get("k") is None  # the connection that got ERROR was dropped


def test_meta_and_auto_use_leases_on_real_memcached(memcached: MemcachedServer) -> None:
    for protocol in ("meta", "auto"):
        cache = make(memcached.location, MEMCACHED_ONLY, protocol=protocol)
        key = f"k-{protocol}"
        thread, release, _computing, results = run_blocked_winner(cache, key)
        try:
            assert raw_mg(cache, key).value == b""  # the lease's stub
        finally:
            release.set()
            thread.join(WAIT)
        assert results == ["winner's"]


def test_stampede_protection_off_takes_no_lease(memcached: MemcachedServer) -> None:
    cache = make(memcached.location, MEMCACHED_ONLY, stampede_protection=False)
    thread, release, _computing, results = run_blocked_winner(cache, "k")
    try:
        assert raw_mg(cache, "k") is None
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["winner's"]
