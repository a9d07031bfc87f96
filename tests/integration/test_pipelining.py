"""Pipelining: concurrent requests for one node share connections, replies matched in order.

Autobatching is off here, so that every call is a request of its own. Each scenario runs
under an outer bound far above the client's timeout: a caller still waiting then has hung.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from django_fastcache.client import Client
from django_fastcache.errors import (
    ClientError,
    ConnectionLostError,
    InvalidArgumentError,
    OperationTimeoutError,
)
from django_fastcache.protocol import Item
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.servers import MemcachedServer

pytestmark = [pytest.mark.integration]

T = TypeVar("T")
HANG = 10.0
VALUES = {b"k%d" % i: b"value-%d" % i for i in range(64)}


def run(scenario: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(scenario, HANG)

    return asyncio.run(bounded())


@pytest.fixture
def fake() -> Iterator[FakeMemcached]:
    with FakeMemcached(values=VALUES) as server:
        yield server


def client_for(server: Any, **options: Any) -> Client:
    return Client([server.location], autobatching=False, **options)


def test_many_callers_share_one_connection(memcached: MemcachedServer) -> None:
    async def scenario() -> tuple[list[Any], dict[str, int]]:
        client = client_for(memcached, max_connections=1, timeout=2.0)
        try:
            await asyncio.gather(*[client.set(b"p%d" % i, b"v%d" % i) for i in range(40)])
            results = await asyncio.gather(
                *[client.get(b"p%d" % i) for i in range(40)],
                client.incr(b"p-counter"),
                client.delete(b"p0"),
            )
            return results, client.pool_metrics()[memcached.location]
        finally:
            await client.aclose()

    results, metrics = run(scenario())
    assert results[:40] == [Item(b"p%d" % i, b"v%d" % i, 0, None) for i in range(40)]
    assert results[40:] == [None, True]
    # One connection served them all, and nobody queued for it.
    assert (metrics["opened"], metrics["waits"]) == (1, 0)


def test_an_error_reply_stays_with_its_own_request(memcached: MemcachedServer) -> None:
    async def scenario() -> list[Any]:
        client = client_for(memcached, max_connections=1, timeout=2.0)
        try:
            await client.set(b"text", b"not a number")
            await client.set(b"n", b"41")
            return await asyncio.gather(
                client.get(b"text"),
                client.incr(b"text"),  # CLIENT_ERROR: not a number
                client.incr(b"n"),
                return_exceptions=True,
            )
        finally:
            await client.aclose()

    got, failed, counted = run(scenario())
    assert got == Item(b"text", b"not a number", 0, None)
    assert isinstance(failed, ClientError)
    assert counted == 42


def test_a_cancelled_caller_leaves_the_others_their_answers(fake: FakeMemcached) -> None:
    fake.script(Action.SLOW)  # the first request's answer is late: the others queue behind

    async def scenario() -> tuple[list[Any], int]:
        client = client_for(fake, max_connections=1, timeout=5.0)
        try:
            tasks = [asyncio.ensure_future(client.get(b"k%d" % i)) for i in range(5)]
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # all written
            tasks[2].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            return results, (await client.get(b"k9")).value
        finally:
            await client.aclose()

    results, after = run(scenario())
    assert isinstance(results[2], asyncio.CancelledError)
    assert [r.value for i, r in enumerate(results) if i != 2] == [
        b"value-0",
        b"value-1",
        b"value-3",
        b"value-4",
    ]
    assert after == b"value-9"
    assert fake.accepted == 1


@pytest.fixture
def pausable() -> Iterator[MemcachedServer]:
    """A memcached of the test's own, which the test may pause (SIGSTOP)."""
    server = MemcachedServer().start()
    try:
        yield server
    finally:
        if server.running:
            server.resume()
        server.stop()


def test_a_server_that_stops_answering_fails_every_pipelined_request(
    pausable: MemcachedServer,
) -> None:
    async def scenario() -> list[Any]:
        # The set must succeed: 5 s; the short timeout (read per call) is for the paused
        # server's calls.
        client = client_for(pausable, max_connections=1, timeout=5.0)
        try:
            await client.set(b"x", b"y")
            pausable.pause()
            client.timeout = 0.3
            try:
                return await asyncio.gather(
                    client.get(b"x"), client.set(b"x", b"z"), client.delete(b"x"),
                    return_exceptions=True,
                )  # fmt: skip
            finally:
                pausable.resume()
        finally:
            await client.aclose()

    results = run(scenario())
    assert all(isinstance(r, OperationTimeoutError) for r in results), results


def test_a_shorter_timeout_behind_a_longer_one_still_bounds_its_caller(
    pausable: MemcachedServer,
) -> None:
    async def scenario() -> tuple[Any, float]:
        client = client_for(pausable, max_connections=1, timeout=30.0)
        loop = asyncio.get_running_loop()
        try:
            await client.set(b"x", b"y")
            pausable.pause()
            try:
                first = asyncio.ensure_future(client.get(b"x"))  # would wait 30 s
                await asyncio.sleep(0)
                client.timeout = 0.2
                began = loop.time()
                with pytest.raises(OperationTimeoutError):
                    await client.get(b"x")  # pipelined behind it, yet bounded by its 0.2 s
                elapsed = loop.time() - began
                return await asyncio.gather(first, return_exceptions=True), elapsed
            finally:
                pausable.resume()
        finally:
            await client.aclose()

    (first,), elapsed = run(scenario())
    assert isinstance(first, OperationTimeoutError)  # the connection was dropped with it
    assert elapsed < 5.0


def test_a_dropped_connection_fails_every_pipelined_request(fake: FakeMemcached) -> None:
    fake.script(Action.CLOSE)

    async def scenario() -> tuple[list[Any], Any]:
        client = client_for(fake, max_connections=1, timeout=2.0)
        try:
            results = await asyncio.gather(
                *[client.get(b"k%d" % i) for i in range(4)], return_exceptions=True
            )
            return results, await client.get(b"k1")
        finally:
            await client.aclose()

    results, after = run(scenario())
    assert [type(r) for r in results] == [ConnectionLostError] * 4
    assert after == Item(b"k1", b"value-1", 0, None)


def test_without_pipelining_callers_wait_for_a_connection_of_their_own(
    fake: FakeMemcached,
) -> None:
    async def scenario() -> tuple[list[Any], dict[str, int]]:
        client = client_for(fake, max_connections=1, timeout=2.0, pipelining=False)
        try:
            results = await asyncio.gather(*[client.get(b"k%d" % i) for i in range(3)])
            return results, client.pool_metrics()[fake.location]
        finally:
            await client.aclose()

    results, metrics = run(scenario())
    assert [r.value for r in results] == [b"value-0", b"value-1", b"value-2"]
    assert metrics["waits"] == 2


def test_pipelining_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="pipelining"):
        Client(["127.0.0.1:11211"], pipelining=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"pipelining": False, "autobatching": False}, id="one-request-per-call"),
        pytest.param({"autobatching": True}, id="autobatched"),
    ],
)
def test_a_call_after_the_timeout_was_lowered_is_bounded_by_the_new_one(
    pausable: MemcachedServer, options: dict[str, Any]
) -> None:
    # The connection's one timer outlives the set's reply, armed for the set's 30 s: the
    # get made after the timeout was lowered must move it earlier, on every request path.
    async def scenario() -> float:
        client = Client([pausable.location], max_connections=1, timeout=30.0, **options)
        loop = asyncio.get_running_loop()
        try:
            await client.set(b"x", b"y")
            pausable.pause()
            try:
                client.timeout = 0.2
                began = loop.time()
                with pytest.raises(OperationTimeoutError):
                    await client.get(b"x")
                return loop.time() - began
            finally:
                pausable.resume()
        finally:
            await client.aclose()

    assert run(scenario()) < 5.0  # not the set's 30 s (run() gives up after 10)
