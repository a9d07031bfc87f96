"""The asyncio client's metrics, node events and idle purge, against real memcached
processes that the tests stop, pause and start again.

Autobatching is off here: these tests count the requests of plain calls one by one.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Callable, Iterator

import pytest

from django_fastcache.client import Client, forksafe
from django_fastcache.client.events import NodeEvent
from django_fastcache.client.metrics import LATENCY_BOUNDS, MetricsSnapshot
from django_fastcache.client.pool import Pool
from django_fastcache.errors import (
    ClientError,
    ConnectFailedError,
    ConnectionLostError,
    NetworkError,
    OperationTimeoutError,
)
from django_fastcache.testing.servers import MemcachedServer

pytestmark = pytest.mark.integration


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    """A memcached of the test's own: the test may kill, pause and restart it."""
    process = MemcachedServer().start()
    try:
        yield process
    finally:
        if process.running:
            process.resume()
        process.kill()


def make_client(server: MemcachedServer, **options: object) -> Client:
    # Each request on a connection of its own: the pool's waits are what is counted here.
    return Client(
        [server.location],
        autobatching=False,
        pipelining=False,
        **options,  # type: ignore[arg-type]
    )


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def node(snapshot: MetricsSnapshot, server: MemcachedServer):  # type: ignore[no-untyped-def]
    return snapshot.nodes[server.location]


# -- counts, errors, latencies -------------------------------------------------------------------
def test_calls_errors_and_latencies_per_operation(server: MemcachedServer) -> None:
    async def scenario() -> MetricsSnapshot:
        client = make_client(server, latency_metrics=True)
        try:
            for n in range(7):
                assert await client.set(b"k%d" % n, b"v") is True
            for n in range(5):
                assert await client.get(b"k%d" % n) is not None
            assert await client.get(b"missing") is None  # a miss is a call, not an error
            with pytest.raises(ClientError):
                await client.incr(b"k0")  # not a number: the server's error reply
            assert await client.get_many([b"k1", b"k2"]) != {}  # one node, one request
            return client.metrics()
        finally:
            await client.aclose()

    snapshot = asyncio.run(scenario())
    assert snapshot.client == "async"
    stats = node(snapshot, server)
    assert stats.healthy
    ops = stats.operations
    assert (ops["store"].calls, ops["store"].errors) == (7, 0)
    assert (ops["get"].calls, ops["get"].errors, ops["get"].timeouts) == (7, 0, 0)
    assert (ops["incr"].calls, ops["incr"].errors, ops["incr"].timeouts) == (1, 1, 0)
    assert ops["delete"].calls == 0
    for name in ("store", "get", "incr"):
        latency = ops[name].latency
        assert latency is not None
        assert latency.bounds == LATENCY_BOUNDS
        assert latency.count == ops[name].calls  # every call here got a reply
        assert 0 < latency.sum < 5
        assert latency.cumulative()[-1] == (float("inf"), ops[name].calls)
    # The 15 calls above, and the read after the refused incr (a counter memcached misreads
    # would be counted: docs/async-client.md, "Counters memcached refuses by mistake").
    assert stats.calls == 16
    assert stats.errors == 1
    # One connection served everything, one call at a time.
    assert (stats.pool.open, stats.pool.idle, stats.pool.in_use) == (1, 1, 0)
    assert stats.pool.opened == 1
    assert stats.pool.waits == 0


def test_latencies_are_measured_only_when_asked_for(server: MemcachedServer) -> None:
    async def scenario() -> MetricsSnapshot:
        client = make_client(server)
        try:
            await client.get(b"x")
            return client.metrics()
        finally:
            await client.aclose()

    get = node(asyncio.run(scenario()), server).operations["get"]
    assert get.calls == 1
    assert get.latency is None


def test_counts_survive_the_event_loops_that_made_them(server: MemcachedServer) -> None:
    client = make_client(server)

    async def three_gets() -> None:
        for _ in range(3):
            await client.get(b"x")

    asyncio.run(three_gets())  # a loop that is closed afterwards, its pool dropped
    asyncio.run(three_gets())
    stats = node(client.metrics(), server)
    assert stats.operations["get"].calls == 6
    assert stats.pool.opened == 2  # one connection per loop
    assert stats.pool.open == 0  # both loops are closed: nothing is counted as open


def test_timeouts_are_counted_and_the_node_turns_unhealthy(server: MemcachedServer) -> None:
    events: list[NodeEvent] = []

    async def scenario() -> MetricsSnapshot:
        # The set, which must succeed, is made with 5 s by a client of its own (a connection
        # keeps its first request's deadline timer: a timeout shortened on it would not
        # bound the paused calls); the last get is given 5 s.
        seeder = make_client(server, timeout=5.0)
        try:
            await seeder.set(b"t", b"v")
        finally:
            await seeder.aclose()
        client = make_client(server, timeout=0.2, latency_metrics=True)
        client.on_node_event(events.append)
        try:
            server.pause()
            try:
                for _ in range(2):
                    with pytest.raises(OperationTimeoutError):
                        await client.get(b"t")
            finally:
                server.resume()
            assert [e.healthy for e in events] == [False]  # once, not per failed call
            client.timeout = 5.0
            assert await client.get(b"t") is not None
            assert [e.healthy for e in events] == [False, True]
            return client.metrics()
        finally:
            await client.aclose()

    snapshot = asyncio.run(scenario())
    get = node(snapshot, server).operations["get"]
    assert (get.calls, get.errors, get.timeouts) == (3, 2, 2)
    assert get.latency is not None
    assert get.latency.count == 1
    assert isinstance(events[0].error, OperationTimeoutError)
    assert events[0].node == server.location
    assert events[1].error is None
    assert events[0].at <= events[1].at


# -- node events against a memcached that stops and starts ---------------------------------------
def test_node_events_follow_a_memcached_that_stops_and_starts(server: MemcachedServer) -> None:
    events: list[NodeEvent] = []

    async def scenario() -> None:
        client = make_client(server, timeout=1.0)
        unsubscribe = client.on_node_event(events.append)
        try:
            assert await client.set(b"k", b"v") is True
            assert client.metrics().nodes[server.location].healthy
            server.kill()
            # The pooled connection is found closed, then connecting is refused.
            for _ in range(3):
                with pytest.raises(NetworkError) as caught:
                    await client.get(b"k")
                assert isinstance(caught.value, (ConnectFailedError, ConnectionLostError))
            assert [e.healthy for e in events] == [False]
            assert not client.metrics().nodes[server.location].healthy
            server.restart()
            assert await client.get(b"k") is None  # a fresh memcached: empty, but answering
            assert [e.healthy for e in events] == [False, True]
            assert client.metrics().nodes[server.location].healthy
            unsubscribe()
            server.kill()
            with pytest.raises(NetworkError):
                await client.get(b"k")
            assert len(events) == 2  # unsubscribed: not told any more
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert all(e.node == server.location for e in events)
    stats_error = events[0].error
    assert isinstance(stats_error, NetworkError)


def test_a_failing_subscriber_is_logged_and_the_call_goes_on(
    server: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: NodeEvent) -> None:
        raise RuntimeError("subscriber bug")

    async def scenario() -> None:
        client = make_client(server, timeout=5.0)  # the set must succeed; the get is refused
        client.on_node_event(broken)
        try:
            await client.set(b"k", b"v")
            server.kill()
            with pytest.raises(NetworkError):  # the call's own error, not the subscriber's
                await client.get(b"k")
        finally:
            await client.aclose()

    with caplog.at_level("INFO", logger="django_fastcache"):
        asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any("is unhealthy" in m and server.location in m for m in messages)
    assert any("a node event subscriber failed" in m for m in messages)


def test_a_busy_pool_is_not_an_unhealthy_node(server: MemcachedServer) -> None:
    """Waiting for a connection past the deadline is counted as a wait timeout; the node
    itself answered, so no event is sent."""
    events: list[NodeEvent] = []

    async def scenario() -> MetricsSnapshot:
        # The first get holds the connection for 3 s: a loaded loop firing the waiter's
        # timer late still finds it held, and the two waits stay far apart.
        client = make_client(server, max_connections=1, timeout=3.0)
        client.on_node_event(events.append)
        try:
            await client.set(b"k", b"v")
            server.pause()
            try:
                first = asyncio.create_task(client.get(b"k"))  # holds the one connection
                await asyncio.sleep(0.05)
                client.timeout = 0.2  # read per call: the waiter gives up well before
                waiting = asyncio.create_task(client.get(b"k"))
                with pytest.raises(OperationTimeoutError):
                    await waiting
                assert events == []  # the node has not been found failing yet
                with pytest.raises(OperationTimeoutError):
                    await first
            finally:
                server.resume()
            return client.metrics()
        finally:
            await client.aclose()

    pool = node(asyncio.run(scenario()), server).pool
    assert pool.waits == 1
    assert pool.wait_timeouts == 1
    assert 0.15 < pool.wait_seconds < 2.5  # its own 0.2 s, not the holder's 3 s
    # The first call's reply timed out (the node's doing); the waiter's did not count.
    assert [e.healthy for e in events] == [False]


# -- the idle purge --------------------------------------------------------------------------------
def _purge_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return [
        handle
        for handle in scheduled
        if not handle.cancelled() and getattr(handle._callback, "__func__", None) is Pool._purge  # type: ignore[attr-defined]
    ]


def test_the_purge_timer_stops_at_close(server: MemcachedServer) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client = make_client(server, max_connections=4, idle_timeout=30.0)
        await asyncio.gather(*[client.set(b"k%d" % n, b"v") for n in range(4)])
        assert len(_purge_timers(loop)) == 1  # armed: three connections beyond the minimum
        await client.aclose()
        assert _purge_timers(loop) == []  # nothing of the pool outlives close()

    asyncio.run(scenario())


def test_no_purge_timer_while_nothing_is_beyond_the_minimum(server: MemcachedServer) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client = make_client(server, min_connections=2, max_connections=4, idle_timeout=0.05)
        try:
            await asyncio.gather(*[client.set(b"k%d" % n, b"v") for n in range(4)])
            await eventually(lambda: node(client.metrics(), server).pool.open == 2)
            assert _purge_timers(loop) == []  # at the minimum: the timer is not re-armed
            for _ in range(3):
                await client.get(b"k0")  # one connection at a time: nothing to purge
            assert _purge_timers(loop) == []
            assert node(client.metrics(), server).pool.open == 2
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_inside_the_loop_never_purges_the_parents_connections(
    server: MemcachedServer,
) -> None:
    """A child forked from a coroutine goes on running the parent's loop, purge timer
    included: the timer must not close the connections the child shares with its parent."""

    async def scenario() -> None:
        client = make_client(server, max_connections=4, idle_timeout=0.2)
        try:
            await asyncio.gather(*[client.set(b"k%d" % n, b"v") for n in range(4)])
            loop = asyncio.get_running_loop()
            pid = os.fork()
            if pid == 0:  # the child: let the timer come due, then report what it did
                code = 1
                try:
                    # (asyncio.sleep refuses a loop inherited across fork; the loop's own
                    # timers run all the same, and so would the pool's purge.)
                    later = loop.create_future()
                    loop.call_later(0.5, later.set_result, None)
                    await later
                    pools = [  # this client's, of this loop (others' may be inherited too)
                        pool
                        for pool in _pools_in(forksafe._inherited)
                        if pool.loop is loop and pool.address.node_id == server.location
                    ]
                    code = 0 if pools and all(p.stats().open == 4 for p in pools) else 3
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            _, status = await asyncio.to_thread(os.waitpid, pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            # The parent's own purge still works, and its connections still answer.
            await eventually(lambda: node(client.metrics(), server).pool.open == 1)
            assert await client.get(b"k0") is not None
        finally:
            await client.aclose()

    asyncio.run(scenario())


def _pools_in(inherited: object) -> list[Pool]:
    """The pools among what a forked child kept of its parent's client."""
    found: list[Pool] = []
    stack = [inherited]
    while stack:
        item = stack.pop()
        if isinstance(item, Pool):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, tuple | list):
            stack.extend(item)
    return found
