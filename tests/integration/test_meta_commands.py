"""The meta commands against real memcached, on both clients: values, CAS, leases (W/Z),
invalidation (X), counters, quiet multi-get over several nodes, binary keys, errors, and
telling a server without meta support apart."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient, count_line
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import CommandSet
from django_fastcache.client.meta import MetaCount, counted
from django_fastcache.errors import (
    ClientError,
    InvalidArgumentError,
    InvalidKeyError,
    ProtocolError,
    ValueTooLargeError,
)
from django_fastcache.protocol import (
    MetaReply,
    MetaStatus,
    MetaUnsupportedError,
)
from django_fastcache.testing.fake_server import FakeMemcached
from django_fastcache.testing.servers import MemcachedServer

from ..conftest import MemcachedCluster
from .client_runner import Runner, runner_fixture

S = MetaStatus


run = runner_fixture()


# -- get and set ----------------------------------------------------------------------------


def test_set_then_get_with_flags_cas_and_ttl(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        stored = await client.meta_set(b"k", b"value", flags=7, exptime=300, return_cas=True)
        got = await client.meta_get(b"k", cas=True, ttl=True)
        return stored, got, await client.meta_get(b"missing")

    stored, got, missing = run([memcached.location], scenario)
    assert stored.status is S.HD
    assert stored.cas is not None
    assert got.status is S.VA
    assert (got.value, got.client_flags, got.cas) == (b"value", 7, stored.cas)
    assert 0 < got.ttl <= 300
    assert (got.win, got.stale, got.won_elsewhere) == (False, False, False)
    assert missing is None


def test_values_holding_protocol_bytes_come_back_exact(
    run: Runner, memcached: MemcachedServer
) -> None:
    values = [b"", b"\r\nMN\r\n", b"EN\r\nVA 3\r\n", bytes(range(256)) * 300]

    async def scenario(client: CommandSet) -> list[bytes | None]:
        for index, value in enumerate(values):
            await client.meta_set(b"v%d" % index, value)
        replies = [await client.meta_get(b"v%d" % index) for index in range(len(values))]
        return [None if reply is None else reply.value for reply in replies]

    assert run([memcached.location], scenario) == values


def test_touch_hit_and_last_access(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_set(b"k", b"v", exptime=100)
        first = await client.meta_get(b"k", hit=True, last_access=True, touch=1000, ttl=True)
        second = await client.meta_get(b"k", hit=True, ttl=True, value=False)
        return first, second

    first, second = run([memcached.location], scenario)
    assert first.hit is False
    assert first.last_access is not None
    assert second.hit is True
    assert 100 < second.ttl <= 1000
    assert second.status is S.HD
    assert second.value is None


def test_set_modes(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        outcomes = [
            (await client.meta_set(b"k", b"b", mode="replace")).status,  # missing: refused
            (await client.meta_set(b"k", b"b", mode="add")).status,
            (await client.meta_set(b"k", b"x", mode="add")).status,  # exists: refused
            (await client.meta_set(b"k", b"c", mode="append")).status,
            (await client.meta_set(b"k", b"a", mode="prepend")).status,
            (await client.meta_set(b"nope", b"a", mode="append")).status,
        ]
        got = await client.meta_get(b"k")
        return outcomes, got.value

    outcomes, value = run([memcached.location], scenario)
    assert outcomes == [S.NS, S.HD, S.NS, S.HD, S.HD, S.NS]
    assert value == b"abc"


def test_classic_and_meta_commands_share_items(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.set(b"classic", b"one", flags=3)
        await client.meta_set(b"meta", b"two", flags=4)
        return await client.meta_get(b"classic"), await client.get(b"meta")

    meta_view, classic_view = run([memcached.location], scenario)
    assert (meta_view.value, meta_view.client_flags) == (b"one", 3)
    assert (classic_view.value, classic_view.flags) == (b"two", 4)


# -- leases ---------------------------------------------------------------------------------


def test_two_callers_on_a_miss_exactly_one_wins(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        first = await client.meta_get(b"lease", vivify=30, cas=True)
        second = await client.meta_get(b"lease", vivify=30, cas=True)
        return first, second

    first, second = run([memcached.location], scenario)
    assert (first.win, first.won_elsewhere) == (True, False)
    assert (second.win, second.won_elsewhere) == (False, True)
    assert first.value == second.value == b""


def test_many_concurrent_tasks_one_win(memcached: MemcachedServer) -> None:
    async def scenario() -> list[Any]:
        client = Client([memcached.location], max_connections=8)
        try:
            return await asyncio.gather(*[client.meta_get(b"hot", vivify=30) for _ in range(60)])
        finally:
            await client.aclose()

    replies = asyncio.run(scenario())
    assert sum(reply.win for reply in replies) == 1
    assert sum(reply.won_elsewhere for reply in replies) == 59


def test_many_threads_one_win(memcached: MemcachedServer) -> None:
    # The blocking client keeps one connection per thread: 50 connections race for the stub.
    client = BlockingClient(Cluster([memcached.location], ClientSettings()))
    wins: list[bool] = []
    barrier = threading.Barrier(50)

    def caller() -> None:
        barrier.wait()
        try:
            reply = run_blocking(client.meta_get(b"hot", vivify=30))
            wins.append(reply.win)
        finally:
            client.close_thread_connections()

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 50
    assert wins.count(True) == 1


def test_winner_stores_with_its_cas_and_the_stub_becomes_a_value(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> Any:
        lease = await client.meta_get(b"k", vivify=30, cas=True)
        stored = await client.meta_set(b"k", b"fresh", cas=lease.cas, exptime=60)
        return lease, stored, await client.meta_get(b"k", vivify=30)

    lease, stored, after = run([memcached.location], scenario)
    assert lease.win
    assert stored.status is S.HD
    assert after.value == b"fresh"
    assert (after.win, after.won_elsewhere, after.stale) == (False, False, False)


def test_store_with_the_lease_cas_fails_after_a_delete(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> Any:
        lease = await client.meta_get(b"k", vivify=30, cas=True)
        deleted = await client.meta_delete(b"k")
        stored = await client.meta_set(b"k", b"old data", cas=lease.cas)
        return lease, deleted, stored, await client.meta_get(b"k")

    lease, deleted, stored, after = run([memcached.location], scenario)
    assert lease.win
    assert deleted.status is S.HD
    assert stored.status is S.NF  # the recompute does not resurrect what was deleted
    assert after is None


def test_store_with_a_stale_cas_fails_after_another_write(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> Any:
        lease = await client.meta_get(b"k", vivify=30, cas=True)
        await client.meta_set(b"k", b"newer")
        stored = await client.meta_set(b"k", b"older", cas=lease.cas)
        return stored, await client.meta_get(b"k")

    stored, after = run([memcached.location], scenario)
    assert stored.status is S.EX
    assert after.value == b"newer"


def test_invalidate_then_readers_see_stale_and_one_wins(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_set(b"k", b"old")
        before = await client.meta_get(b"k", cas=True)
        invalidated = await client.meta_delete(b"k", invalidate=True, exptime=30)
        first = await client.meta_get(b"k", cas=True)
        second = await client.meta_get(b"k", cas=True)
        late = await client.meta_set(b"k", b"late", cas=before.cas)
        refreshed = await client.meta_set(b"k", b"new", cas=first.cas)
        return invalidated, before, first, second, late, refreshed, await client.meta_get(b"k")

    invalidated, before, first, second, late, refreshed, after = run([memcached.location], scenario)
    assert invalidated.status is S.HD
    assert (first.value, first.stale, first.win) == (b"old", True, True)
    assert (second.value, second.stale, second.win, second.won_elsewhere) == (
        b"old",
        True,
        False,
        True,
    )
    assert first.cas != before.cas  # invalidation bumps the CAS
    assert late.status is S.EX
    assert refreshed.status is S.HD
    assert (after.value, after.stale, after.win) == (b"new", False, False)


def test_recache_wins_before_expiry(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_set(b"k", b"v", exptime=20)
        far = await client.meta_get(b"k", recache=5)
        near = await client.meta_get(b"k", recache=60)
        again = await client.meta_get(b"k", recache=60)
        return far, near, again

    far, near, again = run([memcached.location], scenario)
    assert (far.win, far.won_elsewhere) == (False, False)
    assert near.win
    assert again.won_elsewhere


def test_delete_with_cas(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        stored = await client.meta_set(b"k", b"v", return_cas=True)
        wrong = await client.meta_delete(b"k", cas=stored.cas + 1)
        right = await client.meta_delete(b"k", cas=stored.cas)
        return wrong.status, right.status, (await client.meta_delete(b"k")).status

    assert run([memcached.location], scenario) == (S.EX, S.HD, S.NF)


# -- counters -------------------------------------------------------------------------------


def test_arithmetic(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> list[MetaCount]:
        return [
            await client.meta_arithmetic(b"n"),
            await client.meta_arithmetic(b"n", vivify=0, initial=10),
            await client.meta_arithmetic(b"n", 5),
            await client.meta_arithmetic(b"n", 100, decrement=True),
            await client.meta_arithmetic(b"n", 2**64 - 1),
        ]

    missing, created, added, floored, big = run([memcached.location], scenario)
    assert (missing.status, missing.value) == (S.NF, None)
    assert (created.status, created.value, created.ttl) == (S.HD, 10, -1)
    assert created.cas is not None
    assert (added.value, floored.value, big.value) == (15, 0, 2**64 - 1)
    assert added.cas != created.cas


def test_arithmetic_keeps_the_ttl_and_honours_cas(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_set(b"n", b"1", exptime=500)
        counted = await client.meta_arithmetic(b"n")
        wrong = await client.meta_arithmetic(b"n", cas=counted.cas + 1)
        right = await client.meta_arithmetic(b"n", cas=counted.cas, exptime=900)
        return counted, wrong, right

    counted, wrong, right = run([memcached.location], scenario)
    assert counted.value == 2
    assert 400 < counted.ttl <= 500
    assert wrong.status is S.EX
    assert (right.value, right.status) == (3, S.HD)
    assert 500 < right.ttl <= 900


def test_arithmetic_on_a_non_number_is_a_client_error(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_set(b"k", b"text")
        with pytest.raises(ClientError, match="non-numeric"):
            await client.meta_arithmetic(b"k")
        return await client.meta_get(b"k")  # the connection stays usable

    assert run([memcached.location], scenario).value == b"text"


def test_count_at_is_meta_arithmetic_as_a_plain_call(memcached: MemcachedServer) -> None:
    """The blocking client's ``count_at`` (the disk tier's flat increment): the count and
    the TTL left as ``meta_arithmetic`` answers them, None for a missing key, an error
    reply raised, and the connection kept in step throughout."""
    client = BlockingClient(Cluster([memcached.location], ClientSettings(timeout=5.0)))
    try:
        node = client.cluster.node_index(b"n")
        assert client.count_at(node, b"n", 1) is None
        run_blocking(client.meta_set(b"n", b"10", exptime=500))
        counted = client.count_at(node, b"n", 5)
        assert counted is not None
        assert counted[0] == 15
        ttl = counted[1]
        assert ttl is not None
        assert 400 < ttl <= 500
        assert client.count_at(node, b"n", -100) == (0, ttl)  # memcached stops at 0
        assert client.count_at(node, b"n", 2**64 - 1) == (2**64 - 1, ttl)
        assert client.count_at(node, b"n", 1) == (0, ttl)  # and wraps an increment
        run_blocking(client.meta_set(b"forever", b"1"))
        assert client.count_at(client.cluster.node_index(b"forever"), b"forever", 1) == (2, -1)
        run_blocking(client.meta_set(b"k", b"text"))
        with pytest.raises(ClientError, match="non-numeric"):
            client.count_at(client.cluster.node_index(b"k"), b"k", 1)
        assert client.value_now(b"k") == (b"text", 0)  # the connection stays usable
        assert run_blocking(client.meta_arithmetic(b"n", 2)).value == 2
    finally:
        client.close_thread_connections()


def test_meta_line_answers_one_command_built_by_its_caller(
    run: Runner, memcached: MemcachedServer
) -> None:
    """``meta_line`` (the disk tier's coroutines, which build their few commands at once):
    the one reply as the general commands answer it, an error reply raised, and the
    connection kept in step, over both clients."""

    async def scenario(client: CommandSet) -> Any:
        node = client.cluster.node_index(b"n")
        missing = await client.meta_line(node, count_line(b"n", 1))
        await client.meta_set(b"n", b"10", exptime=500)
        up = await client.meta_line(node, count_line(b"n", 5))
        down = await client.meta_line(node, count_line(b"n", -100))
        read = await client.meta_line(node, b"mg n v c f T600\r\n")
        await client.meta_set(b"t", b"text")
        with pytest.raises(ClientError, match="non-numeric"):
            await client.meta_line(client.cluster.node_index(b"t"), count_line(b"t", 1))
        return missing, up, down, read, await client.meta_get(b"n", ttl=True)

    missing, up, down, read, after = run([memcached.location], scenario)
    assert counted(missing) is None
    assert (up.status, up.value) == (S.VA, b"15")
    assert up.cas is not None
    assert counted(up) == (15, up.ttl)
    assert 400 < up.ttl <= 500
    assert counted(down) == (0, down.ttl)  # memcached stops a decrement at 0
    # (memcached's decrement pads a shorter number with spaces)
    assert (read.status, read.value, read.client_flags) == (S.VA, b"0 ", 0)
    assert read.cas == down.cas  # a read changes no CAS
    assert after.value == b"0 "
    assert 500 < after.ttl <= 600  # touched by the read's T


@pytest.mark.parametrize(
    ("delta", "line"),
    [
        (0, b"ma n D0 v c t\r\n"),
        (1, b"ma n D1 v c t\r\n"),
        (2**64 - 1, b"ma n D18446744073709551615 v c t\r\n"),
        (-1, b"ma n MD D1 v c t\r\n"),
        (-(2**64 - 1), b"ma n MD D18446744073709551615 v c t\r\n"),
    ],
)
def test_count_line_asks_for_the_value_cas_and_ttl(delta: int, line: bytes) -> None:
    assert count_line(b"n", delta) == line


@pytest.mark.parametrize("delta", [2**64, -(2**64)])
def test_count_line_refuses_a_delta_beyond_what_memcached_counts_by(delta: int) -> None:
    # (A delta that is not an int is refused before: the backend's incr and decr.)
    with pytest.raises(InvalidArgumentError, match="between 0 and"):
        count_line(b"n", delta)


def test_counted_refuses_a_reply_without_a_number() -> None:
    with pytest.raises(ProtocolError, match="without a number"):
        counted(MetaReply(S.HD))
    with pytest.raises(ProtocolError, match="without a number"):
        counted(MetaReply(S.VA, value=b"x1"))


def test_count_at_on_a_server_without_meta_raises_meta_unsupported() -> None:
    with FakeMemcached(values={b"n": b"1"}) as fake:
        client = BlockingClient(Cluster([fake.location], ClientSettings(timeout=5.0)))
        try:
            with pytest.raises(MetaUnsupportedError):
                client.count_at(0, b"n", 1)
            assert client.incr_now(b"n", 1) == 2  # classic commands still work
        finally:
            client.close_thread_connections()


# -- quiet multi-get ------------------------------------------------------------------------


def test_get_many_over_every_node(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    keys = [b"key-%d" % i for i in range(400)]
    stored = {key: b"\r\nMN\r\n" + key for key in keys[::3]}

    async def scenario(client: CommandSet) -> Any:
        for key, value in stored.items():
            await client.meta_set(key, value, flags=len(key))
        return await client.meta_get_many(iter(keys + keys[:10]), cas=True)

    found = run(memcached_cluster.locations, scenario)
    assert set(found) == set(stored)
    for key, reply in found.items():
        assert (reply.key, reply.value, reply.client_flags) == (key, stored[key], len(key))
        assert reply.cas is not None


def test_get_many_of_nothing_and_of_misses(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> Any:
        return await client.meta_get_many([]), await client.meta_get_many([b"a", b"b"])

    assert run([memcached.location], scenario) == ({}, {})


def test_binary_keys(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    keys = [b"\x00\r\n \xff", b"plain", bytes(range(186))]

    async def scenario(client: CommandSet) -> Any:
        for key in keys:
            await client.meta_set(key, key[::-1], base64_key=True)
        one = await client.meta_get(keys[0], base64_key=True)
        many = await client.meta_get_many([*keys, b"\x01missing"], base64_key=True)
        gone = await client.meta_delete(keys[0], base64_key=True)
        return one, many, gone

    one, many, gone = run(memcached_cluster.locations, scenario)
    assert one.value == keys[0][::-1]
    assert {key: reply.value for key, reply in many.items()} == {k: k[::-1] for k in keys}
    assert gone.status is S.HD


# -- errors and detection -------------------------------------------------------------------


def test_too_large_value_raises_and_the_connection_stays_usable(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_set(b"k", b"small")
        with pytest.raises(ValueTooLargeError):
            await client.meta_set(b"k", b"x" * (2 * 1024 * 1024))
        # memcached drops the old value of a failed set; the same connection goes on.
        gone = await client.meta_get(b"k")
        await client.meta_set(b"k", b"again")
        return gone, await client.meta_get(b"k")

    gone, after = run([memcached.location], scenario)
    assert gone is None
    assert after.value == b"again"


def test_bad_arguments_are_refused_before_sending(run: Runner, memcached: MemcachedServer) -> None:
    async def scenario(client: CommandSet) -> None:
        with pytest.raises(InvalidKeyError):
            await client.meta_get(b"a b")
        with pytest.raises(InvalidKeyError):
            await client.meta_get_many([b"ok", b"not ok"])
        with pytest.raises(InvalidArgumentError):
            await client.meta_set(b"k", b"v", mode="cas")
        with pytest.raises(InvalidArgumentError):
            await client.meta_arithmetic(b"k", decrement=1)  # type: ignore[arg-type]
        await client.meta_noop()

    run([memcached.location], scenario)


def test_noop_and_detection_on_every_node(run: Runner, memcached_cluster: MemcachedCluster) -> None:
    async def scenario(client: CommandSet) -> Any:
        await client.meta_noop()
        return await client.speaks_meta()

    locations = memcached_cluster.locations
    answers = run(locations, scenario)
    assert len(answers) == len(locations)
    assert all(answers.values())


def test_a_server_without_meta_support_is_told_apart(run: Runner) -> None:
    # The fake speaks only the classic protocol and answers ERROR to anything else, as
    # memcached before 1.6 does.
    with FakeMemcached(values={b"k": b"v"}) as fake:

        async def scenario(client: CommandSet) -> Any:
            answers = await client.speaks_meta()
            return answers, await client.get(b"k")  # classic commands still work

        answers, item = run([fake.location], scenario)
    assert list(answers.values()) == [False]
    assert item.value == b"v"
