"""Counters of 2**63 or more that memcached refuses by mistake, counted all the same.

memcached's number reader looks for a '-' past a big counter's end, through what an earlier
item left in the same slab chunk (django_fastcache/protocol/counters.py). Each test plants
a counter where it does (:func:`plant_misread`: an earlier value of '-' bytes freed from the
chunk the counter then takes) and proves the mistake live, with memcached refusing a plain
``incr <key> 0`` on it, before the client under test counts it.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient, count_line
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import CommandSet
from django_fastcache.errors import ClientError, NonIntegerValueError
from django_fastcache.protocol import MetaStatus
from django_fastcache.protocol.counters import RECOUNT_TRIES
from django_fastcache.serializers import FLAG_INTEGER
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import LANDING_WAIT
from tests.integration.client_runner import Runner, runner_fixture
from tests.integration.test_client_commands import raw_exchange

pytestmark = pytest.mark.integration

U64 = 2**64
REFUSED = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"

run = runner_fixture()


def raw(server: MemcachedServer, request: bytes) -> bytes:
    return raw_exchange(server, request, b"\r\n")


def poison(server: MemcachedServer, key: bytes, number: int, extra: int) -> None:
    """A value of '-' bytes ``extra`` longer than ``number``'s digits stored under ``key``
    (any bytes: it travels base64-encoded) and deleted: its chunk is the first memcached
    hands out next in its size class."""
    dashes = b"-" * (len(b"%d" % number) + extra)
    encoded = base64.b64encode(key)
    assert raw(server, b"ms %s %d b\r\n%s\r\n" % (encoded, len(dashes), dashes)) == b"HD\r\n"
    assert raw(server, b"md %s b\r\n" % encoded) == b"HD\r\n"


def misread(server: MemcachedServer, key: bytes) -> bool:
    """Whether memcached refuses to count what ``key`` holds (a count by 0: nothing changes
    either way)."""
    return raw(server, b"ma %s b D0\r\n" % base64.b64encode(key)) == REFUSED


#: The poisons tried, by how much longer than the counter they are, until one takes.
EXTRAS = range(3, 48)


def plant_misread(
    server: MemcachedServer, key: bytes, number: int, store: Callable[[], object]
) -> None:
    """Have ``store`` (the write under test, storing ``number`` under ``key``) put the
    counter where memcached misreads it, proven by memcached's refusal."""
    for extra in EXTRAS:
        poison(server, key, number, extra)
        store()
        if misread(server, key):
            return
    pytest.fail(f"memcached did not misread {number} under {key!r}: the test plants nothing")


async def plant(
    server: MemcachedServer,
    client: CommandSet,
    key: bytes,
    number: int,
    *,
    exptime: int = 3600,
    base64_key: bool = False,
) -> None:
    """:func:`plant_misread` through ``client`` (flags 2, an hour to live by default)."""
    digits = b"%d" % number
    for extra in EXTRAS:
        poison(server, key, number, extra)
        if base64_key:
            stored = await client.meta_set(
                key, digits, flags=FLAG_INTEGER, exptime=exptime, base64_key=True
            )
            assert stored.status is MetaStatus.HD
        else:
            assert await client.set(key, digits, flags=FLAG_INTEGER, exptime=exptime)
        if misread(server, key):
            return
    pytest.fail(f"memcached did not misread {number} under {key!r}: the test plants nothing")


def item(server: MemcachedServer, key: bytes) -> tuple[bytes, int, int]:
    """What memcached holds under ``key``: (value, flags, seconds left or -1)."""
    reply = raw_exchange(server, b"mg %s v f t\r\nmn\r\n" % key, b"MN\r\n")
    head, _, rest = reply.partition(b"\r\n")
    assert head.startswith(b"VA "), head
    returned = {token[:1]: token[1:] for token in head.split()[2:]}
    return rest.split(b"\r\n")[0].rstrip(b" "), int(returned[b"f"]), int(returned[b"t"])


# -- the client ------------------------------------------------------------------------------
def test_incr_and_decr_count_a_counter_memcached_misreads(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(c: CommandSet) -> None:
        await plant(memcached, c, b"big", U64 - 1)
        assert await c.incr(b"big", 3) == 2  # memcached's rule: wraps past 2**64 - 1
        value, flags, ttl = item(memcached, b"big")
        assert (value, flags) == (b"2", FLAG_INTEGER)
        assert 3000 < ttl <= 3600  # the counter keeps its expiry
        await plant(memcached, c, b"big", 2**63)
        assert await c.decr(b"big", 1) == 2**63 - 1
        await plant(memcached, c, b"big", 2**63)
        assert await c.decr(b"big", 2**63 + 5) == 0  # stops at 0
        await plant(memcached, c, b"big", 2**63)
        assert await c.incr(b"big", 7) == 2**63 + 7
        assert item(memcached, b"big")[0] == b"%d" % (2**63 + 7)

    run([memcached.location], scenario)


def test_meta_arithmetic_counts_a_counter_memcached_misreads(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(c: CommandSet) -> None:
        await plant(memcached, c, b"big", 2**63)
        up = await c.meta_arithmetic(b"big", 5)
        assert (up.status, up.value) == (MetaStatus.HD, 2**63 + 5)
        assert up.ttl is not None
        assert 3000 < up.ttl <= 3600
        held = await c.gets(b"big")
        assert held is not None
        assert up.cas == held.cas
        await plant(memcached, c, b"big", 2**63)
        down = await c.meta_arithmetic(b"big", 2**63 + 1, decrement=True)
        assert (down.status, down.value) == (MetaStatus.HD, 0)

    run([memcached.location], scenario)


def test_the_tiers_increment_line_counts_a_counter_memcached_misreads(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(c: CommandSet) -> None:
        await plant(memcached, c, b"big", 2**63)
        line = count_line(b"big", -3)
        count = await c.count_line_at(0, b"big", -3, line)
        assert count is not None
        value, ttl = count
        assert value == 2**63 - 3
        assert ttl is not None
        assert 3000 < ttl <= 3600
        if isinstance(c, BlockingClient):  # the flat path's plain call
            await plant(memcached, c, b"big", 2**63)
            flat = c.count_at(0, b"big", 10)
            assert flat is not None
            assert flat[0] == 2**63 + 10
            assert flat[1] is not None
            assert 3000 < flat[1] <= 3600  # (not ttl itself: a second may have passed)

    run([memcached.location], scenario)


def test_the_blocking_clients_plain_incr_counts_a_counter_memcached_misreads(
    memcached: MemcachedServer,
) -> None:
    client = BlockingClient(Cluster([memcached.location], ClientSettings()))
    try:
        run_blocking(plant(memcached, client, b"big", U64 - 2))
        assert client.incr_now(b"big", 1, True) == U64 - 1
        run_blocking(plant(memcached, client, b"big", U64 - 2))
        assert client.incr_now(b"big", -(U64 - 1), True) == 0
    finally:
        client.close_thread_connections()


def test_a_counter_with_more_than_30_days_left_keeps_them(
    run: Runner, memcached: MemcachedServer
) -> None:
    # memcached takes an exptime beyond 30 days for a Unix time: the count stores the TTL
    # left as the time it ends, or the counter would expire at once.
    sixty_days = 60 * 86400

    async def scenario(c: CommandSet) -> None:
        ends = int(time.time()) + sixty_days
        await plant(memcached, c, b"big", 2**63, exptime=ends)
        assert await c.incr(b"big", 1) == 2**63 + 1
        value, _flags, ttl = item(memcached, b"big")
        assert value == b"%d" % (2**63 + 1)
        # (The time it ends is this machine's clock's; memcached's own clock runs up to a
        # couple of seconds behind it, ticking once a second.)
        assert sixty_days - 60 < ttl <= sixty_days + 5

    run([memcached.location], scenario)


def test_meta_arithmetic_counts_a_misread_counter_under_a_key_of_any_bytes(
    run: Runner, memcached: MemcachedServer
) -> None:
    key = b"a b\x01\xff"  # travels base64-encoded

    async def scenario(c: CommandSet) -> None:
        await plant(memcached, c, key, 2**63, base64_key=True)
        count = await c.meta_arithmetic(key, 2, base64_key=True)
        assert (count.status, count.value) == (MetaStatus.HD, 2**63 + 2)
        stored = await c.meta_get(key, base64_key=True)
        assert stored is not None
        assert stored.value == b"%d" % (2**63 + 2)

    run([memcached.location], scenario)


def test_meta_arithmetic_with_an_exptime_of_its_own_keeps_the_refusal(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(c: CommandSet) -> None:
        await plant(memcached, c, b"big", 2**63)
        with pytest.raises(ClientError):
            await c.meta_arithmetic(b"big", 1, exptime=60)
        assert item(memcached, b"big")[0] == b"%d" % 2**63

    run([memcached.location], scenario)


def test_a_refused_count_of_a_stale_item_leaves_its_win_to_the_next_reader(
    run: Runner, memcached: MemcachedServer
) -> None:
    # Reading a stale item (md ... I) hands its first reader the right to recompute it: the
    # read behind a refused count must not keep it from get_or_set's callers.
    async def scenario(c: CommandSet) -> None:
        await c.set(b"k", b"text")
        assert (await c.meta_delete(b"k", invalidate=True)).status is MetaStatus.HD
        with pytest.raises(ClientError):
            await c.incr(b"k", 1)
        reader = await c.meta_get(b"k", cas=True)
        assert reader is not None
        assert reader.stale
        assert reader.win

    run([memcached.location], scenario)


@pytest.mark.parametrize(
    "value",
    [b"18446744073709551616", b"text", b"9223372036854775808-"],
    ids=["beyond-2**64-1", "text", "a-dash-of-its-own"],
)
def test_a_refusal_memcached_is_right_about_stands(
    run: Runner, memcached: MemcachedServer, value: bytes
) -> None:
    async def scenario(c: CommandSet) -> None:
        await c.set(b"k", value)
        with pytest.raises(ClientError):
            await c.incr(b"k", 1)
        with pytest.raises(ClientError):
            await c.meta_arithmetic(b"k", 1)
        assert item(memcached, b"k")[0] == value  # nothing was stored

    run([memcached.location], scenario)


def test_a_misread_counter_with_a_cas_of_the_callers_own_keeps_its_refusal(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(c: CommandSet) -> None:
        await plant(memcached, c, b"big", 2**63)
        held = await c.gets(b"big")
        assert held is not None
        with pytest.raises(ClientError):
            await c.meta_arithmetic(b"big", 1, cas=held.cas)
        assert item(memcached, b"big")[0] == b"%d" % 2**63

    run([memcached.location], scenario)


def test_without_meta_commands_the_refusal_stands(memcached: MemcachedServer) -> None:
    async def scenario() -> None:
        client = Client([memcached.location], meta=False)
        try:
            await plant(memcached, client, b"big", 2**63)
            with pytest.raises(ClientError):
                await client.incr(b"big", 1)
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("command", ["incr", "meta_arithmetic"])
@pytest.mark.parametrize("races", [1, RECOUNT_TRIES])
def test_a_counter_changed_while_it_is_counted_is_counted_again(
    memcached: MemcachedServer, races: int, command: str
) -> None:
    """A write lands between the read and the store of a count made here (a misread
    counter again): the store finds the CAS changed and stores nothing, and the count is
    made again on the new value; a count that finds it changed every time, a few times
    over, raises the refusal."""

    def raw_set(number: int) -> None:
        digits = b"%d" % number
        assert raw(memcached, b"set big 2 0 %d\r\n%s\r\n" % (len(digits), digits)) == (
            b"STORED\r\n"
        )

    async def scenario() -> None:
        client = Client([memcached.location])
        inner = client.meta_line
        written: list[int] = []

        async def racing(node: int, data: bytes) -> Any:
            if data.startswith(b"ms big ") and len(written) < races:
                written.append(2**63 + 100 * (len(written) + 1))
                plant_misread(memcached, b"big", written[-1], lambda: raw_set(written[-1]))
            return await inner(node, data)

        async def count() -> int | None:
            if command == "incr":
                return await client.incr(b"big", 1)
            return (await client.meta_arithmetic(b"big", 1)).value

        client.meta_line = racing  # type: ignore[method-assign]
        try:
            await plant(memcached, client, b"big", 2**63)
            if races < RECOUNT_TRIES:
                assert await count() == written[-1] + 1
                assert item(memcached, b"big")[0] == b"%d" % (written[-1] + 1)
            else:
                with pytest.raises(ClientError):
                    await count()
                assert item(memcached, b"big")[0] == b"%d" % written[-1]  # uncounted
            assert len(written) == races
        finally:
            await client.aclose()

    asyncio.run(scenario())


# -- the backend -------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("tier", ["memcached-only", "tiered"])
def test_fastcache_counts_a_counter_memcached_misreads(
    memcached: MemcachedServer, request: pytest.FixtureRequest, tier: str, api: str
) -> None:
    options: dict[str, Any] = (
        {"disk_tier": False}
        if tier == "memcached-only"
        else {"disk_directory": request.getfixturevalue("disk_directory")}
    )
    cache = FastCache(memcached.location, {"OPTIONS": options})
    loop = asyncio.new_event_loop()

    def call(name: str, *args: Any) -> Any:
        if api == "async":
            return loop.run_until_complete(getattr(cache, "a" + name)(*args))
        return getattr(cache, name)(*args)

    wire = cache.make_and_validate_key("hits").encode()
    try:
        plant_misread(memcached, wire, U64 - 1, lambda: call("set", "hits", U64 - 1))
        assert call("incr", "hits", 3) == 2
        assert call("get", "hits") == 2
        plant_misread(memcached, wire, 2**63, lambda: call("set", "hits", 2**63))
        assert call("decr", "hits", 2**63 + 1) == 0
        assert call("get", "hits") == 0
        plant_misread(memcached, wire, 2**63, lambda: call("set", "hits", 2**63))
        assert call("incr", "hits", 2) == 2**63 + 2
        store = cache._shared().tiered
        if store is not None:  # the count's disk copy answers once memcached lost it
            assert store.flush(LANDING_WAIT)
            memcached.flush()
            assert call("get", "hits") == 2**63 + 2
        # A value that is no counter at all is still refused.
        call("set", "hits", "text")
        with pytest.raises(NonIntegerValueError):
            call("incr", "hits", 1)
    finally:
        if api == "async":
            loop.run_until_complete(cache.client.aclose())
        loop.close()


def test_the_tiers_count_of_a_misread_counter_written_meanwhile_is_made_again(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    """Another cache's write lands between the read and the store of a count the tier's
    client makes: the store finds the CAS changed, the tier counts again, on the write's
    value, and once memcached lost the key the disk answers that count or nothing."""
    options = {"disk_directory": disk_directory}
    cache = FastCache(memcached.location, {"OPTIONS": options})
    other = FastCache(memcached.location, {"OPTIONS": options})
    wire = cache.make_and_validate_key("hits").encode()
    written: list[int] = []

    async def scenario() -> int:
        client = cache.client
        inner = client.meta_line

        async def racing(node: int, data: bytes) -> Any:
            if data.startswith(b"ms " + wire) and not written:
                poison(memcached, wire, 2**63 + 100, 5)  # the new one misread too, maybe
                other.set("hits", 2**63 + 100)
                written.append(2**63 + 100)
            return await inner(node, data)

        client.meta_line = racing  # type: ignore[method-assign]
        try:
            return await cache.aincr("hits", 1)
        finally:
            del client.meta_line
            await client.aclose()

    plant_misread(memcached, wire, 2**63, lambda: cache.set("hits", 2**63))
    assert asyncio.run(scenario()) == 2**63 + 101
    assert written == [2**63 + 100]
    assert cache.get("hits") == other.get("hits") == 2**63 + 101
    for each in (cache, other):
        store = each._shared().tiered
        assert store is not None
        assert store.flush(LANDING_WAIT)
    memcached.flush()
    # The disk never answers the write the count overtook: the count, or a miss (the two
    # writes' stamps crossed: the disk copy is dropped, docs/disk-tier.md).
    assert cache.get("hits") in (None, 2**63 + 101)
    assert other.get("hits") in (None, 2**63 + 101)


def test_the_tiers_count_raced_every_time_raises_the_refusal_rather_than_a_miss(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    """Every store of a count the tier's client makes finds the item changed: after as many
    tries as the client itself makes, the refusal is raised, never "missing"."""
    cache = FastCache(memcached.location, {"OPTIONS": {"disk_directory": disk_directory}})
    wire = cache.make_and_validate_key("hits").encode()
    raced: list[int] = []

    async def scenario() -> None:
        client = cache.client
        inner = client.meta_line

        async def racing(node: int, data: bytes) -> Any:
            if data.startswith(b"ms " + wire):  # each time, a write lands first
                raced.append(1)
                plant_misread(memcached, wire, 2**63, lambda: raw_set(2**63 + len(raced)))
            return await inner(node, data)

        client.meta_line = racing  # type: ignore[method-assign]
        try:
            with pytest.raises(NonIntegerValueError):
                await cache.aincr("hits", 1)
        finally:
            del client.meta_line
            await client.aclose()

    def raw_set(number: int) -> None:
        digits = b"%d" % number
        request = b"set %s %d 0 %d\r\n%s\r\n" % (wire, FLAG_INTEGER, len(digits), digits)
        assert raw(memcached, request) == b"STORED\r\n"

    plant_misread(memcached, wire, 2**63, lambda: cache.set("hits", 2**63))
    asyncio.run(scenario())
    assert len(raced) == RECOUNT_TRIES
    assert cache.get("hits") == 2**63 + len(raced)  # the last write, uncounted
