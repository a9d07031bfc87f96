"""Every client command against real memcached, through both clients.

Each test is written once as a coroutine over a client and run twice: on the asyncio
:class:`Client` in a fresh event loop, and on the :class:`BlockingClient` through
:func:`run_blocking` (its coroutines never suspend, so the whole scenario runs inline).
What the server holds afterwards is checked on the server itself: through its own ``stats``,
or by asking each node directly with a one-node client.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import CommandSet
from django_fastcache.errors import (
    ClientError,
    ConnectFailedError,
    InvalidArgumentError,
    InvalidKeyError,
    ServerError,
    ValueTooLargeError,
)
from django_fastcache.protocol import Item
from django_fastcache.testing.servers import MemcachedServer, free_port
from tests.conftest import MemcachedCluster
from tests.integration.client_runner import Runner, runner_fixture

pytestmark = pytest.mark.integration


MiB = 1024 * 1024
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


run = runner_fixture()


# -- looking at the servers directly ---------------------------------------------------------
def _address(server: MemcachedServer) -> tuple[int, str | tuple[str, int]]:
    if server.socket_path is not None:
        return socket.AF_UNIX, server.socket_path
    return socket.AF_INET, (server.host, server.port)


def raw_exchange(server: MemcachedServer, request: bytes, terminator: bytes) -> bytes:
    """Send ``request`` on a new plain socket and read until the reply ends with ``terminator``."""
    family, address = _address(server)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address)
        sock.sendall(request)
        reply = b""
        while not reply.endswith(terminator):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


def server_stats(server: MemcachedServer, *args: str) -> dict[str, str]:
    """The server's ``stats`` as it reports them, read over a plain socket."""
    command = " ".join(("stats", *args)).encode() + b"\r\n"
    stats: dict[str, str] = {}
    for line in raw_exchange(server, command, b"END\r\n").split(b"\r\n"):
        if line.startswith(b"STAT "):
            _stat, name, value = line.decode().split(" ", 2)
            stats[name] = value
    return stats


def node_get_many(location: str, keys: list[bytes]) -> dict[bytes, Item]:
    """Ask one node, and only that node, for ``keys``."""
    client = BlockingClient(Cluster([location], ClientSettings()))
    try:
        return run_blocking(client.get_many(keys))
    finally:
        client.close_thread_connections()


@pytest.fixture
def private_memcached() -> Iterator[MemcachedServer]:
    """A memcached of the test's own, for commands whose effect outlives the test. (One
    per test: items stored in the second a delayed flush_all takes effect count as flushed
    by it, and memcached's background threads may reap them before the next flush_all
    moves the cut-off on, so a second flush test on the same server could lose its items
    at once.)"""
    server = MemcachedServer().start()
    try:
        yield server
    finally:
        server.kill()


# -- retrieval -------------------------------------------------------------------------------
def test_get_miss_then_hit(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.get(b"greeting") is None
        assert await c.set(b"greeting", b"hello") is True
        assert await c.get(b"greeting") == Item(b"greeting", b"hello", 0, None)

    run([memcached.location], scenario)


def test_gets_returns_a_cas_token_that_changes_on_write(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.gets(b"k") is None
        await c.set(b"k", b"one")
        first = await c.gets(b"k")
        assert first is not None
        assert first.value == b"one"
        assert isinstance(first.cas, int)
        assert first.cas > 0
        again = await c.gets(b"k")
        assert again is not None
        assert again.cas == first.cas
        await c.set(b"k", b"two")
        second = await c.gets(b"k")
        assert second is not None
        assert second.value == b"two"
        assert second.cas not in (None, first.cas)

    run([memcached.location], scenario)


def test_gat_and_gats_touch_the_item(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.gat(b"k", 100) is None
        assert await c.gats(b"k", 100) is None
        await c.set(b"k", b"v", flags=7)
        assert await c.gat(b"k", 100) == Item(b"k", b"v", 7, None)
        with_cas = await c.gats(b"k", 100)
        assert with_cas is not None
        assert with_cas.value == b"v"
        assert with_cas.cas
        # A negative expiry returns the item and expires it at once.
        assert await c.gat(b"k", -1) == Item(b"k", b"v", 7, None)
        assert await c.get(b"k") is None
        await c.set(b"k2", b"v2")
        assert (await c.gats(b"k2", -1)) is not None
        assert await c.get(b"k2") is None

    run([memcached.location], scenario)


def test_many_forms_return_only_the_hits(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.get_many([]) == {}
        for i in range(3):
            await c.set(b"k%d" % i, b"v%d" % i, flags=i)
        keys = [b"k0", b"missing", b"k1", b"k2", b"k1"]
        expected = {b"k%d" % i: Item(b"k%d" % i, b"v%d" % i, i, None) for i in range(3)}
        assert await c.get_many(keys) == expected
        assert await c.get_many(iter(keys)) == expected  # any iterable
        with_cas = await c.gets_many(keys)
        assert set(with_cas) == set(expected)
        for key, item in with_cas.items():
            assert item.value == expected[key].value
            assert isinstance(item.cas, int)
        assert await c.gat_many(keys, 100) == expected
        assert {k: i.value for k, i in (await c.gats_many(keys, 100)).items()} == {
            k: i.value for k, i in expected.items()
        }
        assert await c.gat_many([b"k0", b"k1"], -1) == {
            b"k0": expected[b"k0"],
            b"k1": expected[b"k1"],
        }
        assert await c.get_many(keys) == {b"k2": expected[b"k2"]}
        assert set(await c.gats_many([b"k2"], -1)) == {b"k2"}
        assert await c.get_many(keys) == {}

    run([memcached.location], scenario)


def test_get_many_over_several_get_lines(run: Runner, memcached: MemcachedServer) -> None:
    """More keys than fit one ``get`` line (100): the lines are pipelined, all answered."""
    keys = [b"key:%04d" % i for i in range(345)]

    async def scenario(c: CommandSet) -> None:
        assert await c.set_many([(k, k[::-1], 0) for k in keys[::2]]) == []
        found = await c.get_many(keys)
        assert {k: i.value for k, i in found.items()} == {k: k[::-1] for k in keys[::2]}

    run([memcached.location], scenario)


# -- storage ---------------------------------------------------------------------------------
def test_add_replace_append_prepend(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.replace(b"k", b"x") is False
        assert await c.append(b"k", b"x") is False
        assert await c.prepend(b"k", b"x") is False
        assert await c.get(b"k") is None
        assert await c.add(b"k", b"mid") is True
        assert await c.add(b"k", b"other") is False
        assert (await c.get(b"k")) == Item(b"k", b"mid", 0, None)
        assert await c.append(b"k", b">>") is True
        assert await c.prepend(b"k", b"<<") is True
        assert (await c.get(b"k")) == Item(b"k", b"<<mid>>", 0, None)
        assert await c.replace(b"k", b"new", flags=3) is True
        assert (await c.get(b"k")) == Item(b"k", b"new", 3, None)

    run([memcached.location], scenario)


def test_cas_success_and_conflicts(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        await c.set(b"k", b"v1")
        item = await c.gets(b"k")
        assert item is not None
        assert item.cas is not None
        assert await c.cas(b"k", b"v2", item.cas, flags=5) is True
        assert await c.get(b"k") == Item(b"k", b"v2", 5, None)
        # The token is spent: another write came first (EXISTS).
        assert await c.cas(b"k", b"v3", item.cas) is False
        assert (await c.get(b"k")) == Item(b"k", b"v2", 5, None)
        # A concurrent set between gets and cas.
        fresh = await c.gets(b"k")
        assert fresh is not None
        assert fresh.cas is not None
        await c.set(b"k", b"someone else")
        assert await c.cas(b"k", b"mine", fresh.cas) is False
        assert (await c.get(b"k")) == Item(b"k", b"someone else", 0, None)
        # The item is gone (NOT_FOUND).
        latest = await c.gets(b"k")
        assert latest is not None
        assert latest.cas is not None
        await c.delete(b"k")
        assert await c.cas(b"k", b"back", latest.cas) is False
        assert await c.get(b"k") is None

    run([memcached.location], scenario)


def test_flags_round_trip_at_both_ends(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        for flags in (0, 1, UINT32_MAX):
            await c.set(b"f", b"v", flags=flags)
            assert (await c.get(b"f")) == Item(b"f", b"v", flags, None)
            gets = await c.gets(b"f")
            assert gets is not None
            assert gets.flags == flags
        assert await c.set_many([(b"a", b"1", 0), (b"b", b"2", UINT32_MAX)]) == []
        found = await c.get_many([b"a", b"b"])
        assert {k: i.flags for k, i in found.items()} == {b"a": 0, b"b": UINT32_MAX}
        with pytest.raises(InvalidArgumentError):
            await c.set(b"f", b"v", flags=UINT32_MAX + 1)
        with pytest.raises(InvalidArgumentError):
            await c.set(b"f", b"v", flags=-1)

    run([memcached.location], scenario)


def test_expiry_in_the_past_is_gone_at_once(run: Runner, memcached: MemcachedServer) -> None:
    # Expiry times over 30 days are absolute unix times.
    past = int(time.time()) - 3600
    future = int(time.time()) + 3600

    async def scenario(c: CommandSet) -> None:
        assert await c.set(b"neg", b"v", exptime=-1) is True
        assert await c.get(b"neg") is None
        assert await c.add(b"neg-add", b"v", exptime=-1) is True
        assert await c.get(b"neg-add") is None
        assert await c.set(b"past", b"v", exptime=past) is True
        assert await c.get(b"past") is None
        assert await c.set(b"future", b"v", exptime=future) is True
        assert (await c.get(b"future")) == Item(b"future", b"v", 0, None)
        assert await c.set(b"relative", b"v", exptime=100) is True
        assert (await c.get(b"relative")) is not None
        assert await c.set_many([(b"m1", b"v", 0), (b"m2", b"v", 0)], exptime=past) == []
        assert await c.get_many([b"m1", b"m2"]) == {}

    run([memcached.location], scenario)


# -- delete, touch, arithmetic -----------------------------------------------------------------
def test_delete(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.delete(b"k") is False
        await c.set(b"k", b"v")
        assert await c.delete(b"k") is True
        assert await c.get(b"k") is None
        assert await c.delete(b"k") is False

    run([memcached.location], scenario)


def test_touch(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.touch(b"k", 100) is False
        await c.set(b"k", b"v", exptime=5)
        assert await c.touch(b"k", 100) is True
        assert (await c.get(b"k")) is not None
        assert await c.touch(b"k", -1) is True
        assert await c.get(b"k") is None
        assert await c.touch(b"k", 100) is False

    run([memcached.location], scenario)


def test_incr_decr(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.incr(b"n") is None
        assert await c.decr(b"n", 3) is None
        assert await c.get(b"n") is None  # nothing created
        await c.set(b"n", b"10")
        assert await c.incr(b"n") == 11
        assert await c.incr(b"n", 89) == 100
        assert await c.decr(b"n", 1) == 99
        assert await c.decr(b"n", 1000) == 0  # floors at 0
        assert await c.decr(b"n") == 0
        item = await c.get(b"n")
        assert item is not None
        assert int(item.value) == 0
        # 64-bit unsigned wraparound, as memcached does it.
        await c.set(b"w", b"%d" % UINT64_MAX)
        assert await c.incr(b"w", 1) == 0
        assert await c.incr(b"w", UINT64_MAX) == UINT64_MAX
        assert await c.incr(b"w", 5) == 4
        with pytest.raises(InvalidArgumentError):
            await c.incr(b"w", UINT64_MAX + 1)
        with pytest.raises(InvalidArgumentError):
            await c.decr(b"w", -1)
        # A non-numeric value is refused by the server; the connection stays in step.
        await c.set(b"text", b"abc")
        with pytest.raises(ClientError):
            await c.incr(b"text")
        assert await c.incr(b"w") == 5

    run([memcached.location], scenario)


# -- whole-node commands ------------------------------------------------------------------------
def test_flush_all_now(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        await c.set_many([(b"a", b"1", 0), (b"b", b"2", 0)])
        assert await c.flush_all() is None
        assert await c.get_many([b"a", b"b"]) == {}
        await c.set(b"a", b"after")  # items stored after the flush are kept
        assert (await c.get(b"a")) is not None

    run([memcached.location], scenario)


def test_flush_all_with_delay(run: Runner, private_memcached: MemcachedServer) -> None:
    """Items stay until the delay has passed, then every one of them is gone."""
    keys = [b"a", b"b"]

    async def store_and_flush(c: CommandSet) -> dict[bytes, Item]:
        await c.set_many([(k, b"v", 0) for k in keys])
        # memcached counts whole seconds and ends the items at (its clock + 5 - 1): 5
        # leaves them at least three seconds.
        await c.flush_all(5)
        return await c.get_many(keys)

    assert set(run([private_memcached.location], store_and_flush)) == set(keys)

    async def read(c: CommandSet) -> dict[bytes, Item]:
        return await c.get_many(keys)

    deadline = time.monotonic() + 10
    while run([private_memcached.location], read):
        assert time.monotonic() < deadline, "the delayed flush_all never took effect"
        time.sleep(0.1)


def test_version_is_each_servers_own(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    async def scenario(c: CommandSet) -> dict[str, str]:
        return await c.version()

    versions = run(memcached_cluster.locations, scenario)
    expected = {}
    for server in memcached_cluster.servers:
        reply = raw_exchange(server, b"version\r\n", b"\r\n")
        expected[server.location] = reply.decode().split()[1]
    assert versions == expected


def test_stats_and_stats_settings(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    async def scenario(c: CommandSet) -> tuple[dict[str, dict[str, str]], ...]:
        return await c.stats(), await c.stats("settings"), await c.stats("items")

    general, settings, _items = run(memcached_cluster.locations, scenario)
    assert set(general) == set(settings) == set(memcached_cluster.locations)
    for server in memcached_cluster.servers:
        assert server.process is not None
        assert general[server.location]["pid"] == str(server.process.pid)
        if server.socket_path is None:
            assert settings[server.location]["tcpport"] == str(server.port)
        else:
            assert settings[server.location]["domain_socket"] == server.socket_path
        assert settings[server.location]["maxbytes"] == str(server.memory_mb * MiB)


def test_stats_refused_argument_raises(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        with pytest.raises(InvalidArgumentError):
            await c.stats("two words")
        with pytest.raises(InvalidArgumentError):
            await c.stats("line\r\nbreak")
        assert await c.get(b"k") is None

    run([memcached.location], scenario)


def test_verbosity(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> list[str]:
        seen = []
        try:
            assert await c.verbosity(1) is None
            seen.append((await c.stats("settings"))[memcached.location]["verbosity"])
            await c.verbosity(2, noreply=True)
            seen.append((await c.stats("settings"))[memcached.location]["verbosity"])
        finally:
            await c.verbosity(0)
        seen.append((await c.stats("settings"))[memcached.location]["verbosity"])
        return seen

    assert run([memcached.location], scenario) == ["1", "2", "0"]


def test_cache_memlimit(run: Runner, memcached: MemcachedServer) -> None:
    original = memcached.memory_mb

    async def scenario(c: CommandSet) -> list[str]:
        seen = []
        try:
            assert await c.cache_memlimit(original + 16) is None
            seen.append((await c.stats("settings"))[memcached.location]["maxbytes"])
            await c.cache_memlimit(original + 8, noreply=True)
            seen.append((await c.stats("settings"))[memcached.location]["maxbytes"])
            with pytest.raises(ServerError, match="MEMLIMIT_TOO_SMALL"):
                await c.cache_memlimit(1)
        finally:
            await c.cache_memlimit(original)
        seen.append((await c.stats("settings"))[memcached.location]["maxbytes"])
        return seen

    sizes = run([memcached.location], scenario)
    assert sizes == [str((original + 16) * MiB), str((original + 8) * MiB), str(original * MiB)]


# -- noreply -----------------------------------------------------------------------------------
def test_noreply_on_every_command_that_takes_it(run: Runner, memcached: MemcachedServer) -> None:
    async def value(c: CommandSet, key: bytes) -> bytes | None:
        item = await c.get(key)
        return None if item is None else item.value

    async def scenario(c: CommandSet) -> None:
        assert await c.set(b"k", b"v", flags=9, noreply=True) is True
        assert (await c.get(b"k")) == Item(b"k", b"v", 9, None)
        await c.add(b"k", b"ignored", noreply=True)
        await c.add(b"k2", b"added", noreply=True)
        assert await value(c, b"k") == b"v"
        assert await value(c, b"k2") == b"added"
        await c.replace(b"k", b"replaced", noreply=True)
        await c.replace(b"absent", b"x", noreply=True)
        assert await value(c, b"k") == b"replaced"
        assert await value(c, b"absent") is None
        await c.append(b"k", b"+", noreply=True)
        await c.prepend(b"k", b"-", noreply=True)
        assert await value(c, b"k") == b"-replaced+"
        item = await c.gets(b"k")
        assert item is not None
        assert item.cas is not None
        await c.cas(b"k", b"cas-ed", item.cas, noreply=True)
        assert await value(c, b"k") == b"cas-ed"
        await c.cas(b"k", b"stale", item.cas, noreply=True)
        assert await value(c, b"k") == b"cas-ed"
        await c.set(b"n", b"5")
        assert await c.incr(b"n", 10, noreply=True) is None
        assert await value(c, b"n") == b"15"
        assert await c.decr(b"n", 3, noreply=True) is None
        assert await value(c, b"n") == b"12"
        assert await c.touch(b"k", -1, noreply=True) is True
        assert await value(c, b"k") is None
        assert await c.delete(b"k2", noreply=True) is True
        assert await value(c, b"k2") is None
        await c.flush_all(noreply=True)
        assert await value(c, b"n") is None

    run([memcached.location], scenario)


# -- several nodes -----------------------------------------------------------------------------
def test_keys_spread_over_every_node(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    locations = memcached_cluster.locations
    keys = [b"spread:%d" % i for i in range(200)]
    routing = Cluster(locations, ClientSettings())

    async def store(c: CommandSet) -> list[bytes]:
        return await c.set_many([(k, b"v" + k, 0) for k in keys])

    assert run(locations, store) == []
    seen_on: dict[bytes, list[str]] = {k: [] for k in keys}
    for location in locations:
        for key, item in node_get_many(location, keys).items():
            assert item.value == b"v" + key
            seen_on[key].append(location)
    # Every key is on exactly one node, the one the hashing names, and every node has some.
    assert all(len(nodes) == 1 for nodes in seen_on.values())
    assert {k: nodes[0] for k, nodes in seen_on.items()} == {
        k: locations[routing.node_index(k)] for k in keys
    }
    per_node = {loc: sum(nodes == [loc] for nodes in seen_on.values()) for loc in locations}
    assert all(count >= 20 for count in per_node.values()), per_node

    async def read_and_delete(c: CommandSet) -> None:
        found = await c.get_many([*keys, b"spread:missing"])
        assert {k: i.value for k, i in found.items()} == {k: b"v" + k for k in keys}
        for key in keys[:10]:
            assert (await c.get(key)) == Item(key, b"v" + key, 0, None)
        existed = await c.delete_many([*keys[:100], b"spread:missing"])
        assert existed == {**dict.fromkeys(keys[:100], True), b"spread:missing": False}
        assert await c.delete_many([]) == {}

    run(locations, read_and_delete)
    remaining: set[bytes] = set()
    for location in locations:
        remaining |= set(node_get_many(location, keys))
    assert remaining == set(keys[100:])


def test_single_key_commands_route_to_the_keys_node(
    run: Runner, memcached_cluster: MemcachedCluster
) -> None:
    locations = memcached_cluster.locations
    routing = Cluster(locations, ClientSettings())
    keys = [b"route:%d" % i for i in range(40)]

    async def scenario(c: CommandSet) -> None:
        for key in keys:
            assert await c.set(key, key) is True

    run(locations, scenario)
    for location in locations:
        expected = {k for k in keys if locations[routing.node_index(k)] == location}
        assert set(node_get_many(location, keys)) == expected


def test_unix_socket_node(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    server = memcached_cluster.unix

    async def scenario(c: CommandSet) -> dict[str, dict[str, str]]:
        assert await c.set(b"over-unix", b"41") is True
        assert await c.incr(b"over-unix") == 42
        assert (await c.get(b"over-unix")) == Item(b"over-unix", b"42", 0, None)
        assert set(await c.get_many([b"over-unix", b"nothing"])) == {b"over-unix"}
        return await c.stats("settings")

    settings = run([server.location], scenario)
    assert settings[server.location]["domain_socket"] == server.socket_path
    assert node_get_many(server.location, [b"over-unix"])[b"over-unix"].value == b"42"


# -- values ------------------------------------------------------------------------------------
AWKWARD_VALUES = {
    b"empty": b"",
    b"end-marker": b"\r\nEND\r\n",
    b"fake-header": b"VALUE other 0 1\r\nx\r\nEND\r\n",
    b"nul": b"\x00" * 10 + b"a\x00b",
    b"crlf": b"\r\n",
    b"all-bytes": bytes(range(256)),
}


def test_values_with_protocol_bytes_round_trip(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(c: CommandSet) -> None:
        for key, value in AWKWARD_VALUES.items():
            assert await c.set(key, value) is True
            assert (await c.get(key)) == Item(key, value, 0, None)
        found = await c.get_many(list(AWKWARD_VALUES))
        assert {k: i.value for k, i in found.items()} == AWKWARD_VALUES

    run([memcached.location], scenario)


def test_largest_values_round_trip(run: Runner, memcached: MemcachedServer) -> None:
    # memcached's 1 MiB item limit covers the item header too.
    big = os.urandom(MiB - 512)
    other = os.urandom(MiB // 2)

    async def scenario(c: CommandSet) -> None:
        assert await c.set(b"big", big, flags=UINT32_MAX) is True
        assert await c.set(b"other", other) is True
        assert (await c.get(b"big")) == Item(b"big", big, UINT32_MAX, None)
        found = await c.get_many([b"big", b"small", b"other"])
        assert {k: i.value for k, i in found.items()} == {b"big": big, b"other": other}
        assert await c.set_many([(b"big2", big, 0), (b"tiny", b"t", 0)]) == []
        assert (await c.get(b"big2")) == Item(b"big2", big, 0, None)

    run([memcached.location], scenario)


def test_value_too_large_keeps_the_connection(run: Runner, memcached: MemcachedServer) -> None:
    too_large = b"x" * (MiB + 1)

    async def scenario(c: CommandSet) -> None:
        await c.set(b"k", b"old")
        before = int(server_stats(memcached)["total_connections"])
        with pytest.raises(ValueTooLargeError):
            await c.set(b"k", too_large)
        # memcached drops the old value rather than keep a stale one.
        assert await c.get(b"k") is None
        await c.set(b"k2", b"fine")
        assert (await c.get(b"k2")) == Item(b"k2", b"fine", 0, None)
        failed = await c.set_many([(b"a", b"1", 0), (b"huge", too_large, 0), (b"b", b"2", 0)])
        assert failed == [b"huge"]
        assert set(await c.get_many([b"a", b"huge", b"b"])) == {b"a", b"b"}
        # No new connection was needed for any of it (the probe itself makes one).
        after = int(server_stats(memcached)["total_connections"])
        assert after - before == 1

    run([memcached.location], scenario)


# -- invalid keys ------------------------------------------------------------------------------
BAD_KEYS = [
    b"",
    b"k" * 251,
    b"with space",
    b"line\nbreak",
    b"carriage\rreturn",
    b"tab\tkey",
    b"nul\x00key",
    b"del\x7fkey",
    "text-key",
]


def _invalid_key_calls(bad: Any) -> list[Callable[[CommandSet], Coroutine[Any, Any, Any]]]:
    good = b"good"
    return [
        lambda c: c.get(bad),
        lambda c: c.gets(bad),
        lambda c: c.gat(bad, 10),
        lambda c: c.gats(bad, 10),
        lambda c: c.get_many([good, bad]),
        lambda c: c.gets_many([good, bad]),
        lambda c: c.gat_many([good, bad], 10),
        lambda c: c.gats_many([bad], 10),
        lambda c: c.set(bad, b"v"),
        lambda c: c.set(bad, b"v", noreply=True),
        lambda c: c.add(bad, b"v"),
        lambda c: c.replace(bad, b"v"),
        lambda c: c.append(bad, b"v"),
        lambda c: c.prepend(bad, b"v"),
        lambda c: c.cas(bad, b"v", 1),
        lambda c: c.set_many([(good, b"v", 0), (bad, b"v", 0)]),
        lambda c: c.delete(bad),
        lambda c: c.delete(bad, noreply=True),
        lambda c: c.delete_many([good, bad]),
        lambda c: c.touch(bad, 10),
        lambda c: c.incr(bad),
        lambda c: c.decr(bad, noreply=True),
    ]


def test_invalid_keys_are_refused_before_anything_is_sent(
    run: Runner, memcached_cluster: MemcachedCluster
) -> None:
    server_list = memcached_cluster.servers
    before = [int(server_stats(s)["bytes_read"]) for s in server_list]

    async def scenario(c: CommandSet) -> int:
        refused = 0
        for bad in BAD_KEYS:
            for call in _invalid_key_calls(bad):
                with pytest.raises(InvalidKeyError):
                    await call(c)
                refused += 1
        return refused

    assert run(memcached_cluster.locations, scenario) == len(BAD_KEYS) * 22
    after = [int(server_stats(s)["bytes_read"]) for s in server_list]
    # Only the second probe's own "stats\r\n" reached each server.
    assert [b - a for a, b in zip(before, after)] == [len(b"stats\r\n")] * len(server_list)


def test_invalid_keys_are_refused_even_when_no_server_listens(run: Runner) -> None:
    """Refused before any connection is tried: the error is about the key, not the node."""

    async def scenario(c: CommandSet) -> None:
        for bad in BAD_KEYS:
            for call in _invalid_key_calls(bad):
                with pytest.raises(InvalidKeyError):
                    await call(c)
        with pytest.raises(ConnectFailedError):
            await c.get(b"good")

    run([f"127.0.0.1:{free_port()}"], scenario, connect_timeout=2.0)


def _placed(
    client: CommandSet, keys: list[bytes], location: str
) -> tuple[dict[bytes, int], list[bytes]]:
    """Each key's node (by index), and the keys placed on the node at ``location``."""
    on = {key: client.cluster.node_index(key) for key in keys}
    return on, [key for key in keys if client.cluster.node_ids[on[key]] == location]


def test_delete_many_and_flush_all_by_node_report_each_failed_node(
    run: Runner, memcached: MemcachedServer
) -> None:
    # The second node refuses connections: delete_many and flush_all raise its error; the
    # by-node forms return it beside the first node's outcome, which took effect.
    nowhere = f"127.0.0.1:{free_port()}"
    keys = [b"key-%d" % i for i in range(40)]

    async def scenario(client: CommandSet) -> Any:
        on, up = _placed(client, keys, memcached.location)
        for key in up[::2]:
            await client.set(key, b"v")
        with pytest.raises(ConnectFailedError):
            await client.delete_many(keys)
        existed, deletes_failed = await client.delete_many_by_node(keys)
        for key in up:
            await client.set(key, b"v")
        with pytest.raises(ConnectFailedError):
            await client.flush_all()
        for key in up:
            await client.set(key, b"v")
        flush_failed = await client.flush_all_by_node(range(len(client.cluster)))
        left = await client.get_many(up)
        return on, up, existed, deletes_failed, flush_failed, left

    outcome = run([memcached.location, nowhere], scenario)
    on, up, existed, deletes_failed, flush_failed, left = outcome
    assert 0 < len(up) < len(keys)
    # The first delete_many deleted the first node's keys before raising: none existed now.
    assert existed == dict.fromkeys(up, False)
    down = on[next(k for k in keys if k not in up)]
    for failed in (deletes_failed, flush_failed):
        assert list(failed) == [down]
        assert isinstance(failed[down], ConnectFailedError)
    assert left == {}  # flushed on the node that answered


def test_get_many_by_node_keeps_the_answers_of_the_nodes_that_answered(
    run: Runner, memcached: MemcachedServer
) -> None:
    # The second node refuses connections: get_many raises its error, get_many_by_node
    # returns it beside the first node's items.
    nowhere = f"127.0.0.1:{free_port()}"
    keys = [b"key-%d" % i for i in range(40)]

    async def scenario(client: CommandSet) -> Any:
        on, up = _placed(client, keys, memcached.location)
        for key in up:
            await client.set(key, b"v" + key)
        with pytest.raises(ConnectFailedError):
            await client.get_many(keys)
        found, failed = await client.get_many_by_node(keys)
        return on, up, found, failed

    on, up, found, failed = run([memcached.location, nowhere], scenario)
    assert 0 < len(up) < len(keys)
    assert {key: item.value for key, item in found.items()} == {key: b"v" + key for key in up}
    assert list(failed) == [on[next(k for k in keys if k not in up)]]
    assert isinstance(next(iter(failed.values())), ConnectFailedError)
