"""Cancelled async calls against a real memcached: no pool slot is lost, no connection is
reused in an unknown state.

An ASGI server cancels the task of a client that went away, and ``asyncio.timeout()``
cancels the call it wraps; either may land at any await point of a call: waiting for a
connection, connecting, or waiting for the reply. Afterwards the pool must be whole (every
connection it counts is idle, none is lost) and every call must get its own answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.client import Client
from django_fastcache.errors import OperationTimeoutError
from django_fastcache.protocol import Item
from django_fastcache.testing.servers import MemcachedServer

pytestmark = pytest.mark.integration

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
MAX_CONNECTIONS = 4


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Coroutine[Any, Any, Any]], Any]]:
    """Run a coroutine to completion on a fresh loop of the parametrized kind."""
    if request.param == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        yield loop.run_until_complete
    finally:
        loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[MemcachedServer]:
    process = MemcachedServer().start()
    try:
        yield process
    finally:
        process.kill()


def pool_state(client: Client, server: MemcachedServer) -> dict[str, int]:
    return client.pool_metrics()[server.location]


def assert_pool_whole(client: Client, server: MemcachedServer) -> None:
    """Nothing is in use: every connection the pool counts is idle and open."""
    state = pool_state(client, server)
    assert state["open"] == state["idle"], state
    assert 0 <= state["open"] <= MAX_CONNECTIONS, state


async def settled(client: Client, server: MemcachedServer) -> None:
    """Wait for replies still due to cancelled callers, then check that nothing is in use.

    A pipelined or autobatched request whose caller was cancelled keeps its connection
    until its reply has been read (and dropped), within the call's timeout; a slot that was
    lost would never come back."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        state = pool_state(client, server)
        if state["open"] == state["idle"]:
            break
        await asyncio.sleep(0.001)
    assert_pool_whole(client, server)


async def fifty_calls_succeed(client: Client) -> None:
    keys = [b"after:%d" % n for n in range(50)]
    assert all(await asyncio.gather(*[client.set(key, key) for key in keys]))
    found = await asyncio.gather(*[client.get(key) for key in keys])
    assert found == [Item(key, key, 0, None) for key in keys]


# -- random cancellation -------------------------------------------------------------------------
async def one_call(client: Client, rnd: random.Random, n: int) -> None:
    """A call whose answer proves it was not handed another request's reply."""
    key = b"key:%d" % rnd.randrange(20)
    choice = rnd.random()
    if choice < 0.35:
        item = await client.get(key)
        assert item is None or item.value == key, (key, item)
    elif choice < 0.6:
        assert await client.set(key, key) is True
    elif choice < 0.75:
        other = b"key:%d" % rnd.randrange(20)
        items = await client.get_many([key, other])
        assert all(k == item.value for k, item in items.items()), items
    elif choice < 0.85:
        assert await client.delete(key) in (True, False)
    else:
        # asyncio.timeout() around a call, with a budget far shorter than the client's.
        try:
            async with asyncio.timeout(rnd.random() * 0.002):
                item = await client.get(key)
            assert item is None or item.value == key, (key, item)
        except TimeoutError:
            pass


async def cancel_at_random(client: Client, seed: int, rounds: int) -> int:
    """Start a few calls, let them run a random while, cancel some; returns how many calls
    were really cancelled."""
    rnd = random.Random(seed)
    cancelled = 0
    for n in range(rounds):
        tasks = [asyncio.ensure_future(one_call(client, rnd, n)) for _ in range(rnd.randint(1, 9))]
        if rnd.random() < 0.5:
            for _ in range(rnd.randrange(8)):
                await asyncio.sleep(0)  # a few loop turns: lands on any await point
        else:
            await asyncio.sleep(rnd.random() * 0.0005)
        for task in tasks:
            if rnd.random() < 0.6:
                task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, asyncio.CancelledError):
                cancelled += 1
            elif isinstance(outcome, BaseException):
                raise outcome
    return cancelled


def test_random_cancellation_never_loses_a_pool_slot(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer
) -> None:
    async def scenario() -> int:
        # A generous timeout: no call may fail by running out of connections.
        client = Client([server.location], max_connections=MAX_CONNECTIONS, timeout=5.0)
        try:
            cancelled = await cancel_at_random(client, seed=7, rounds=1500)
            await settled(client, server)
            await fifty_calls_succeed(client)
            assert_pool_whole(client, server)
            return cancelled
        finally:
            await client.aclose()

    # Enough cancellations to have landed at every await point, many times over. How many
    # of the ~4,500 tries find their call unfinished depends on the machine's speed (2,078
    # to 2,322 with asyncio, ~3,600 with uvloop, on the development machine).
    assert run(scenario()) >= 1000


def test_timeout_context_around_calls_leaves_the_pool_whole(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer
) -> None:
    """``asyncio.timeout()`` expiring while the server does not answer: the caller gets
    TimeoutError at once, the connection held is dropped, and the pool serves on."""

    async def scenario() -> None:
        client = Client([server.location], max_connections=2, timeout=30.0)
        try:
            await client.set(b"t", b"t")
            server.pause()
            try:
                for _ in range(3):  # more calls than connections: some wait for one
                    calls = [client.get(b"t") for _ in range(5)]
                    with pytest.raises(TimeoutError):
                        async with asyncio.timeout(0.05):
                            await asyncio.gather(*calls)
            finally:
                server.resume()
            assert_pool_whole(client, server)
            assert await client.get(b"t") == Item(b"t", b"t", 0, None)
            await fifty_calls_succeed(client)
        finally:
            await client.aclose()

    run(scenario())


def test_a_waiter_cancelled_once_handed_a_connection_gives_it_back(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer
) -> None:
    """The connection is handed to a queued call and the call is cancelled in the same loop
    turn, before it runs: the call is cancelled (not completed) and the connection kept."""

    async def scenario() -> None:
        client = Client([server.location], max_connections=1, timeout=5.0)
        try:
            await client.set(b"w", b"w")
            pool = client._pools()[0]
            held = pool.try_acquire()  # the one connection, taken as a call would
            assert held is not None
            waiter = asyncio.ensure_future(client.get(b"w"))
            for _ in range(3):
                await asyncio.sleep(0)
            assert pool_state(client, server)["waits"] == 1
            pool.release(held)  # handed to the waiter ...
            waiter.cancel()  # ... which is cancelled before it runs
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert_pool_whole(client, server)
            assert pool_state(client, server)["open"] == 1
            assert pool_state(client, server)["closed"] == 0
            assert await client.get(b"w") == Item(b"w", b"w", 0, None)
        finally:
            await client.aclose()

    run(scenario())


async def _set_patiently(server: MemcachedServer, key: bytes, value: bytes) -> None:
    seeder = Client([server.location], timeout=5.0)
    try:
        assert await seeder.set(key, value)
    finally:
        await seeder.aclose()


def test_waiting_for_a_connection_is_bounded_by_the_timeout(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer
) -> None:
    async def scenario() -> None:
        # The calls that must succeed get 5 s: the value is set by a client of its own (a
        # connection keeps its first request's deadline timer, so a timeout shortened on
        # it would not bound the paused calls), and the last get is given 5 s.
        await _set_patiently(server, b"b", b"b")
        client = Client([server.location], max_connections=1, timeout=0.2)
        try:
            server.pause()
            try:
                outcomes = await asyncio.gather(
                    client.get(b"b"), client.get(b"b"), return_exceptions=True
                )
            finally:
                server.resume()
            assert all(isinstance(o, OperationTimeoutError) for o in outcomes), outcomes
            assert_pool_whole(client, server)
            client.timeout = 5.0
            assert await client.get(b"b") == Item(b"b", b"b", 0, None)
        finally:
            await client.aclose()

    run(scenario())


def test_cancelled_backend_calls_with_the_tier_on_leave_the_pool_whole(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer, disk_directory: str
) -> None:
    """Through the Django backend with the disk tier on, where a lost pool would hide behind
    timeouts answered from disk: afterwards no call falls back to the disk tier."""
    cache = FastCache(
        [server.location],
        {"OPTIONS": {"disk_directory": disk_directory, "max_connections": MAX_CONNECTIONS}},
    )

    async def scenario() -> None:
        rnd = random.Random(11)
        for _ in range(600):
            calls = [
                cache.aget(f"b{rnd.randrange(10)}")
                if rnd.random() < 0.6
                else cache.aset(f"b{rnd.randrange(10)}", rnd.randrange(100))
                for _ in range(rnd.randint(1, 8))
            ]
            tasks = [asyncio.ensure_future(call) for call in calls]
            for _ in range(rnd.randrange(6)):
                await asyncio.sleep(0)
            for task in tasks:
                if rnd.random() < 0.6:
                    task.cancel()
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if not isinstance(outcome, asyncio.CancelledError | None | int):
                    raise AssertionError(outcome)
        assert_pool_whole(cache.client, server)
        stats = cache.tier_stats()
        assert stats is not None
        fallbacks = stats["fallbacks"]
        await cache.aset("after", "yes")
        assert await asyncio.gather(*[cache.aget("after") for _ in range(50)]) == ["yes"] * 50
        stats = cache.tier_stats()
        assert stats is not None
        assert stats["fallbacks"] == fallbacks  # every one answered by memcached
        assert stats["nodes"][server.location]["state"] == "up"
        await cache.client.aclose()

    run(scenario())


class GatedForwarder:
    """A loopback forwarder to memcached that can hold back what one of its connections
    sends: memcached has the request but has not run it yet (its worker thread busy). The
    bytes held are passed on, in order, when the gate opens; no timing is involved."""

    def __init__(self, upstream: MemcachedServer) -> None:
        self.upstream = upstream
        self.connections = 0
        self.gated: set[int] = set()
        self._held: dict[int, list[bytes]] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None
        self.location = ""

    async def start(self) -> GatedForwarder:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.location = f"127.0.0.1:{port}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        host, _, port = self.upstream.location.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self._writers[number] = up_writer

        async def replies() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()

        back = asyncio.ensure_future(replies())
        try:
            while data := await reader.read(65536):
                if number in self.gated:
                    self._held.setdefault(number, []).append(data)
                else:
                    up_writer.write(data)
                    await up_writer.drain()
        except ConnectionError:
            pass
        finally:
            back.cancel()

    def open(self, number: int) -> None:
        self.gated.discard(number)
        for data in self._held.pop(number, []):
            self._writers[number].write(data)

    def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers.values():
            writer.close()


async def _loop_turns(count: int = 20) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


WRITES: dict[str, Callable[[Client], Coroutine[Any, Any, Any]]] = {
    "set": lambda client: client.set(b"w", b"A"),
    "set_many": lambda client: client.set_many([(b"w", b"A", 0), (b"w2", b"A", 0)]),
    "delete": lambda client: client.delete(b"w"),
    "incr": lambda client: client.incr(b"n", 5),
}


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "one-per-connection"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_cancelled_write_ends_its_call_only_once_memcached_answered_it(
    run: Callable[[Coroutine[Any, Any, Any]], Any],
    server: MemcachedServer,
    write: str,
    pipelining: bool,
) -> None:
    """memcached keeps the order of one connection's requests only. A write whose caller
    stopped waiting could still land after a later write of the same key sent on another
    connection, so the cancelled call ends once its reply is in, and what it wrote is there."""

    async def scenario() -> None:
        forwarder = await GatedForwarder(server).start()
        client = Client([forwarder.location], pipelining=pipelining, timeout=5.0)
        try:
            assert await client.set(b"w", b"old")
            assert await client.set(b"n", b"1")
            forwarder.gated.add(0)
            task = asyncio.ensure_future(WRITES[write](client))
            await _loop_turns()
            task.cancel()
            await _loop_turns()
            assert not task.done()  # its request unanswered: the call goes on
            forwarder.open(0)
            with pytest.raises(asyncio.CancelledError):
                await task
            found = await client.get_many([b"w", b"n"])
            if write == "delete":
                assert b"w" not in found
            elif write == "incr":
                assert found[b"n"].value == b"6"
            else:
                assert found[b"w"].value == b"A"
            assert await client.set(b"w", b"B")
            assert (await client.get(b"w")) == Item(b"w", b"B", 0, None)
        finally:
            await client.aclose()
            forwarder.close()

    run(scenario())


def test_a_cancelled_read_ends_its_call_at_once(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer
) -> None:
    """A read changes nothing: its caller stops waiting at once, its reply is dropped."""

    async def scenario() -> None:
        forwarder = await GatedForwarder(server).start()
        client = Client([forwarder.location], timeout=5.0)
        try:
            assert await client.set(b"r", b"value")
            forwarder.gated.add(0)
            task = asyncio.ensure_future(client.get(b"r"))
            await _loop_turns()
            task.cancel()
            await _loop_turns()
            assert task.cancelled()
            forwarder.open(0)
            assert await client.get(b"r") == Item(b"r", b"value", 0, None)
        finally:
            await client.aclose()
            forwarder.close()

    run(scenario())


def test_a_cancelled_write_never_lands_after_a_later_acknowledged_one(
    run: Callable[[Coroutine[Any, Any, Any]], Any], server: MemcachedServer, disk_directory: str
) -> None:
    """The way it was found, through the backend with the disk tier on: an aset cancelled on
    a busy connection, then, once that call ended, an aset of the same key, which goes out
    on another connection. Before the fix the cancelled call ended at once, the later write
    was acknowledged first, and memcached kept the cancelled value for good."""
    from django_fastcache.client.pipelining import PIPELINE_DEPTH

    async def scenario() -> None:
        forwarder = await GatedForwarder(server).start()
        cache = FastCache(
            [forwarder.location],
            {"OPTIONS": {"disk_directory": disk_directory, "operation_timeout": 5.0}},
        )

        async def writer(cancelled: asyncio.Future[None]) -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await cancelled
            await cache.aset("k", "B")

        try:
            await cache.aset("k", "B0")
            forwarder.gated.add(0)  # memcached holds back connection 0's requests
            # Connection 0 full of requests, so that the next write takes another.
            fillers = [
                asyncio.ensure_future(cache.aset(f"other{i}", i)) for i in range(PIPELINE_DEPTH - 1)
            ]
            cancelled = asyncio.ensure_future(cache.aset("k", "A"))
            await _loop_turns()
            cancelled.cancel()
            after = asyncio.ensure_future(writer(cancelled))
            await _loop_turns()
            if cancelled.done():  # (before the fix) ended with its write unanswered
                await after
            forwarder.open(0)
            await asyncio.gather(*fillers)
            await after
            assert await cache.aget("k") == "B"
        finally:
            await cache.client.aclose()
            forwarder.close()

    run(scenario())
