"""The disk tier behind memcached, against real memcached processes.

What each operation does to both tiers, and what happens when a node goes away and comes
back (the rules are in the docstring of :mod:`django_fastcache.tiered`). memcached is looked
at from outside over a raw text-protocol connection (:class:`Raw`), the disk tier directly
through ``cache._shared().tiered.disk``. Outages use memcached processes of the test's own,
killed (SIGKILL), paused (SIGSTOP: the process keeps its data and sockets but answers nothing)
and restarted or resumed. The background probe is waited for by polling ``tier_stats()``
with a deadline.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_fastcache.backends import FastCache, fastcache
from django_fastcache.bridge import run_blocking
from django_fastcache.disk import DiskEntry
from django_fastcache.errors import (
    InvalidArgumentError,
    ProtocolError,
    ReplyTooLargeError,
    ServerError,
    ValueTooLargeError,
)
from django_fastcache.maintenance import maintenance
from django_fastcache.serializers import FLAG_INTEGER
from django_fastcache.signals import node_back, node_out
from django_fastcache.testing.servers import MemcachedServer, free_port
from django_fastcache.tiered import TieredStore
from tests.conftest import LANDING_WAIT, connects_from_this_thread
from tests.twins import twin

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
#: How long the background probe may take to bring a node back (its backoff tops at 2 s).
PROBE_DEADLINE = 30.0
#: How long memcached's one-second clock and the test's own steps may stretch a TTL.
TTL_SLACK = 5


# -- looking at memcached from outside --------------------------------------------------------


class Raw:
    """One memcached, over a connection per request: get, set, delete, ttl and stats."""

    def __init__(self, server: MemcachedServer) -> None:
        self.server = server

    def _ask(self, request: bytes, ending: bytes) -> bytes:
        server = self.server
        if server.socket_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = server.socket_path
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = (server.host, server.port)
        with sock:
            sock.settimeout(5)
            sock.connect(address)
            sock.sendall(request)
            reply = b""
            while not reply.endswith(ending):
                chunk = sock.recv(65536)
                assert chunk, f"{server.location} closed the connection"
                reply += chunk
        return reply

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        """The item's (data, flags), or None."""
        reply = self._ask(b"get " + key + b"\r\n", b"END\r\n")
        if reply == b"END\r\n":
            return None
        header, _, rest = reply.partition(b"\r\n")
        _value, _key, flags, length = header.split()
        return rest[: int(length)], int(flags)

    def set(self, key: bytes, data: bytes, flags: int = 0) -> None:
        request = b"set %s %d 0 %d\r\n%s\r\n" % (key, flags, len(data), data)
        assert self._ask(request, b"\r\n") == b"STORED\r\n"

    def ttl(self, key: bytes) -> int | None:
        """Seconds the item has left (-1: never expires), or None when it is not there."""
        reply = self._ask(b"mg " + key + b" t\r\n", b"\r\n")
        if reply == b"EN\r\n":
            return None
        return int(reply.split()[1][1:])

    def stats(self) -> dict[str, int]:
        values: dict[str, int] = {}
        for line in self._ask(b"stats\r\n", b"END\r\n").decode().splitlines()[:-1]:
            _stat, name, value = line.split(" ", 2)
            if value.isdigit():
                values[name] = int(value)
        return values


# -- fixtures and helpers -------------------------------------------------------------------


def make_cache(location: str, disk_directory: str, **options: Any) -> FastCache:
    # These tests compare the bytes each tier holds with encoded(): unsealed, so that a
    # value's bytes do not depend on its key. Sealing with the tier on is covered by
    # test_sealing.py and by Django's own suite (defaults).
    options = {"disk_directory": disk_directory, "sign_values": False, **options}
    return FastCache(location, {"OPTIONS": options})


def tiered(cache: FastCache) -> TieredStore:
    store = cache._shared().tiered
    assert store is not None
    return store


def landed(cache: FastCache) -> None:
    """Wait for the writer behind memcached: the disk copies of the writes made so far."""
    assert tiered(cache).flush(LANDING_WAIT), "the writer behind did not land the queued writes"


def on_disk(cache: FastCache, key: str) -> DiskEntry | None:
    """The key's disk entry once the queued writes landed, if it answers reads."""
    landed(cache)
    store = tiered(cache)
    entry = store.disk.get(cache.wire_key(key))
    if entry is None or entry.stamp != store.stamps.current(cache.wire_key(key)):
        return None
    return entry


def encoded(cache: FastCache, value: Any) -> tuple[bytes, int]:
    return cache._serializer.dumps(value)


def node_state(cache: FastCache, node_id: str) -> dict[str, Any]:
    stats = cache.tier_stats()
    assert stats is not None
    state: dict[str, Any] = stats["nodes"][node_id]
    return state


def wait_until(condition: Callable[[], bool], what: str, timeout: float = PROBE_DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def wait_for_state(cache: FastCache, node_id: str, state: str) -> None:
    wait_until(lambda: node_state(cache, node_id)["state"] == state, f"{node_id} is {state}")


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    """A memcached of the test's own, to kill, pause, resume and restart."""
    own = MemcachedServer()
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def signals_sent() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every node_out and node_back sent while the test runs: (signal name, arguments and
    ``sender``)."""
    sent: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def on_out(sender: Any, **kwargs: Any) -> None:
        with lock:
            sent.append(("node_out", {"sender": sender, **kwargs}))

    def on_back(sender: Any, **kwargs: Any) -> None:
        with lock:
            sent.append(("node_back", {"sender": sender, **kwargs}))

    node_out.connect(on_out, weak=False)
    node_back.connect(on_back, weak=False)
    try:
        yield sent
    finally:
        node_out.disconnect(on_out)
        node_back.disconnect(on_back)


# -- reads ------------------------------------------------------------------------------------


def test_a_memcached_hit_is_memcacheds_answer(cache: FastCache, raw: Raw) -> None:
    cache.set("k", "written")
    # memcached is the first tier: what it holds is the answer, whatever the disk holds.
    raw.set(cache.wire_key("k"), *encoded(cache, "in memcached"))
    assert cache.get("k") == "in memcached"
    assert cache.get_many(["k"]) == {"k": "in memcached"}
    stats = cache.tier_stats()
    assert stats is not None
    assert (stats["disk_hits"], stats["refills"], stats["fallbacks"]) == (0, 0, 0)


def test_every_tier_stats_key_has_a_row_in_the_disk_tier_page(cache: FastCache) -> None:
    stats = cache.tier_stats()
    assert stats is not None
    page = (REPO_ROOT / "docs" / "disk-tier.md").read_text(encoding="utf-8")
    table = page.split("`cache.tier_stats()` returns", 1)[1].split("\n\n", 2)[1]
    documented = set(
        re.findall(
            r"`([a-z_]+)`", "\n".join(line.split(" | ", 1)[0] for line in table.splitlines())
        )
    )
    assert set(stats) - documented == set(), "tier_stats() keys not in docs/disk-tier.md"
    assert documented - set(stats) == set(), "docs/disk-tier.md names keys tier_stats() lacks"


def test_the_maintenance_thread_opens_the_shards_so_that_no_request_does(
    cache: FastCache, memcached: MemcachedServer
) -> None:
    """Opening the disk tier's shards costs 9 to 21 ms of CPU: the process's first read
    from disk paid it in a request. The maintenance thread's first round over the store
    opens them instead; a request's read from disk then finds them open."""
    assert cache.get("absent") is None  # builds the store; a miss deleted nowhere: no read
    disk = tiered(cache).disk
    wait_until(lambda: bool(disk._shards), "the maintenance thread opened the shards", 10.0)
    opened = disk._fanout
    cache.set("k", "on disk")
    landed(cache)
    memcached.flush()
    assert cache.get("k") == "on disk"
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["disk_hits"] == 1
    assert disk._fanout is opened


def test_a_memcached_miss_is_answered_from_disk_and_memcached_is_refilled(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    cache.set("k", {"value": 1}, timeout=1000)
    key = cache.wire_key("k")
    landed(cache)
    memcached.flush()
    assert raw.get(key) is None
    assert cache.get("k") == {"value": 1}
    # Put back, with what a set would have sent, and the time it had left.
    assert raw.get(key) == encoded(cache, {"value": 1})
    ttl = raw.ttl(key)
    assert ttl is not None
    assert 1000 - TTL_SLACK <= ttl <= 1000
    stats = cache.tier_stats()
    assert stats is not None
    assert (stats["disk_hits"], stats["refills"]) == (1, 1)
    # The next read is memcached's.
    assert cache.get("k") == {"value": 1}
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["disk_hits"] == 1


def test_get_many_answers_misses_from_disk_and_refills_them(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    cache.set_many({"a": 1, "b": "two", "c": [3]})
    landed(cache)
    memcached.flush()
    cache.set("a", 10)  # memcached holds this one again
    assert cache.get_many(["a", "b", "c", "absent"]) == {"a": 10, "b": "two", "c": [3]}
    assert raw.get(cache.wire_key("b")) == encoded(cache, "two")
    assert raw.get(cache.wire_key("c")) == encoded(cache, [3])
    stats = cache.tier_stats()
    assert stats is not None
    assert (stats["disk_hits"], stats["refills"]) == (2, 2)


def meta_commands_sent(cache: FastCache) -> int:
    """Meta commands the cache's two clients sent, by their own counters."""
    metrics = cache.metrics()
    return sum(
        stats.calls
        for snapshot in (metrics["blocking"], metrics["async"])
        for node in snapshot.nodes.values()
        for name, stats in node.operations.items()
        if name == "meta"
    )


@pytest.mark.parametrize("protocol", ["classic", "meta"])
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_key_only_the_disk_holds_is_answered_right_after_a_touch(
    memcached: MemcachedServer, disk_directory: str, protocol: str, api: str
) -> None:
    """touch agrees with get: the touch stamps the key, which hides the entry it read, so
    the entry with its new expiry is landed at once. Queued behind, the key missed until the
    writer landed it (for good under the classic protocol, which puts nothing back into
    memcached), in this process and in any other."""
    cache = make_cache(memcached.location, disk_directory, protocol=protocol)
    other = make_cache(memcached.location, disk_directory, protocol=protocol)
    cache.set("k", "v", timeout=1000)
    landed(cache)
    memcached.flush()  # memcached lost it: the disk answers (not read here: a get would
    # put it back into memcached, under the meta protocol)
    tiered(cache).behind.pause()  # nothing queued lands: only what the touch landed itself
    try:
        before = time.time()
        if api == "sync":
            assert cache.touch("k", 2000) is True
        else:

            async def touch() -> bool:
                try:
                    return await cache.atouch("k", 2000)
                finally:
                    await cache.client.aclose()

            assert asyncio.run(touch()) is True
        after = time.time()
        assert cache.get("k") == "v"
        assert other.get("k") == "v"
        store = tiered(cache)
        entry = store.disk.get(cache.wire_key("k"))
        assert entry is not None
        assert entry.stamp == store.stamps.current(cache.wire_key("k"))
        assert_expires(entry, 2000, before, after)
    finally:
        tiered(cache).behind.resume()


def test_protocol_classic_sends_no_meta_command_and_the_tier_keeps_its_guarantees(
    memcached: MemcachedServer, disk_directory: str, raw: Raw
) -> None:
    # For a proxy that does not speak meta (mcrouter): the tier takes its classic ways at
    # once. A miss answered from disk is not put back (no lease to do it safely with);
    # incr and touch, which learn no TTL or value classically, drop the key's disk copy.
    cache = make_cache(memcached.location, disk_directory, protocol="classic")
    cache.set("k", "v", timeout=1000)
    cache.set_many({"a": 1, "b": 2, "n": 5})
    assert cache.add("k", "other") is False
    assert cache.add("new", "added") is True
    assert cache.incr("n", 2) == 7
    assert cache.decr("n") == 6
    assert cache.touch("a", 2000) is True
    landed(cache)
    memcached.flush()  # a restart: the disk answers
    assert cache.get("k") == "v"
    assert cache.get_many(["a", "b", "n", "absent"]) == {"b": 2}  # a and n: dropped
    assert raw.get(cache.wire_key("k")) is None  # not put back
    assert cache.add("k", "other") is False  # the disk holds it
    assert raw.get(cache.wire_key("k")) is None  # the add's value taken back
    assert cache.has_key("new")
    assert cache.get_or_set("k", "computed") == "v"
    with pytest.raises(ValueError):
        cache.incr("n")

    async def asynchronous() -> Any:
        try:
            return (
                await cache.aget("b"),
                await cache.aadd("b", 0),
                await cache.atouch("new", 100),
                await cache.aset("c", 3),
                await cache.aincr("c"),
                await cache.aget_or_set("gos", 9),
            )
        finally:
            await cache.client.aclose()

    before = time.time()
    assert asyncio.run(asynchronous()) == (2, False, True, None, 4, 9)
    assert_expires(on_disk(cache, "new"), 100, before, time.time())  # touched on disk
    cache.delete("k")
    cache.delete_many(["b", "c"])
    assert cache.get_many(["k", "b", "c", "gos"]) == {"gos": 9}
    assert meta_commands_sent(cache) == 0
    # (The counter counts: a cache that speaks meta sends one for a touch.)
    speaking = make_cache(memcached.location, disk_directory)
    speaking.touch("gos", 100)
    assert meta_commands_sent(speaking) == 1


def test_the_async_api_answers_a_miss_from_disk_and_refills(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    cache.set("k", "v")
    landed(cache)
    memcached.flush()

    async def work() -> Any:
        try:
            return await cache.aget("k"), await cache.ahas_key("k")
        finally:
            await cache.client.aclose()

    assert asyncio.run(work()) == ("v", True)
    assert raw.get(cache.wire_key("k")) == encoded(cache, "v")


def test_a_refill_never_overwrites_a_value_written_meanwhile(
    cache: FastCache, memcached: MemcachedServer, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.set("k", "old")
    key = cache.wire_key("k")
    landed(cache)
    memcached.flush()
    store = tiered(cache)
    original_meta_set = store.blocking.meta_set
    newer = encoded(cache, "newer")

    async def meta_set_after_a_concurrent_write(*args: Any, **kwargs: Any) -> Any:
        # Another client writes the key between the lease and the refill's store.
        raw.set(key, *newer)
        return await original_meta_set(*args, **kwargs)

    monkeypatch.setattr(store.blocking, "meta_set", meta_set_after_a_concurrent_write)
    assert cache.get("k") == "old"  # the disk's answer to the miss
    monkeypatch.undo()
    assert raw.get(key) == newer  # the refill's store carried the lease's CAS: refused
    assert cache.get("k") == "newer"
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["refills"] == 0


def test_an_entry_older_than_disk_max_staleness_is_not_served(
    server: MemcachedServer, disk_directory: str
) -> None:
    # Long enough that the first read below comes within it on a busy machine too (a CI
    # run beside benchmarks took longer than 0.2 s from the set to that read).
    staleness = 1.0
    cache = make_cache(server.location, disk_directory, disk_max_staleness=staleness)
    cache.set("k", "v")
    cache.set("other", "x")
    entry = on_disk(cache, "k")
    assert entry is not None
    later = on_disk(cache, "other")  # written after k: stale last
    assert later is not None
    server.flush()
    assert cache.get("k") == "v"  # from disk: a copy is kept in memory, and ages alike
    wait_until(lambda: time.time() - later.written_at > staleness, "both entries are stale")
    # On a memcached miss.
    server.flush()
    assert cache.get("k") is None
    assert Raw(server).get(cache.wire_key("k")) is None  # not put back either
    # With the node out.
    server.kill()
    assert cache.get("k") is None
    assert node_state(cache, server.location)["state"] == "out"
    assert cache.get_many(["k", "other"]) == {}
    # The entry is still there: only too old to answer.
    assert on_disk(cache, "k") is not None


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"disk_read_copies": 0},
        # Reads answered from copies would not count for the eviction: none are kept.
        {"disk_eviction_policy": "least-recently-used"},
        {"disk_eviction_policy": "least-frequently-used"},
    ],
)
def test_a_read_from_disk_keeps_a_copy_in_memory_within_disk_read_copies(
    server: MemcachedServer, disk_directory: str, options: dict[str, Any]
) -> None:
    cache = make_cache(server.location, disk_directory, **options)
    cache.set("k", "v" * 100)
    landed(cache)
    server.flush()
    assert cache.get("k") == "v" * 100  # a miss, answered from disk
    stats = cache.tier_stats()
    assert stats is not None
    if options:
        assert (stats["read_copies"], stats["read_copies_bytes"]) == (0, 0)
    else:
        assert stats["read_copies"] == 1
        assert stats["read_copies_bytes"] > 100
    # A copy or not, the key's next write is what answers.
    cache.set("k", "w")
    landed(cache)
    server.flush()
    assert cache.get("k") == "w"


def test_disk_write_delay_is_how_long_a_write_waits_before_it_lands(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache(server.location, disk_directory, disk_write_delay=30.0)
    behind = tiered(cache).behind
    assert behind.min_age == 30.0
    cache.set("k", "v")
    assert len(behind) == 1  # queued, due in about 30 s (the default: 1 s)
    assert 29.0 < behind._seconds_to_age(behind._queue) <= 30.0
    assert tiered(cache).disk.get(cache.wire_key("k")) is None
    entry = on_disk(cache, "k")  # after a flush, which lands what is queued, whatever its age
    assert entry is not None
    assert entry.data == encoded(cache, "v")[0]


def test_a_copy_in_memory_expires_with_its_entry(disk_directory: str) -> None:
    location = f"127.0.0.1:{free_port()}"  # nothing listens here: every read is the disk's
    cache = make_cache(location, disk_directory)
    cache.set("k", "v", timeout=1)
    assert cache.get("k") == "v"
    assert cache.get("k") == "v"  # from the copy kept by the first read
    store, wire = tiered(cache), cache.wire_key("k")
    assert store.copies.get(wire, store.stamps.current(wire)) is not None
    expire_at = time.time() + 1
    wait_until(lambda: time.time() > expire_at + 0.01, "the entry expired", timeout=5)
    assert cache.get("k") is None


def test_a_copy_in_memory_misses_once_another_key_of_its_slot_was_written(
    disk_directory: str,
) -> None:
    # Keys sharing a slot of the write stamps hide each other's older entries (a miss);
    # their copies alike.
    from django_fastcache.disk.stamps import slot_of

    location = f"127.0.0.1:{free_port()}"
    cache = make_cache(location, disk_directory)
    seen: dict[int, str] = {}
    for n in itertools.count():
        name = f"key{n}"
        slot = slot_of(cache.wire_key(name))
        if slot in seen:
            first, second = seen[slot], name
            break
        seen[slot] = name
    cache.set(first, "first")
    assert cache.get(first) == "first"  # copied
    cache.set(second, "second")
    assert cache.get(first) is None  # not "first", from its copy
    assert cache.get(second) == "second"


def test_a_node_that_is_out_is_not_connected_to(disk_directory: str) -> None:
    location = f"127.0.0.1:{free_port()}"  # nothing listens here
    cache = make_cache(location, disk_directory)
    cache.set("k", "v")  # fails to connect, marks the node out, goes to disk
    assert node_state(cache, location)["state"] == "out"
    with connects_from_this_thread() as attempts:
        assert cache.get("k") == "v"
        assert cache.get_many(["k", "absent"]) == {"k": "v"}
        assert cache.has_key("k")
        cache.set("n", 1)
        assert cache.incr("n", 4) == 5
        assert cache.add("a", 1) is True
        assert cache.touch("a", 100) is True
        assert cache.delete("a") is True
        cache.set_many({"m": 1})
        cache.delete_many(["m"])

        async def work() -> Any:
            return await cache.aget("k"), await cache.aincr("n")

        assert asyncio.run(work()) == ("v", 6)
    # Not one connect from the caller's thread: probing is the maintenance thread's.
    assert attempts == []
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["fallbacks"] >= 4
    assert stats["nodes_marked_out"] == 1


def test_get_many_answers_every_key_when_the_node_comes_back_during_the_call(
    disk_directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = f"127.0.0.1:{free_port()}"  # nothing listens: the node stays out
    cache = make_cache(location, disk_directory)
    keys = ["a", "b", "c"]
    cache.set_many(dict.fromkeys(keys, "v"))
    store = tiered(cache)
    real_epoch = store.states.epoch
    caller = threading.get_ident()
    seen: list[int] = []

    def epoch(node: int) -> int:
        if threading.get_ident() != caller:
            return real_epoch(node)  # the maintenance thread sees the real state
        # The node is out when get_many looks at it, and is marked up right after.
        seen.append(real_epoch(node) | 1 if not seen else real_epoch(node) & ~1)
        return seen[-1]

    monkeypatch.setattr(store, "states", twin(store.states, epoch=epoch))
    assert cache.get_many(keys) == dict.fromkeys(keys, "v")
    assert seen[0] & 1  # it saw the node out


def gets_sent(cache: FastCache, location: str) -> int:
    """Retrievals the cache's two clients sent to the node at ``location``."""
    metrics = cache.metrics()
    return sum(
        stats.calls
        for snapshot in (metrics["blocking"], metrics["async"])
        for node_id, node in snapshot.nodes.items()
        if node_id == location
        for name, stats in node.operations.items()
        if name == "get"
    )


@pytest.mark.parametrize("api", ["sync", "async"])
def test_get_many_asks_a_hung_node_once_and_keeps_the_other_nodes_answers(
    disk_directory: str, api: str
) -> None:
    # The hung node is marked out and its keys answered from disk; the other node's
    # answers stand (they were once asked again key by key, a timeout more per hung node).
    with MemcachedServer() as hung, MemcachedServer() as fine:
        cache = make_cache([hung.location, fine.location], disk_directory, operation_timeout=0.3)
        cluster = cache.client.cluster
        keys = [f"k{i}" for i in range(20)]
        cache.set_many({key: f"v {key}" for key in keys})
        landed(cache)
        nodes = {cluster.node_ids[cluster.node_index(cache.wire_key(k))] for k in keys}
        assert nodes == {hung.location, fine.location}
        before = gets_sent(cache, hung.location), gets_sent(cache, fine.location)
        hung.pause()
        try:
            found = cache.get_many(keys) if api == "sync" else asyncio.run(cache.aget_many(keys))
        finally:
            hung.resume()
        assert found == {key: f"v {key}" for key in keys}  # the hung node's from disk
        assert (gets_sent(cache, hung.location), gets_sent(cache, fine.location)) == (
            before[0] + 1,
            before[1] + 1,
        )
        assert node_state(cache, hung.location)["state"] == "out"
        assert node_state(cache, fine.location)["state"] == "up"


def requests_sent(cache: FastCache, location: str) -> dict[str, int]:
    """Requests the cache's two clients sent to the node at ``location``, by operation."""
    metrics = cache.metrics()
    sent: dict[str, int] = {}
    for snapshot in (metrics["blocking"], metrics["async"]):
        for node_id, node in snapshot.nodes.items():
            if node_id == location:
                for name, stats in node.operations.items():
                    if name != "version":  # the background probes of a node out
                        sent[name] = sent.get(name, 0) + stats.calls
    return sent


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("call", ["delete_many", "clear"])
def test_a_write_over_many_nodes_asks_a_hung_node_once(
    disk_directory: str, api: str, call: str
) -> None:
    # The hung node is marked out and its part journaled (its keys' deletes, or its flush);
    # the other node's part stands. Both calls once asked a failed node again, a timeout
    # more per hung node.
    with MemcachedServer() as hung, MemcachedServer() as fine:
        cache = make_cache([hung.location, fine.location], disk_directory, operation_timeout=0.3)
        keys = [f"k{i}" for i in range(20)]
        cache.set_many({key: f"v {key}" for key in keys})
        landed(cache)
        before = requests_sent(cache, hung.location), requests_sent(cache, fine.location)
        hung.pause()
        try:
            if call == "delete_many":
                run = cache.delete_many(keys) if api == "sync" else cache.adelete_many(keys)
            else:
                run = cache.clear() if api == "sync" else cache.aclear()
            if api == "async":
                asyncio.run(run)  # type: ignore[arg-type]
        finally:
            hung.resume()
        after = requests_sent(cache, hung.location), requests_sent(cache, fine.location)
        hung_asked, fine_asked = (
            {op: n - earlier.get(op, 0) for op, n in later.items() if n != earlier.get(op, 0)}
            for earlier, later in zip(before, after)
        )
        assert sum(hung_asked.values()) == 1, hung_asked  # one request each, of one kind
        assert hung_asked == fine_asked
        assert node_state(cache, hung.location)["state"] == "out"
        assert node_state(cache, fine.location)["state"] == "up"
        assert cache.get_many(keys) == {}  # from disk for the hung node's, none left
        wait_until(lambda: node_state(cache, hung.location)["state"] == "up", "the replay")
        assert cache.get_many(keys) == {}  # the replay deleted (or flushed) the hung node's


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_value_over_this_process_limit_leaves_the_node_up(disk_directory: str, api: str) -> None:
    # A deploy raised max_value_size (and memcached's -I): an old process reads a value a
    # new one stored. Not the node's fault: it stays up for every process, and the disk
    # tier answers.
    with MemcachedServer(item_size_max="4m") as server:
        writer = make_cache(server.location, disk_directory, max_value_size=4 * 1024 * 1024)
        reader = make_cache(server.location, disk_directory)
        value = os.urandom(2 * 1024 * 1024)  # (incompressible: over the limit as stored)
        writer.set("big", value)
        landed(writer)
        got = reader.get("big") if api == "sync" else asyncio.run(reader.aget("big"))
        assert got == value  # from disk
        assert node_state(reader, server.location)["state"] == "up"
        # Without the tier, the read raises, naming the option.
        tierless = FastCache(server.location, {"OPTIONS": {"disk_tier": False}})
        with pytest.raises(ReplyTooLargeError, match="max_value_size"):
            tierless.get("big")


# -- writes: both tiers hold the same -----------------------------------------------------------


def both_tiers(cache: FastCache, raw: Raw, key: str) -> tuple[Any, Any]:
    """(what memcached holds, what the disk holds) for ``key``, as (data, flags) or None."""
    entry = on_disk(cache, key)
    return raw.get(cache.wire_key(key)), None if entry is None else (entry.data, entry.flags)


def assert_expires(entry: DiskEntry | None, ttl: float, before: float, after: float) -> None:
    """``entry`` expires ``ttl`` seconds after a moment between ``before`` and ``after``
    (the call that gave it its expiry ran between them), however long landing took."""
    assert entry is not None
    assert entry.expire_at is not None
    assert before + ttl <= entry.expire_at <= after + ttl


@pytest.mark.parametrize("api", ["sync", "async"])
def test_set_many_of_two_keys_making_one_keeps_the_last_on_disk_too(
    cache: FastCache, memcached: MemcachedServer, api: str
) -> None:
    # 7 and "7" make the same key: one write, the last, as two sets would leave; its disk
    # copy answers once memcached loses the key (two writes of one key in one call left
    # none).
    data = {7: "first", "7": "last"}
    assert (cache.set_many(data) if api == "sync" else asyncio.run(cache.aset_many(data))) == []
    landed(cache)
    memcached.flush()
    assert cache.get(7) == "last"


def test_set_writes_both_tiers(cache: FastCache, raw: Raw) -> None:
    before = time.time()
    cache.set("k", {"a": [1, 2]}, timeout=1000)
    after = time.time()
    assert both_tiers(cache, raw, "k") == (encoded(cache, {"a": [1, 2]}),) * 2
    assert_expires(on_disk(cache, "k"), 1000, before, after)
    cache.set("k", "replaced", timeout=None)
    assert both_tiers(cache, raw, "k") == (encoded(cache, "replaced"),) * 2
    entry = on_disk(cache, "k")
    assert entry is not None
    assert entry.expire_at is None
    cache.set("k", "gone", timeout=0)
    assert both_tiers(cache, raw, "k") == (None, None)


def test_add_writes_both_tiers_only_when_it_adds(cache: FastCache, raw: Raw) -> None:
    assert cache.add("k", "first") is True
    assert both_tiers(cache, raw, "k") == (encoded(cache, "first"),) * 2
    assert cache.add("k", "second") is False
    assert both_tiers(cache, raw, "k") == (encoded(cache, "first"),) * 2


def test_touch_changes_the_expiry_in_both_tiers(cache: FastCache, raw: Raw) -> None:
    cache.set("k", "v", timeout=10)
    before = time.time()
    assert cache.touch("k", 2000) is True
    after = time.time()
    ttl = raw.ttl(cache.wire_key("k"))
    assert ttl is not None
    assert 2000 - TTL_SLACK <= ttl <= 2000
    assert_expires(on_disk(cache, "k"), 2000, before, after)
    assert cache.touch("k", None) is True
    entry = on_disk(cache, "k")
    assert entry is not None
    assert entry.expire_at is None
    assert raw.ttl(cache.wire_key("k")) == -1
    assert cache.touch("k", 0) is True  # expired at once, in both
    assert both_tiers(cache, raw, "k") == (None, None)
    assert cache.touch("k", 100) is False


def assert_the_win_is_free(cache: FastCache, key: str) -> None:
    """``key`` holds a stale (invalidated) value whose win nobody has taken: the next
    lease request takes it (and gives it back), and get_or_set's caller then computes."""
    store = tiered(cache)
    wire = cache.wire_key(key)
    held = run_blocking(store.blocking.meta_get(wire, cas=True, vivify=30))
    assert held is not None
    assert held.stale
    assert held.win  # the earlier call gave its win back: this request took it
    run_blocking(store.blocking.meta_delete(wire, cas=held.cas, invalidate=True))
    assert cache.get_or_set(key, lambda: "computed") == "computed"
    assert cache.get(key) == "computed"


@pytest.mark.parametrize("api", ["sync", "async"])
def test_touch_of_a_key_memcached_lost_puts_it_back_with_the_new_expiry(
    cache: FastCache, memcached: MemcachedServer, raw: Raw, api: str
) -> None:
    cache.set("k", "v", timeout=10)
    landed(cache)
    memcached.flush()
    before = time.time()
    if api == "sync":
        assert cache.touch("k", 2000) is True  # get would answer it: touch finds it
    else:
        assert asyncio.run(cache.atouch("k", 2000)) is True
    after = time.time()
    assert raw.get(cache.wire_key("k")) == encoded(cache, "v")
    ttl = raw.ttl(cache.wire_key("k"))
    assert ttl is not None
    assert 2000 - TTL_SLACK <= ttl <= 2000
    landed(cache)
    assert_expires(on_disk(cache, "k"), 2000, before, after)
    memcached.flush()
    cache.delete("k")
    assert cache.touch("k", 100) is False  # in neither tier


@pytest.mark.parametrize("api", ["sync", "async"])
def test_touch_of_an_invalidated_value_leaves_the_win_for_get_or_set(
    cache: FastCache, api: str
) -> None:
    cache.set("k", "old", timeout=1000)
    assert cache.invalidate("k")
    if api == "sync":
        assert cache.touch("k", 500) is True
    else:
        assert asyncio.run(cache.atouch("k", 500)) is True
    assert_the_win_is_free(cache, "k")


def test_delete_and_delete_many_remove_from_both_tiers(cache: FastCache, raw: Raw) -> None:
    cache.set_many({"a": 1, "b": 2, "c": 3, "d": 4})
    landed(cache)
    assert cache.delete("a") is True
    assert both_tiers(cache, raw, "a") == (None, None)
    assert cache.delete("a") is False
    cache.delete_many(["b", "c", "absent"])
    for key in ("b", "c"):
        assert both_tiers(cache, raw, key) == (None, None)
    # The deletes' disk copies landed: the rows are gone, not only hidden by their stamps.
    disk = tiered(cache).disk
    assert [disk.get(cache.wire_key(key)) for key in ("a", "b", "c")] == [None] * 3
    assert disk.get(cache.wire_key("d")) is not None
    assert both_tiers(cache, raw, "d") == (encoded(cache, 4),) * 2


def test_set_many_writes_both_tiers(cache: FastCache, raw: Raw) -> None:
    data = {f"k{n}": f"value {n}" for n in range(20)}
    assert cache.set_many(data, timeout=500) == []
    for key, value in data.items():
        assert both_tiers(cache, raw, key) == (encoded(cache, value),) * 2


def test_incr_and_decr_keep_both_tiers_equal_and_the_ttl(cache: FastCache, raw: Raw) -> None:
    cache.set("n", 10, timeout=1000)
    before = on_disk(cache, "n")
    assert before is not None
    assert cache.incr("n", 5) == 15
    assert cache.decr("n", 20) == 0  # memcached stops at zero; so does the disk tier
    assert cache.incr("n", 7) == 7
    # memcached counts in place and pads a number that got shorter with spaces ("7 ").
    in_memcached, on_the_disk = both_tiers(cache, raw, "n")
    assert in_memcached[0].rstrip(b" ") == b"7"
    assert in_memcached[1] == FLAG_INTEGER
    assert on_the_disk == (b"7", FLAG_INTEGER)
    assert cache.get("n") == 7
    after = on_disk(cache, "n")
    assert after is not None
    # The TTL is kept on disk, as memcached keeps it.
    assert after.expire_at == pytest.approx(before.expire_at, abs=1)
    ttl = raw.ttl(cache.wire_key("n"))
    assert ttl is not None
    assert 1000 - TTL_SLACK <= ttl <= 1000
    cache.set("forever", 1, timeout=None)
    assert cache.incr("forever") == 2
    forever = on_disk(cache, "forever")
    assert forever is not None
    assert forever.expire_at is None


def test_incr_of_a_key_memcached_lost_counts_on_the_disk_value(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    cache.set("n", 41, timeout=1000)
    landed(cache)
    memcached.flush()
    assert cache.incr("n") == 42
    assert both_tiers(cache, raw, "n") == ((b"42", FLAG_INTEGER),) * 2


def misses_counted(raw: Raw) -> tuple[int, int]:
    """memcached's own count of the increments and decrements it found no key for, and of
    the gets and touches (an ``mg``, a touch's included) it found none for. (Versions count
    an ``mg … T`` miss as a get's or as a touch's: both are summed.)"""
    stats = raw.stats()
    return (
        stats["incr_misses"] + stats["decr_misses"],
        stats["get_misses"] + stats["touch_misses"],
    )


def test_incr_and_touch_of_a_key_missing_in_both_tiers_ask_memcached_once(
    cache: FastCache, raw: Raw
) -> None:
    # Twice each: the second finds the slot stamped by the first (a disk read, no entry).
    # (A touch sent one mg before too: its half checks the outcome settled without the
    # coroutine, not a request saved.)
    for _round in range(2):
        counted, gotten = misses_counted(raw)
        with pytest.raises(ValueError):
            cache.incr("absent")
        with pytest.raises(ValueError):
            cache.decr("absent")
        assert misses_counted(raw) == (counted + 2, gotten)
        assert cache.touch("absent", 100) is False
        assert misses_counted(raw) == (counted + 2, gotten + 1)

        async def both() -> bool:
            with pytest.raises(ValueError):
                await cache.aincr("absent")
            return await cache.atouch("absent", 100)

        assert asyncio.run(both()) is False
        assert misses_counted(raw) == (counted + 3, gotten + 2)
    assert cache.get("absent") is None
    assert on_disk(cache, "absent") is None


@pytest.mark.parametrize("delta", [2**64, 1.5])
def test_an_incr_by_a_delta_memcached_cannot_count_by_leaves_the_key_as_it_was(
    cache: FastCache, memcached: MemcachedServer, delta: Any
) -> None:
    # Refused before the key is stamped, in both APIs: its disk copy still answers once
    # memcached has lost the key (a stamp would have hidden it).
    cache.set("n", 41, timeout=1000)
    landed(cache)
    with pytest.raises(InvalidArgumentError):
        cache.incr("n", delta)
    with pytest.raises(InvalidArgumentError):
        asyncio.run(cache.aincr("n", delta))
    memcached.flush()
    assert cache.get("n") == 41


def test_add_over_a_value_memcached_lost_is_refused_and_puts_it_back(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    cache.set("n", 41, timeout=1000)
    landed(cache)
    memcached.flush()
    # get would answer 41 from disk: add refuses, in both APIs, and the value is back in
    # memcached (never the add's own).
    assert cache.add("n", 0) is False
    assert raw.get(cache.wire_key("n")) == (b"41", FLAG_INTEGER)
    memcached.flush()
    assert asyncio.run(cache.aadd("n", 0)) is False
    assert cache.incr("n") == 42
    assert both_tiers(cache, raw, "n") == ((b"42", FLAG_INTEGER),) * 2


def test_add_over_another_callers_stub_is_refused_while_the_disk_holds_a_value(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    cache.set("n", 41, timeout=1000)
    landed(cache)
    memcached.flush()
    store = tiered(cache)
    wire = cache.wire_key("n")
    # Another process's refill of the disk value holds the key's lease.
    lease = run_blocking(store.blocking.meta_get(wire, cas=True, vivify=30))
    assert lease is not None
    assert lease.win
    assert cache.add("n", 0) is False
    assert cache.get("n") == 41  # the stub reads as a miss: the disk answers
    # The refill lands; the count goes on from it.
    run_blocking(store.blocking.meta_set(wire, b"41", flags=FLAG_INTEGER, cas=lease.cas))
    assert cache.incr("n") == 42


def test_add_over_a_stub_with_nothing_on_disk_replaces_it(
    cache: FastCache, memcached: MemcachedServer, raw: Raw
) -> None:
    store = tiered(cache)
    wire = cache.wire_key("fresh")
    # A get_or_set computing the missing key holds its lease: add wins over it, as set would.
    lease = run_blocking(store.blocking.meta_get(wire, cas=True, vivify=30))
    assert lease is not None
    assert lease.win
    assert cache.add("fresh", 7) is True
    assert both_tiers(cache, raw, "fresh") == (encoded(cache, 7),) * 2
    assert cache.add("fresh", 8) is False
    assert cache.get("fresh") == 7


@pytest.mark.parametrize("api", ["sync", "async"])
def test_add_over_an_invalidated_value_is_refused_and_leaves_the_win_for_get_or_set(
    cache: FastCache, raw: Raw, api: str
) -> None:
    """invalidate() marks the value stale: add still finds the key holding a value and is
    refused; the win its lease request took goes back, so get_or_set's next caller wins
    and computes the new value."""
    cache.set("k", "old", timeout=1000)
    assert cache.invalidate("k")
    if api == "sync":
        assert cache.add("k", "new") is False
    else:
        assert asyncio.run(cache.aadd("k", "new")) is False
    assert_the_win_is_free(cache, "k")


def test_add_after_a_replay_deleted_the_counter_counts_on(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache(server.location, disk_directory, operation_timeout=0.5)
    cache.set("hits", 0, timeout=None)
    assert cache.incr("hits") == 1
    landed(cache)
    server.pause()  # memcached keeps its count, 1
    assert cache.incr("hits") == 2  # times out, marks the node out: journaled, on disk
    assert node_state(cache, server.location) == {"state": "out", "journal_length": 1}
    server.resume()
    wait_for_state(cache, server.location, "up")  # the replay deleted the key in memcached
    assert Raw(server).get(cache.wire_key("hits")) is None
    assert cache.add("hits", 0) is False
    assert cache.incr("hits") == 3
    assert cache.get("hits") == 3


def test_clear_empties_both_tiers(cache: FastCache, raw: Raw) -> None:
    cache.set_many({"a": 1, "b": 2})
    cache.clear()
    assert both_tiers(cache, raw, "a") == (None, None)
    assert both_tiers(cache, raw, "b") == (None, None)
    assert cache.get_many(["a", "b"]) == {}


@pytest.mark.parametrize(
    "too_large",
    [
        pytest.param(b"x" * (MIB + 1), id="over-max_value_size"),
        pytest.param(b"y" * (MIB - 16), id="refused-by-memcached"),
    ],
)
def test_a_failed_set_leaves_the_old_value_in_neither_tier(
    cache: FastCache, raw: Raw, too_large: bytes
) -> None:
    cache.set("k", "old")
    with pytest.raises(ValueTooLargeError):
        cache.set("k", too_large)
    assert both_tiers(cache, raw, "k") == (None, None)
    assert cache.get("k") is None
    cache.set("m", "old")
    assert cache.set_many({"m": too_large, "fine": 1}) == ["m"]
    assert both_tiers(cache, raw, "m") == (None, None)
    assert both_tiers(cache, raw, "fine") == (encoded(cache, 1),) * 2


def test_a_failed_async_set_leaves_the_old_value_in_neither_tier(
    cache: FastCache, raw: Raw
) -> None:
    async def work() -> None:
        try:
            await cache.aset("k", "old")
            with pytest.raises(ValueTooLargeError):
                await cache.aset("k", b"z" * (MIB - 16))
        finally:
            await cache.client.aclose()

    asyncio.run(work())
    assert both_tiers(cache, raw, "k") == (None, None)


# -- outages: the journal ---------------------------------------------------------------------


def test_writes_and_deletes_while_a_node_is_out_are_journaled(
    server: MemcachedServer, disk_directory: str, signals_sent: list[Any]
) -> None:
    cache = make_cache(server.location, disk_directory)
    cache.set_many({"a": 1, "b": 2, "c": 3})
    landed(cache)
    server.kill()
    cache.set("a", 10)  # fails, marks the node out, is journaled
    assert node_state(cache, server.location) == {"state": "out", "journal_length": 1}
    assert [(name, kwargs["node"]) for name, kwargs in signals_sent] == [
        ("node_out", server.location)
    ]
    assert signals_sent[0][1]["directory"] == disk_directory
    cache.delete("b")
    cache.set("new", "n")
    cache.incr("c")
    cache.add("added", 1)
    cache.touch("a", 100)
    cache.set_many({"m1": 1, "m2": 2})
    cache.delete_many(["m1"])
    journaled = {"a", "b", "new", "c", "added", "m1", "m2"}
    assert node_state(cache, server.location)["journal_length"] == len(journaled)
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["nodes_marked_out"] == 1
    assert stats["directory"] == disk_directory
    # Meanwhile the disk tier answers with the latest writes.
    assert cache.get_many(["a", "b", "c", "new", "added", "m1", "m2"]) == {
        "a": 10,
        "c": 4,
        "new": "n",
        "added": 1,
        "m2": 2,
    }


@pytest.mark.parametrize("delta", [2**64, 1.5, -0.25])
def test_an_incr_while_the_node_is_out_refuses_a_delta_memcached_would_refuse(
    server: MemcachedServer, disk_directory: str, delta: Any
) -> None:
    # The disk's count follows memcached's rules: an incr must not take a delta while a
    # node is out that it refuses while the node is up.
    cache = make_cache(server.location, disk_directory)
    cache.set("n", 41)
    landed(cache)
    server.kill()
    cache.set("other", 1)  # fails, marks the node out
    assert node_state(cache, server.location)["state"] == "out"
    with pytest.raises(InvalidArgumentError):
        cache.incr("n", delta)
    with pytest.raises(InvalidArgumentError):
        asyncio.run(cache.aincr("n", delta))
    assert cache.get("n") == 41
    assert cache.incr("n") == 42


def test_the_journal_survives_a_process_restart(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache(server.location, disk_directory)
    cache.set("a", 1)
    server.kill()
    cache.set("a", 2)
    cache.delete("b")
    cache.set("c", 3)
    assert node_state(cache, server.location)["journal_length"] == 3
    # Another process on the same directory (a restarted worker) sees the node out, the
    # journal waiting, and the values written during the outage.
    program = textwrap.dedent(
        """
        import json, sys
        import django
        from django.conf import settings
        settings.configure()
        django.setup()
        from django_fastcache.backends import FastCache
        options = {"disk_directory": sys.argv[2], "sign_values": False}
        cache = FastCache(sys.argv[1], {"OPTIONS": options})
        stats = cache.tier_stats()
        print(json.dumps({"node": stats["nodes"][sys.argv[1]], "a": cache.get("a")}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program, server.location, disk_directory],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"node": {"state": "out", "journal_length": 3}, "a": 2}
    # And a fresh store in this process, on the same directory, reads the same journal.
    tiered(cache).close()
    assert node_state(cache, server.location)["journal_length"] == 3


def journal_and_outage(
    server: MemcachedServer, cache: FastCache, raw: Raw
) -> tuple[dict[bytes, Any], list[bytes]]:
    """Write a, b, d (and e, f) through the cache; pause the node; during the outage write
    a, delete b, write c. Returns memcached's items before the outage and the keys
    journaled."""
    cache.set_many({"a": "before", "b": "before", "d": "untouched", "e": 1, "f": 2})
    before = {
        cache.wire_key(key): raw.get(cache.wire_key(key)) for key in ("a", "b", "d", "e", "f")
    }
    landed(cache)
    server.pause()
    cache.set("a", "during")  # times out, marks the node out, journaled
    cache.delete("b")
    cache.set("c", "during")
    return before, [cache.wire_key(key) for key in ("a", "b", "c")]


def test_the_replay_deletes_exactly_the_journaled_keys_before_the_node_is_marked_up(
    server: MemcachedServer,
    disk_directory: str,
    signals_sent: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = Raw(server)
    cache = make_cache(server.location, disk_directory, operation_timeout=0.5)
    before, journaled = journal_and_outage(server, cache, raw)
    assert node_state(cache, server.location) == {"state": "out", "journal_length": 3}
    store = tiered(cache)
    # What memcached holds at the moment the node is marked up (the probe's thread).
    at_mark_up: list[dict[bytes, Any]] = []
    original_mark_up = store.states.mark_up

    def mark_up(node: int) -> None:
        at_mark_up.append({key: raw.get(key) for key in [*before, cache.wire_key("c")]})
        original_mark_up(node)

    monkeypatch.setattr(store, "states", twin(store.states, mark_up=mark_up))
    # Which keys the replay deletes (a replay that fails part-way is tried again whole).
    replayed: list[list[bytes]] = []
    original_delete_many = store.blocking.delete_many_at

    async def delete_many(node: int, keys: Any) -> Any:
        replayed.append(list(keys))
        return await original_delete_many(node, keys)

    monkeypatch.setattr(store.blocking, "delete_many_at", delete_many)
    server.resume()
    wait_for_state(cache, server.location, "up")
    # The probe marks the node up, then counts the replay and sends node_back.
    wait_until(lambda: len(signals_sent) == 2, "node_back sent")
    # Exactly the journaled keys were deleted...
    assert replayed
    assert all(sorted(keys) == sorted(journaled) for keys in replayed)
    # ...and before the node was marked up. The set that timed out when the node went out
    # may still have been executed by memcached after it resumed (its bytes were in the
    # socket buffer): "a" may hold the value written during the outage; never the old one.
    assert len(at_mark_up) == 1
    held = at_mark_up[0]
    assert held.pop(cache.wire_key("a")) in (None, encoded(cache, "during"))
    assert held == {
        cache.wire_key("b"): None,
        cache.wire_key("c"): None,
        cache.wire_key("d"): before[cache.wire_key("d")],
        cache.wire_key("e"): before[cache.wire_key("e")],
        cache.wire_key("f"): before[cache.wire_key("f")],
    }
    assert node_state(cache, server.location) == {"state": "up", "journal_length": 0}
    backs = [kwargs for name, kwargs in signals_sent if name == "node_back"]
    assert backs == [
        {"sender": FastCache, "signal": node_back, "node": server.location,
         "directory": disk_directory, "replayed_keys": 3}
    ]  # fmt: skip
    assert [name for name, _kwargs in signals_sent] == ["node_out", "node_back"]
    stats = cache.tier_stats()
    assert stats is not None
    assert (stats["replays"], stats["replayed_keys"]) == (1, 3)
    # The latest values, memcached refilled from disk where the replay emptied it.
    assert cache.get_many(["a", "b", "c", "d"]) == {"a": "during", "c": "during", "d": "untouched"}
    assert raw.get(cache.wire_key("a")) == encoded(cache, "during")


def test_a_partitioned_node_never_shows_a_value_from_before_the_outage(
    server: MemcachedServer, disk_directory: str
) -> None:
    raw = Raw(server)
    cache = make_cache(server.location, disk_directory, operation_timeout=0.5)
    journal_and_outage(server, cache, raw)
    expected = {"a": "during", "c": "during", "d": "untouched", "e": 1, "f": 2}
    keys = ["a", "b", "c", "d", "e", "f"]
    # Read throughout: during the outage, across the probe bringing the node back, after.
    seen: list[dict[str, Any]] = [cache.get_many(keys)]
    server.resume()  # the process kept its data: a and b still hold "before" there
    deadline = time.monotonic() + PROBE_DEADLINE
    while node_state(cache, server.location)["state"] == "out":
        assert time.monotonic() < deadline, "the node did not come back"
        seen.append(cache.get_many(keys))
        seen.append({key: value for key in keys if (value := cache.get(key)) is not None})
    for _ in range(20):
        seen.append(cache.get_many(keys))
        seen.append({key: value for key in keys if (value := cache.get(key)) is not None})
    assert all(answer == expected for answer in seen), [a for a in seen if a != expected][:3]
    assert len(seen) > 40
    # memcached itself no longer holds the pre-outage values.
    assert raw.get(cache.wire_key("b")) is None
    assert raw.get(cache.wire_key("a")) == encoded(cache, "during")


def test_a_restarted_node_comes_back_after_its_replay(
    server: MemcachedServer, disk_directory: str, signals_sent: list[Any]
) -> None:
    raw = Raw(server)
    cache = make_cache(server.location, disk_directory)
    cache.set_many({"a": 1, "b": 2})
    landed(cache)
    server.kill()
    cache.set("a", 10)
    cache.delete("b")
    assert node_state(cache, server.location) == {"state": "out", "journal_length": 2}
    server.restart()  # same port, empty
    wait_for_state(cache, server.location, "up")
    # The signal follows the state change (sent once the replay returned).
    wait_until(lambda: len(signals_sent) == 2, "node_back sent")
    assert node_state(cache, server.location)["journal_length"] == 0
    assert [(name, kwargs["node"]) for name, kwargs in signals_sent] == [
        ("node_out", server.location),
        ("node_back", server.location),
    ]
    # Every signal's sender is the backend class, as django_fastcache.signals says.
    assert {kwargs["sender"] for _name, kwargs in signals_sent} == {FastCache}
    assert cache.get_many(["a", "b"]) == {"a": 10}
    assert raw.get(cache.wire_key("a")) == encoded(cache, 10)  # refilled from disk
    cache.set("b", 3)  # and writes go to memcached again
    assert raw.get(cache.wire_key("b")) == encoded(cache, 3)


def test_a_clear_while_a_node_is_out_flushes_it_before_it_is_back(
    server: MemcachedServer, disk_directory: str
) -> None:
    raw = Raw(server)
    cache = make_cache(server.location, disk_directory, operation_timeout=0.5)
    cache.set_many({"a": 1, "b": 2})
    server.pause()
    cache.clear()  # memcached cannot be flushed now: the flush is journaled
    assert node_state(cache, server.location) == {"state": "out", "journal_length": 1}
    assert cache.get_many(["a", "b"]) == {}
    server.resume()
    wait_for_state(cache, server.location, "up")
    # The node kept its data through the pause; the replay flushed it.
    assert raw.get(cache.wire_key("a")) is None
    assert raw.get(cache.wire_key("b")) is None
    assert cache.get_many(["a", "b"]) == {}
    stats = cache.tier_stats()
    assert stats is not None
    assert (stats["replays"], stats["replayed_keys"]) == (1, 0)  # flushed, no key deleted


def test_incr_while_a_node_is_out_keeps_the_ttl_on_disk(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache(server.location, disk_directory)
    cache.set("n", 1, timeout=1000)
    before = on_disk(cache, "n")
    assert before is not None
    server.kill()
    assert cache.incr("n", 9) == 10
    assert cache.decr("n", 3) == 7
    after = on_disk(cache, "n")
    assert after is not None
    assert after.data == b"7"
    assert after.expire_at == pytest.approx(before.expire_at, abs=1)
    assert node_state(cache, server.location)["journal_length"] == 1
    with pytest.raises(ValueError, match="not found"):
        cache.incr("absent")


# -- the probe keeps going whatever happens -----------------------------------------------------


def test_a_replay_that_fails_leaves_the_node_out_and_its_journal_intact(
    server: MemcachedServer, disk_directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make_cache(server.location, disk_directory)
    cache.set("a", 1)
    store = tiered(cache)
    node = store.cluster.node_ids.index(server.location)
    # Keep the maintenance thread away: this test calls bring_back itself.
    maintenance.unregister(store)
    server.kill()
    cache.set("a", 2)
    server.restart()

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise ServerError("out of memory storing object")

    with monkeypatch.context() as patch:
        patch.setattr(store.blocking, "delete_many_at", refused)
        assert store.bring_back(node) is None
    assert node_state(cache, server.location) == {"state": "out", "journal_length": 1}
    assert store.bring_back(node) == 1
    assert node_state(cache, server.location) == {"state": "up", "journal_length": 0}


def test_the_probe_goes_on_after_an_unexpected_error(
    server: MemcachedServer, disk_directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make_cache(server.location, disk_directory)
    cache.set("a", 1)
    store = tiered(cache)
    original = store.blocking.version
    calls: list[int] = []

    async def flaky(**kwargs: Any) -> Any:
        # The probe's first request: a reply that does not parse (the replay gives up,
        # probed again later), then a bug (an exception the replay does not expect).
        calls.append(len(calls))
        if len(calls) == 1:
            raise ProtocolError("a reply that does not parse")
        if len(calls) == 2:
            raise RuntimeError("a bug")
        return await original(**kwargs)

    monkeypatch.setattr(store, "blocking", twin(store.blocking, version=flaky))
    server.kill()
    cache.set("a", 2)
    server.restart()
    wait_for_state(cache, server.location, "up")
    assert len(calls) >= 3


def test_the_maintenance_thread_lets_go_of_a_store_nothing_else_holds(
    disk_directory: str,
) -> None:
    # The thread holds its stores weakly (through a handle the store holds in turn), so
    # a store dropped without unregistering is not kept alive by it. (No write and no
    # store.close(): the writer behind's thread, once started, holds its store.)
    cache = make_cache(f"127.0.0.1:{free_port()}", disk_directory)
    store = tiered(cache)
    handle = weakref.ref(cast(object, store.maintained))
    with fastcache._shared_lock:
        doomed = [key for key, shared in fastcache._shared.items() if shared.tiered is store]
        stacks = [fastcache._shared.pop(key) for key in doomed]
    assert len(stacks) == 1
    stacks[0].blocking.close_thread_connections()
    store.disk.close()
    store.journal.close()
    del cache, store, stacks
    with maintenance._round:  # no round holding the store meanwhile
        gc.collect()
    assert handle() is None


def test_a_tier_whose_node_states_cannot_be_mapped_is_not_built(disk_directory: str) -> None:
    # States of the process's own would not see the outages the others mark.
    nodes = Path(disk_directory) / "nodes"
    (nodes / "distrust.state").mkdir(parents=True)
    cache = make_cache(f"127.0.0.1:{free_port()}", disk_directory)
    with pytest.raises(ImproperlyConfigured, match=r"node states at .*nodes cannot be mapped"):
        cache.get("k")


@pytest.mark.parametrize("api", ["sync", "async"])
def test_an_incr_memcached_refuses_on_digits_raises_its_refusal_not_a_miss(
    memcached: MemcachedServer, disk_directory: str, api: str
) -> None:
    """Digits memcached will not count (beyond 2**64 - 1, stored unsigned as text): the
    refusal is raised once it repeats, where the increment took it for a stub replaced
    meanwhile, tried again and again, and reported the key missing."""
    cache = make_cache(memcached.location, disk_directory)
    cache.set("big", "18446744073709551616")  # unsealed text (make_cache), all digits

    async def incr_async() -> int:
        try:
            return await cache.aincr("big")
        finally:
            await cache.client.aclose()

    def incr() -> int:
        return cache.incr("big") if api == "sync" else asyncio.run(incr_async())

    with pytest.raises(TypeError):  # NonIntegerValueError, as with the tier off
        incr()
    assert cache.get("big") == "18446744073709551616"


@pytest.mark.parametrize(
    ("api", "protocol"), [("sync", "meta"), ("async", "meta"), ("sync", "classic")]
)
def test_an_incr_memcached_refuses_on_text_keeps_the_key_s_disk_copy(
    server: MemcachedServer, disk_directory: str, api: str, protocol: str
) -> None:
    """The refused increment stamped the key before it asked, which hid the disk copy;
    memcached kept its value, so the copy answers again: after memcached restarts empty,
    the key reads its value, not a miss."""
    cache = make_cache(server.location, disk_directory, protocol=protocol)
    cache.set("text", "not a number")
    landed(cache)

    async def incr_async() -> int:
        try:
            return await cache.aincr("text")
        finally:
            await cache.client.aclose()

    with pytest.raises(TypeError):  # NonIntegerValueError, as with the tier off
        cache.incr("text") if api == "sync" else asyncio.run(incr_async())
    assert on_disk(cache, "text") is not None
    server.restart()  # same port, empty
    assert cache.get("text") == "not a number"
