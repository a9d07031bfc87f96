"""``stale_on_delete`` against real memcached: ``delete`` keeps a stale copy (``md … I``)
that only get_or_set uses, and to every other operation the key is gone, as Django says a
deleted key is."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.testing.servers import MemcachedServer
from tests.integration.test_stampede import (
    FAKE_OPTIONS,
    WAIT,
    Calls,
    arun,
    make_stub,
    meta_requests,
    new_fake,
    raw_mg,
    run_blocked_winner,
)

pytestmark = pytest.mark.integration

KEEP = 60


def make(location: str, **extra: Any) -> FastCache:
    options = {"disk_tier": False, "stale_on_delete": KEEP, **extra}
    return FastCache(location, {"TIMEOUT": 300, "OPTIONS": options})


def deleted(memcached: MemcachedServer, value: Any = "old", **extra: Any) -> FastCache:
    """A cache whose key ``k`` held ``value`` and was deleted (its stale copy kept)."""
    cache = make(memcached.location, **extra)
    cache.set("k", value)
    assert cache.delete("k") is True
    return cache


def test_delete_keeps_a_stale_copy_that_plain_reads_take_for_missing(
    memcached: MemcachedServer,
) -> None:
    cache = deleted(memcached)
    kept = raw_mg(cache, "k", ttl=True)
    assert kept is not None
    assert kept.stale
    assert 0 < kept.ttl <= KEEP
    assert cache.get("k") is None
    assert cache.get("k", "default") == "default"
    assert cache.has_key("k") is False
    cache.set("other", 1)
    assert cache.get_many(["k", "other"]) == {"other": 1}
    assert cache.touch("k") is False
    assert cache.delete("k") is False  # already gone
    assert raw_mg(cache, "k").stale  # still kept for get_or_set


def test_a_read_that_took_the_win_gives_it_back(memcached: MemcachedServer) -> None:
    # memcached hands a stale item's win to the first mg, whoever sends it: a plain get
    # that did not give it back would leave get_or_set's callers waiting for nobody.
    cache = deleted(memcached, stampede_wait=0.3)
    assert cache.get("k") is None
    assert cache.get_many(["k"]) == {}
    assert cache.has_key("k") is False
    calls = Calls("new")
    assert cache.get_or_set("k", calls) == "new"
    assert calls.count == 1
    stored = raw_mg(cache, "k")
    assert stored is not None
    assert not stored.stale  # stored by a winner, not computed by a waiter that gave up
    assert cache.get("k") == "new"


def test_add_replaces_the_stale_copy(memcached: MemcachedServer) -> None:
    cache = deleted(memcached)
    assert cache.add("k", "added") is True
    assert cache.get("k") == "added"
    assert not raw_mg(cache, "k").stale
    assert cache.add("k", "again") is False  # now a value holds it


def test_set_replaces_the_stale_copy(memcached: MemcachedServer) -> None:
    cache = deleted(memcached)
    cache.set("k", "new")
    assert cache.get("k") == "new"
    assert cache.delete("k") is True
    assert cache.get("k") is None


def test_incr_and_decr_of_a_deleted_counter_raise_and_leave_the_copy_alone(
    memcached: MemcachedServer,
) -> None:
    cache = make(memcached.location)
    cache.set("n", 5)
    assert cache.incr("n", 2) == 7
    assert cache.decr("n") == 6
    assert cache.delete("n")
    with pytest.raises(ValueError, match="not found"):
        cache.incr("n")
    with pytest.raises(ValueError, match="not found"):
        cache.decr("n")
    assert raw_mg(cache, "n").value == b"6"
    with pytest.raises(ValueError, match="not found"):
        cache.incr("never")


def test_incr_of_a_value_that_is_not_a_number_still_says_so(memcached: MemcachedServer) -> None:
    cache = make(memcached.location)
    cache.set("s", "text")
    with pytest.raises(TypeError, match="not an integer"):
        cache.incr("s")


def test_the_stale_copy_lives_stale_on_delete_seconds_and_never_past_its_own_expiry(
    memcached: MemcachedServer,
) -> None:
    cache = make(memcached.location, stale_on_delete=5)
    cache.set("forever", "v", timeout=None)
    cache.set("short", "v", timeout=3)
    cache.set("long", "v", timeout=3000)
    for key in ("forever", "short", "long"):
        assert cache.delete(key)
    assert 0 < raw_mg(cache, "forever", ttl=True).ttl <= 5
    assert 0 < raw_mg(cache, "short", ttl=True).ttl <= 3
    assert 0 < raw_mg(cache, "long", ttl=True).ttl <= 5


def test_delete_many_keeps_stale_copies(memcached: MemcachedServer) -> None:
    cache = make(memcached.location)
    cache.set_many({"a": 1, "b": 2})
    cache.delete_many(["a", "b", "missing"])
    assert cache.get_many(["a", "b"]) == {}
    assert raw_mg(cache, "a").stale
    assert raw_mg(cache, "b").stale
    assert raw_mg(cache, "missing") is None


def test_deleting_a_value_being_computed_removes_its_stub(memcached: MemcachedServer) -> None:
    cache = make(memcached.location)
    make_stub(cache, "k")
    assert cache.delete("k") is False  # the value was missing
    assert raw_mg(cache, "k") is None  # and the computation's store will fail


def test_get_or_set_serves_the_stale_copy_while_one_caller_recomputes(
    memcached: MemcachedServer,
) -> None:
    cache = deleted(memcached, stale_while_revalidate=30)
    thread, release, _computing, results = run_blocked_winner(cache, "k", "new")
    try:
        others = Calls("not me")
        assert cache.get_or_set("k", others) == "old"  # at once, while the winner computes
        assert others.count == 0
        assert cache.get("k") is None  # plain get: still deleted
    finally:
        release.set()
        thread.join(WAIT)
    assert results == ["new"]
    assert cache.get("k") == "new"


def test_without_stale_while_revalidate_get_or_set_waits_for_the_new_value(
    memcached: MemcachedServer,
) -> None:
    cache = deleted(memcached)
    thread, release, _computing, results = run_blocked_winner(cache, "k", "new")
    waiter: list[Any] = []
    waiting = threading.Thread(target=lambda: waiter.append(cache.get_or_set("k", Calls())))
    waiting.start()
    release.set()
    thread.join(WAIT)
    waiting.join(WAIT)
    assert results == waiter == ["new"]


def test_async_operations(memcached: MemcachedServer) -> None:
    cache = make(memcached.location, stale_while_revalidate=30)

    async def work() -> list[Any]:
        await cache.aset("k", "old")
        await cache.aset("n", 1)
        seen = [
            await cache.adelete("k"),
            await cache.adelete("n"),
            await cache.adelete("k"),
            await cache.aget("k"),
            await cache.ahas_key("k"),
            await cache.aget_many(["k"]),
            await cache.atouch("k"),
        ]
        with pytest.raises(ValueError, match="not found"):
            await cache.aincr("n")
        seen.append(await cache.aget_or_set("k", Calls("new")))
        seen.append(await cache.aadd("n", 10))
        seen.append(await cache.aincr("n"))
        return seen

    assert arun(cache, work) == [True, True, False, None, False, {}, False, "new", True, 11]


def test_a_node_without_meta_gets_plain_deletes() -> None:
    with new_fake() as fake:
        cache = FastCache(fake.location, {"OPTIONS": {**FAKE_OPTIONS, "stale_on_delete": KEEP}})
        cache.set("k", b"v")
        assert cache.delete("k") is True
        assert cache.get("k") is None
        assert cache.add("k", b"w") is True
        assert cache.get("k") == b"w"
        assert meta_requests(fake) == [b"mn"]  # one probe, then classic commands only
