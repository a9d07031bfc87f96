"""FastCache with its disk tier, against real processes that fail.

memcached processes of each test's own are killed (SIGKILL), hung (SIGSTOP, keeping their
data), restarted empty, slowed down behind a delaying proxy or replaced by a fake that
answers garbage; the disk tier's directory is removed, made read-only, corrupted and
locked by other processes. In every case no exception reaches a caller, every call comes
back within its timeout (a loose bound: the timeout plus five seconds, what a loaded
machine may add, plus the disk tier's lock wait where it applies), and no read returns a
value older than the latest one written or deleted. Several-process cases run workers with
multiprocessing's "spawn" context; each configures Django itself. Conditions are waited
for by bounded polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import random
import shutil
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.proxy import DelayProxy
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import set_tree_mode
from tests.consistency.worker import configure_django

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.skipif(not MemcachedServer.available(), reason="memcached is not installed"),
]

T = TypeVar("T")

TIMEOUT = 0.2
#: How far past its timeout a call may come back, at most.
SLACK = 5.0
#: The disk tier waits this long, at most, for a shard lock another process holds.
LOCK_WAIT = 2 * TIMEOUT
OPTIONS: dict[str, Any] = {"operation_timeout": TIMEOUT, "connect_timeout": TIMEOUT}
#: For a cache whose memcached calls must be answered, but for the fault under test: a fake
#: server's thread starved of CPU on a loaded machine took longer than TIMEOUT.
ANSWERED: dict[str, Any] = {"operation_timeout": 1.0, "connect_timeout": 1.0}
#: Bounded waits for conditions (the probe's backoff tops out at 2 s; spawned workers
#: start slowly on a loaded machine).
PATIENCE = 60.0

SPAWN = multiprocessing.get_context("spawn")


def make_cache(locations: list[str], directory: str, **options: Any) -> FastCache:
    return FastCache(locations, {"OPTIONS": {**OPTIONS, "disk_directory": directory, **options}})


def wait_for(condition: Callable[[], bool], timeout: float = PATIENCE) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.01)
    return True


def timed(call: Callable[[], T], bound: float = TIMEOUT + SLACK) -> T:
    """``call()``, which must come back within ``bound`` seconds."""
    began = time.monotonic()
    result = call()
    took = time.monotonic() - began
    assert took < bound, f"the call took {took:.2f}s (bound {bound}s)"
    return result


def node_states(cache: FastCache) -> list[str]:
    stats = cache.tier_stats()
    assert stats is not None
    return [node["state"] for node in stats["nodes"].values()]


def stat(cache: FastCache, name: str) -> int:
    stats = cache.tier_stats()
    assert stats is not None
    return int(stats[name])


class Raw:
    """memcached seen from outside FastCache, with FastCache's routing and serializer."""

    def __init__(self, cache: FastCache, locations: list[str]) -> None:
        self.cache = cache
        self.client = BlockingClient(Cluster(locations, ClientSettings(timeout=2.0)))

    def get(self, key: str) -> Any:
        wire = self.cache.wire_key(key)
        item = run_blocking(self.client.get(wire))
        return None if item is None else self.cache._decode(wire, item.value, item.flags)

    def set(self, key: str, value: Any) -> None:
        wire = self.cache.wire_key(key)
        data, flags = self.cache._encode(value, wire)
        assert run_blocking(self.client.set(wire, data, flags=flags))

    def close(self) -> None:
        self.client.close_thread_connections()


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    with MemcachedServer() as started:
        yield started


def landed(cache: FastCache, timeout: float = 30.0) -> None:
    """Wait for the writer behind memcached to land the writes made so far."""
    tiered = cache._shared().tiered
    assert tiered is not None
    assert tiered.flush(timeout), "the writer behind did not land the queued writes"


def _join(processes: list[Any]) -> None:
    for process in processes:
        process.join(PATIENCE)
        if process.is_alive():
            process.terminate()
            process.join(5)


# -- memcached killed under load from several processes -------------------------------------


def _load_worker(
    index: int, location: str, directory: str, progress: Any, stop: Any, results: Any
) -> None:
    """Writes and reads keys of its own, checking every read against its last write."""
    configure_django([location], {**OPTIONS, "disk_directory": directory})
    from django.core.cache import cache

    metrics = cache._shared().tiered.metrics  # type: ignore[attr-defined]
    rng = random.Random(index)
    keys = [f"w{index}-{i}" for i in range(8)]
    last: dict[str, str] = {}
    errors: list[str] = []
    wrong: list[tuple[str, Any, Any]] = []
    fallback_reads = sequence = 0
    while not stop.is_set():
        key = rng.choice(keys)
        try:
            if rng.random() < 0.5:
                sequence += 1
                value = f"{index}-{sequence}"
                cache.set(key, value)
                last[key] = value
            else:
                before = metrics.fallbacks
                got = cache.get(key)
                # A miss is allowed: a write still queued behind memcached when the node
                # went out has no disk copy yet (its older one no longer answers).
                if got is not None and got != last.get(key):
                    wrong.append((key, got, last.get(key)))
                fallback_reads += metrics.fallbacks != before
        except Exception:
            errors.append(traceback.format_exc())
        progress[2 * index] += 1
        progress[2 * index + 1] = fallback_reads
    stats = cache.tier_stats()
    results.put({"index": index, "errors": errors, "wrong": wrong, "last": last, "stats": stats})


def test_memcached_killed_under_load_from_several_processes(
    server: MemcachedServer, disk_directory: str
) -> None:
    workers = 4
    progress = SPAWN.Array("q", 2 * workers, lock=False)
    stop, results = SPAWN.Event(), SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=_load_worker,
            args=(i, server.location, disk_directory, progress, stop, results),
            daemon=True,
        )
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    try:

        def every_worker(at_least: int, slot: int, since: list[int]) -> Callable[[], bool]:
            return lambda: all(
                progress[2 * i + slot] - since[i] >= at_least for i in range(workers)
            )

        assert wait_for(every_worker(100, 0, [0] * workers)), "the workers did not get going"
        server.kill()
        ops_at_kill = [progress[2 * i] for i in range(workers)]
        assert wait_for(every_worker(200, 0, ops_at_kill)), "the workers stalled after the kill"
        assert wait_for(every_worker(50, 1, [0] * workers)), "few reads came from the disk"
        stop.set()
        outcomes = [results.get(timeout=PATIENCE) for _ in range(workers)]
    finally:
        stop.set()
        _join(processes)

    for outcome in outcomes:
        assert outcome["errors"] == [], outcome["errors"][0]
        assert outcome["wrong"] == [], f"worker {outcome['index']} read {outcome['wrong'][:5]}"
        stats = outcome["stats"]
        assert stats["fallbacks"] >= 50
        assert stats["journaled"] > 0
        assert [node["state"] for node in stats["nodes"].values()] == ["out"]
    # Every write acknowledged during the outage is on disk, for any process to read.
    cache = make_cache([server.location], disk_directory)
    for outcome in outcomes:
        for key, value in outcome["last"].items():
            assert timed(lambda key=key: cache.get(key)) == value
    assert node_states(cache) == ["out"]


# -- memcached hung (SIGSTOP), then continued ------------------------------------------------


def test_memcached_stopped_every_call_returns_in_time_and_no_old_value_comes_back(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache([server.location], disk_directory)
    raw = Raw(cache, [server.location])
    written = [f"written-{i}" for i in range(10)]
    deleted = [f"deleted-{i}" for i in range(10)]
    untouched = [f"untouched-{i}" for i in range(5)]
    for key in written + deleted + untouched:
        cache.set(key, f"before {key}")
    cache.set("counter", 10)
    landed(cache)

    server.pause()
    try:
        # The first call waits for its timeout, opens the breaker and is answered by disk.
        assert timed(lambda: cache.get(untouched[0])) == f"before {untouched[0]}"
        assert node_states(cache) == ["out"]
        for key in written:
            timed(lambda key=key: cache.set(key, f"during {key}"))
        for key in deleted:
            timed(lambda key=key: cache.delete(key))
        assert timed(lambda: cache.incr("counter")) == 11
        for key in written:
            assert timed(lambda key=key: cache.get(key)) == f"during {key}"
        for key in deleted + untouched:
            expected = None if key in deleted else f"before {key}"
            assert timed(lambda key=key: cache.get(key)) == expected
        assert stat(cache, "journaled") >= len(written) + len(deleted) + 1
    finally:
        server.resume()  # memcached still holds every value from before the outage

    seen: list[tuple[str, Any]] = []

    def read_all() -> None:
        for key in written + deleted + ["counter"]:
            seen.append((key, timed(lambda key=key: cache.get(key))))

    # Read while the probe replays the journal and brings the node back, and after.
    assert wait_for(lambda: read_all() or node_states(cache) == ["up"])
    for _ in range(3):
        read_all()
    stale = [
        (key, value)
        for key, value in seen
        if value == f"before {key}" or (key == "counter" and value != 11)
    ]
    assert stale == []
    assert stat(cache, "replays") >= 1
    # And memcached itself no longer holds any of them: the replay deleted them.
    for key in written + deleted:
        assert raw.get(key) in (None, f"during {key}")
    assert raw.get("counter") in (None, 11)
    raw.close()


# -- memcached restarted empty ------------------------------------------------------------


def test_memcached_restarted_empty_is_answered_and_refilled_from_disk(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache([server.location], disk_directory)
    raw = Raw(cache, [server.location])
    values = {f"key-{i}": f"value-{i}" for i in range(20)}
    cache.set_many(values)
    cache.set("counter", 41)
    landed(cache)

    server.restart()
    assert raw.get("key-0") is None  # empty

    for key, value in values.items():
        assert timed(lambda key=key: cache.get(key)) == value
    assert timed(lambda: cache.incr("counter")) == 42
    assert stat(cache, "disk_hits") >= len(values)
    # Refilled: memcached answers them again by itself.
    for key, value in values.items():
        assert raw.get(key) == value
    assert raw.get("counter") == 42
    raw.close()


# -- one of three nodes down -------------------------------------------------------------


def test_one_of_three_nodes_down_only_its_keys_fall_back(disk_directory: str) -> None:
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(MemcachedServer()) for _ in range(3)]
        locations = [s.location for s in servers]
        # The killed node fails at once (its connections reset, new ones refused): a timeout
        # long enough that the live nodes, on a loaded machine, do not.
        cache = make_cache(locations, disk_directory, **ANSWERED)
        raw = Raw(cache, locations)
        stack.callback(raw.close)
        keys = [f"key-{i}" for i in range(90)]
        for key in keys:
            cache.set(key, f"first {key}")
        cluster = cache.client.cluster
        by_node: dict[int, list[str]] = {}
        for key in keys:
            by_node.setdefault(cluster.node_index(cache.wire_key(key)), []).append(key)
        assert sorted(by_node) == [0, 1, 2]
        landed(cache)

        servers[1].kill()
        live = by_node[0] + by_node[2]
        # Values changed behind FastCache's back on the live nodes: reading them proves
        # memcached answered, not the disk.
        for key in live:
            raw.set(key, f"memcached {key}")
        fallbacks = stat(cache, "fallbacks")
        for key in keys:
            expected = f"first {key}" if key in by_node[1] else f"memcached {key}"
            assert timed(lambda key=key: cache.get(key)) == expected
        assert node_states(cache) == ["up", "out", "up"]
        assert stat(cache, "fallbacks") - fallbacks == len(by_node[1])

        # Writes: journaled only for the node that is out.
        for key in keys:
            timed(lambda key=key: cache.set(key, f"second {key}"))
        stats = cache.tier_stats()
        assert stats is not None
        journals = [node["journal_length"] for node in stats["nodes"].values()]
        assert journals == [0, len(by_node[1]), 0]
        for key in keys:
            assert cache.get(key) == f"second {key}"
        for key in live:
            assert raw.get(key) == f"second {key}"


# -- a slow node -------------------------------------------------------------------------


def test_a_slow_node_falls_back_within_the_timeout_and_comes_back(disk_directory: str) -> None:
    with contextlib.ExitStack() as stack:
        fast = stack.enter_context(MemcachedServer())
        slow = stack.enter_context(MemcachedServer())
        proxy = stack.enter_context(DelayProxy(slow.location))
        locations = [fast.location, proxy.location]
        # One timeout for both nodes: long enough that the fast one, on a loaded machine,
        # never reaches it; the slow one's delay is three times as long.
        cache = make_cache(locations, disk_directory, **ANSWERED)
        raw = Raw(cache, locations)
        stack.callback(raw.close)
        keys = [f"key-{i}" for i in range(40)]
        for key in keys:
            cache.set(key, f"first {key}")
        on_slow = [k for k in keys if cache.client.cluster.node_index(cache.wire_key(k)) == 1]
        assert on_slow
        landed(cache)

        proxy.delay = 3 * ANSWERED["operation_timeout"]
        for key in keys:
            assert timed(lambda key=key: cache.get(key)) == f"first {key}"
        assert node_states(cache) == ["up", "out"]
        for key in on_slow:
            timed(lambda key=key: cache.set(key, f"second {key}"))

        proxy.delay = 0.0
        assert wait_for(lambda: node_states(cache) == ["up", "up"]), "the node never came back"
        for key in on_slow:
            # The late replies and the replay are behind us: memcached answers again,
            # with nothing from before the slow spell.
            assert raw.get(key) in (None, f"second {key}")
            raw.set(key, f"memcached {key}")
            assert timed(lambda key=key: cache.get(key)) == f"memcached {key}"


def test_a_set_slowed_in_flight_racing_a_delete_leaves_the_tiers_in_step(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A set still on its way to memcached while a delete runs must not leave a value in
    memcached that the disk does not hold: an increment of it would be lost in the next
    outage (the read after it would find nothing)."""
    with DelayProxy(server.location) as proxy:
        slow = make_cache([proxy.location], disk_directory, operation_timeout=2.0)
        quick = make_cache([server.location], disk_directory)
        quick.set("counter", 1)
        assert slow.get("counter") == 1  # the slow path's connection is open
        proxy.delay = 0.2
        setter = threading.Thread(target=lambda: slow.set("counter", 100))
        setter.start()
        # The delete runs while the set is in flight (it reaches memcached afterwards)...
        assert wait_for(lambda: proxy.pending_bytes() > 0, timeout=5)
        # ... and after the set's disk write, if that is made while the set is in flight.
        disk, wire = quick._shared().tiered.disk, quick.wire_key("counter")
        wait_for(lambda: getattr(disk.get(wire), "data", None) == b"100", timeout=0.1)
        quick.delete("counter")
        setter.join(PATIENCE)
        try:
            incremented = quick.incr("counter")
        except ValueError:
            # The set reached memcached before the delete: the key is gone from memcached,
            # and once the writes behind have landed (each cache has its own writer, in
            # either order), no disk entry of it answers (removed, or under a stamp the
            # delete moved on from); it stays gone in an outage.
            landed(slow)
            landed(quick)
            assert quick._shared().tiered._on_disk(wire) is None
            server.kill()
            assert quick.get("counter") is None
            return
        assert incremented == 101
        # Written behind: once the disk copies have landed (a read before that is a miss,
        # never an older value), the outage must answer the increment.
        landed(slow)
        landed(quick)
        server.kill()
        assert quick.get("counter") == incremented


# -- a server sending garbage or cutting its replies short ----------------------------------


def test_a_garbage_reply_discards_the_connection_and_the_next_call_gets_its_own_answer(
    disk_directory: str,
) -> None:
    with FakeMemcached() as fake:
        # Raw values.
        cache = make_cache([fake.location], disk_directory, sign_values=False, **ANSWERED)
        cache.set("a", b"alpha")
        cache.set("b", b"beta")
        landed(cache)
        connections = fake.accepted
        fake.script(Action.GARBAGE)
        # The reply does not parse: the node is marked out and the disk tier answers;
        # nothing is raised, and neither the garbage nor another call's answer comes back.
        assert timed(lambda: cache.get("a")) == b"alpha"
        assert stat(cache, "fallbacks") == 1
        assert fake.wait_for(lambda: len(fake.closed_by_client) >= 1), "connection kept"
        assert wait_for(lambda: node_states(cache) == ["up"])
        assert timed(lambda: cache.get("b")) == b"beta"
        assert fake.accepted > connections  # on a new connection
        assert fake.requests[-1].line.endswith(b":1:b")


def test_a_truncated_reply_discards_the_connection_and_the_next_call_gets_its_own_answer(
    disk_directory: str,
) -> None:
    with FakeMemcached() as fake:
        # Raw values.
        cache = make_cache([fake.location], disk_directory, sign_values=False, **ANSWERED)
        cache.set("a", b"alpha")
        cache.set("b", b"beta")
        landed(cache)
        connections = fake.accepted
        fake.script(Action.TRUNCATE)
        # Half a reply, then the connection closes: the node is out, the disk answers.
        assert timed(lambda: cache.get("a")) == b"alpha"
        assert stat(cache, "fallbacks") == 1
        assert wait_for(lambda: node_states(cache) == ["up"]), "the node never came back"
        requests = len(fake.requests)
        assert timed(lambda: cache.get("b")) == b"beta"
        assert fake.accepted > connections
        assert [r.line for r in fake.requests[requests:]] == [b"get :1:b"]


def test_incr_add_and_touch_on_a_server_without_meta_go_on_with_the_classic_commands(
    disk_directory: str,
) -> None:
    """The tier increments with ``ma`` (for the TTL of its disk copy), adds under a lease
    (``mg … N``) and touches with ``mg … T``; a server that answers ERROR gets memcached's
    ``incr``, ``add`` and ``touch`` instead, in the same call, each sent once. The counter's disk
    copy is dropped (no TTL to give it): the key misses on disk, never answers an older
    count."""
    with FakeMemcached() as fake:
        cache = make_cache([fake.location], disk_directory, sign_values=False, **ANSWERED)
        cache.set("counter", 1)
        landed(cache)
        before = len(fake.requests)
        assert cache.incr("counter") == 2
        assert cache.decr("counter", 5) == 0  # memcached's decr stops at 0
        assert cache.incr("counter", 3) == 3
        verbs = [r.line.split()[0] for r in fake.requests[before:]]
        assert verbs.count(b"incr") + verbs.count(b"decr") == 3, verbs
        assert [v for v in verbs if v not in (b"ma", b"mn")] == [b"incr", b"decr", b"incr"]

        async def aincr() -> int:
            return await cache.aincr("counter")

        assert asyncio.run(aincr()) == 4
        assert cache.get("counter") == b"4"  # (the fake keeps no flags: raw bytes)
        landed(cache)
        assert cache._shared().tiered._on_disk(cache.wire_key("counter")) is None
        before = len(fake.requests)
        assert cache.add("new", b"x") is True
        assert cache.add("new", b"y") is False
        assert asyncio.run(cache.aadd("new", b"z")) is False
        verbs = [r.line.split()[0] for r in fake.requests[before:]]
        assert [v for v in verbs if v not in (b"mg", b"mn")] == [b"add"] * 3
        assert cache.get("new") == b"x"
        before = len(fake.requests)
        assert cache.touch("new", 100) is True
        assert cache.touch("absent", 100) is False
        verbs = [r.line.split()[0] for r in fake.requests[before:]]
        assert [v for v in verbs if v not in (b"mg", b"mn")] == [b"touch"] * 2
        assert node_states(cache) == ["up"]


# -- the disk tier failing -----------------------------------------------------------------


def _exercise(
    cache: FastCache, rounds: int, tag: str, keys: int = 8, timeout: float = TIMEOUT
) -> dict[str, Any]:
    """Sets, reads, deletes and increments through ``cache`` (of operation_timeout
    ``timeout``); every call is checked. Returns the latest value acknowledged for each key
    (None: deleted)."""
    latest: dict[str, Any] = {}
    bound = timeout + 2 * timeout + SLACK  # the disk tier's lock wait is twice the timeout
    for round_ in range(rounds):
        for i in range(keys):
            key = f"key-{i}"
            value = f"{tag}-{round_}-{i}"
            timed(lambda key=key, value=value: cache.set(key, value), bound)
            latest[key] = value
            assert timed(lambda key=key: cache.get(key), bound) == value
        timed(lambda: cache.delete("key-0"), bound)
        latest["key-0"] = None
        assert timed(lambda: cache.get("key-0"), bound) is None
        if timed(lambda: cache.add("counter", 0), bound):
            latest["counter"] = 0
        latest["counter"] = timed(lambda: cache.incr("counter"), bound)
    return latest


def _assert_nothing_older(
    cache: FastCache, latest: dict[str, Any], timeout: float = TIMEOUT
) -> list[str]:
    """Read every key; a value other than the latest one acknowledged (or nothing) fails.
    Returns the keys that read nothing although they hold a value."""
    missing = []
    for key, value in latest.items():
        got = timed(lambda key=key: cache.get(key), timeout + SLACK)
        assert got in (value, None), f"{key}: read {got!r}, the latest write was {value!r}"
        if got is None and value is not None:
            missing.append(key)
    return missing


def test_disk_directory_removed_mid_run(server: MemcachedServer, disk_directory: str) -> None:
    cache = make_cache([server.location], disk_directory)
    _exercise(cache, 3, "before")
    _remove_while_written(disk_directory)
    latest = _exercise(cache, 3, "after")  # the memcached path carries on
    # An outage now: answered from the files still open, or not at all; never older.
    server.kill()
    _assert_nothing_older(cache, latest)
    timed(lambda: cache.set("key-1", "during"))
    latest["key-1"] = "during"
    _assert_nothing_older(cache, latest)
    # Without its journal the node is flushed rather than replayed, but it does come back.
    server.restart()
    assert wait_for(lambda: node_states(cache) == ["up"]), "memcached was never used again"
    _assert_nothing_older(cache, latest)
    _exercise(cache, 2, "back")
    # A cache set up afterwards (as a process started now would) makes the directory again.
    _exercise(make_cache([server.location], disk_directory, disk_shards=4), 1, "other")
    assert Path(disk_directory, "values").is_dir()


def _remove_while_written(directory: str) -> None:
    """``rm -rf`` as an operator runs it while the writer behind may still add files: again
    until the directory is gone (one pass can meet a file made after its listing)."""
    for _ in range(50):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.exists(directory):
            return
    raise AssertionError(f"{directory} kept coming back")


def _drop_privileges() -> str | None:
    """Make permission checks apply to this process, also as root (no capabilities, so
    no CAP_DAC_OVERRIDE): None when done, else why it could not be done."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "capset"):
        return "running as root, and no capset() to drop CAP_DAC_OVERRIDE with"

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return f"capget failed (errno {ctypes.get_errno()})"
    for half in data:
        half.effective = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        return f"capset failed (errno {ctypes.get_errno()})"
    return None


def _read_only_worker(location: str, directory: str, phase: str, results: Any) -> None:
    """Runs as a process of its own on a read-only disk tier directory."""
    outcome: dict[str, Any] = {"errors": [], "skip": None}
    try:
        outcome["skip"] = _drop_privileges()
        probe = os.path.join(directory, "probe")
        try:
            with open(probe, "w"):
                pass
        except OSError:
            pass
        else:
            os.unlink(probe)
            outcome["skip"] = "the directory is still writable by this process"
        if outcome["skip"] is None:
            configure_django([location], {**OPTIONS, "disk_directory": directory})
            from django.core.cache import cache

            if phase == "write":
                outcome["latest"] = _exercise(cache, 3, "read-only")  # type: ignore[arg-type]
            else:
                outcome["read"] = {f"key-{i}": cache.get(f"key-{i}") for i in range(8)}
            outcome["stats"] = cache.tier_stats()
    except BaseException:
        outcome["errors"].append(traceback.format_exc())
    results.put(outcome)


def _run_read_only_worker(location: str, directory: str, phase: str) -> dict[str, Any]:
    results = SPAWN.Queue()
    process = SPAWN.Process(
        target=_read_only_worker, args=(location, directory, phase, results), daemon=True
    )
    process.start()
    try:
        outcome: dict[str, Any] = results.get(timeout=60)
    finally:
        _join([process])
    if outcome["skip"]:
        pytest.skip(f"cannot make a directory read-only for this process: {outcome['skip']}")
    assert outcome["errors"] == [], outcome["errors"][0]
    return outcome


def test_disk_directory_made_read_only(server: MemcachedServer, disk_directory: str) -> None:
    """A process starting on a read-only disk tier (the same user's, chmod 0500/0400) is
    refused, naming the fix: its writes would reach memcached only, while processes that
    opened the directory before keep answering from it (tests/integration/
    test_tier_faults.py shows what that costs).

    Tests run as root here, and root ignores file permissions; the worker process then
    drops its capabilities (CAP_DAC_OVERRIDE among them) so that they apply to it too."""
    cache = make_cache([server.location], disk_directory)
    _exercise(cache, 2, "before")
    landed(cache)  # the shards made, and no transaction of the writer's in flight
    set_tree_mode(disk_directory, 0o500, 0o400)
    try:
        with pytest.raises(AssertionError, match=r"ImproperlyConfigured.*chmod -R u\+rwX"):
            _run_read_only_worker(server.location, disk_directory, "write")
    finally:
        set_tree_mode(disk_directory, 0o700, 0o600)


def test_corrupted_database_files(server: MemcachedServer, disk_directory: str) -> None:
    cache = make_cache([server.location], disk_directory)
    _exercise(cache, 2, "before")
    landed(cache)  # the writer behind made the shards (its first landing does)
    shards = sorted(Path(disk_directory, "values").glob("*/cache.db"))
    assert shards
    garbage = random.Random(0)
    for shard in shards:
        size = shard.stat().st_size
        with open(shard, "r+b") as file:
            file.write(bytes(garbage.getrandbits(8) for _ in range(size)))
    latest = _exercise(cache, 3, "corrupt")
    landed(cache)
    # A process started now, on the corrupt files, works as well.
    results = SPAWN.Queue()
    process = SPAWN.Process(
        target=_corrupt_worker,
        args=(server.location, disk_directory, results),
        daemon=True,
    )
    process.start()
    try:
        outcome = results.get(timeout=60)
    finally:
        _join([process])
    assert outcome["errors"] == [], outcome["errors"][0]
    # (Whether SQLite notices the garbage depends on which pages it reads from the files
    # rather than from its write-ahead log; written behind, the disk is read and written
    # less often, so a failure is not always counted. What must hold is below.)
    latest = outcome["latest"]
    server.restart()  # memcached empty: only the disk could answer, and must not lie
    _assert_nothing_older(cache, latest)


def _corrupt_worker(location: str, directory: str, results: Any) -> None:
    outcome: dict[str, Any] = {"errors": []}
    try:
        configure_django([location], {**OPTIONS, "disk_directory": directory})
        from django.core.cache import cache

        outcome["latest"] = _exercise(cache, 3, "fresh")  # type: ignore[arg-type]
        landed(cache)  # type: ignore[arg-type]  # the writer behind met the corrupt files
        outcome["stats"] = cache.tier_stats()
    except BaseException:
        outcome["errors"].append(traceback.format_exc())
    results.put(outcome)


def _lock_holder(directory: str, hold: float, stop: Any, holding: Any) -> None:
    """Takes the write lock of every shard in turn and holds it ``hold`` seconds (or, with
    ``hold`` = 0, all of them until ``stop``)."""
    paths = sorted(Path(directory, "values").glob("*/cache.db"))
    connections = [sqlite3.connect(p, timeout=60, isolation_level=None) for p in paths]
    rng = random.Random(os.getpid())
    if hold == 0:
        for connection in connections:
            connection.execute("BEGIN IMMEDIATE")
        holding.set()
        stop.wait(PATIENCE * 3)
        for connection in connections:
            connection.execute("ROLLBACK")
        return
    holding.set()
    while not stop.is_set():
        connection = rng.choice(connections)
        connection.execute("BEGIN IMMEDIATE")
        stop.wait(rng.uniform(hold / 4, hold))
        connection.execute("ROLLBACK")
        time.sleep(0.005)


def _start_lock_holders(directory: str, hold: float, count: int) -> tuple[Any, list[Any]]:
    # The shards exist once the writer behind has landed something: a holder started
    # before would find no shard to lock.
    assert list(Path(directory, "values").glob("*/cache.db")), "no shard to lock yet"
    stop = SPAWN.Event()
    started = []
    for _ in range(count):
        holding = SPAWN.Event()
        process = SPAWN.Process(
            target=_lock_holder, args=(directory, hold, stop, holding), daemon=True
        )
        process.start()
        assert holding.wait(60), "a lock holder did not start"
        started.append(process)
    return stop, started


#: operation_timeout of the shard lock tests' caches: there memcached must answer every
#: call, however loaded the machine (a node put out would send the writes to the locked
#: disk, another case), and the disk tier's lock wait is twice it.
LOCKS_TIMEOUT = 1.0
LOCKS_OPTIONS = {"operation_timeout": LOCKS_TIMEOUT, "connect_timeout": LOCKS_TIMEOUT}


def test_heavy_lock_contention_on_the_disk_tier(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache([server.location], disk_directory, **LOCKS_OPTIONS)
    _exercise(cache, 1, "warm", timeout=LOCKS_TIMEOUT)
    landed(cache)
    # Other processes hold shard locks for up to 3/4 of the lock wait, one after another.
    stop, holders = _start_lock_holders(disk_directory, 0.75 * 2 * LOCKS_TIMEOUT, 3)
    try:
        latest = _exercise(cache, 4, "contended", timeout=LOCKS_TIMEOUT)
    finally:
        stop.set()
        _join(holders)
    landed(cache)
    server.kill()  # from now on the disk answers
    missing = _assert_nothing_older(cache, latest, LOCKS_TIMEOUT)
    # Locks held for less than the lock wait are waited for: the disk kept up.
    assert missing == [] or stat(cache, "disk_failures") > 0
    assert len(missing) <= 1


def test_a_shard_lock_held_past_the_lock_wait_never_lets_an_old_value_answer(
    server: MemcachedServer, disk_directory: str
) -> None:
    cache = make_cache([server.location], disk_directory, **LOCKS_OPTIONS)
    _exercise(cache, 1, "before", keys=3, timeout=LOCKS_TIMEOUT)
    landed(cache)  # the values the next writes replace are on disk
    stop, holders = _start_lock_holders(disk_directory, 0, 1)  # every shard, until stopped
    try:
        # The memcached path carries on.
        latest = _exercise(cache, 1, "locked", keys=3, timeout=LOCKS_TIMEOUT)
        landed(cache)  # the writer behind gives up on the locked shards
        assert stat(cache, "disk_failures") > 0
    finally:
        stop.set()
        _join(holders)
    server.kill()
    # The disk could not take those writes: the entries they replaced must not answer.
    missing = _assert_nothing_older(cache, latest, LOCKS_TIMEOUT)
    assert missing  # and indeed they do not (they read nothing rather than the old value)
