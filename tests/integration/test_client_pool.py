"""The asyncio client's connection pools against a real memcached.

The tests share a memcached of their own, so the server's connection counters (``stats``
``curr_connections`` and ``total_connections``) show exactly what the client under test did.
They are read through a separate, already-open probe connection, so reading them changes
neither, and each test starts once the server has seen the earlier tests' connections close.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client as _Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.errors import ClientClosedError
from django_fastcache.protocol import Item
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.servers import MemcachedServer


def Client(*args: Any, **options: Any) -> _Client:
    """A client whose every call takes a connection of its own (no pipelining, no
    autobatching): how the pool lends, waits and opens is what these tests watch."""
    options.setdefault("pipelining", False)
    options.setdefault("autobatching", False)
    return _Client(*args, **options)


pytestmark = pytest.mark.integration


class Probe:
    """Reads one server's connection counters over a connection of its own."""

    def __init__(self, server: MemcachedServer) -> None:
        self.location = server.location
        self._client = BlockingClient(Cluster([server.location], ClientSettings(timeout=5.0)))
        self.stats()  # open the probe's connection before anyone counts

    def stats(self) -> dict[str, str]:
        return run_blocking(self._client.stats())[self.location]

    def current(self) -> int:
        return int(self.stats()["curr_connections"])

    def total(self) -> int:
        return int(self.stats()["total_connections"])

    def close(self) -> None:
        self._client.close_thread_connections()


@pytest.fixture(scope="module")
def _server_and_probe() -> Iterator[tuple[MemcachedServer, Probe, int]]:
    process = MemcachedServer().start()
    reader = Probe(process)
    # Idle: the probe's own connection alone (curr_connections counts client connections).
    # Not read as curr_connections now: the start-up's readiness check may not have been
    # seen closing yet.
    try:
        yield process, reader, 1
    finally:
        reader.close()
        process.kill()


@pytest.fixture
def server(_server_and_probe: tuple[MemcachedServer, Probe, int]) -> MemcachedServer:
    return _server_and_probe[0]


@pytest.fixture
def probe(_server_and_probe: tuple[MemcachedServer, Probe, int]) -> Probe:
    """The probe, once the server has seen every earlier test's connections close."""
    _server, reader, idle_count = _server_and_probe
    deadline = time.monotonic() + 5
    while reader.current() != idle_count:
        assert time.monotonic() < deadline, "an earlier test left connections open"
        time.sleep(0.01)
    return reader


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the event loop run until ``condition`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def metrics(client: Client, server: MemcachedServer) -> dict[str, int]:
    return client.pool_metrics().get(server.location, {})


# -- the connection limit ----------------------------------------------------------------------
def test_fifty_tasks_never_use_more_than_max_connections(
    server: MemcachedServer, probe: Probe
) -> None:
    total_before = probe.total()
    seen_open: list[int] = []

    async def worker(client: Client, n: int) -> None:
        key = b"task:%d" % n
        for round_ in range(5):
            value = b"%d:%d" % (n, round_)
            assert await client.set(key, value) is True
            seen_open.append(metrics(client, server)["open"])
            assert await client.get(key) == Item(key, value, 0, None)
            seen_open.append(metrics(client, server)["open"])

    async def scenario() -> dict[str, int]:
        client = Client([server.location], max_connections=4, timeout=5.0)
        try:
            await asyncio.gather(*[worker(client, n) for n in range(50)])
            return metrics(client, server)
        finally:
            await client.aclose()

    final = asyncio.run(scenario())
    assert len(seen_open) == 50 * 5 * 2
    assert max(seen_open) <= 4
    assert final["opened"] <= 4
    assert final["waits"] > 0  # the limit was reached: tasks did queue for connections
    # The server agrees: this client opened no more connections than it says.
    assert probe.total() - total_before == final["opened"]


def test_waiters_get_connections_first_come_first_served(
    server: MemcachedServer, probe: Probe
) -> None:
    """One connection, held by a request the stopped server does not answer; five callers
    queue behind it in a known order and must be served in that order."""
    finished: list[int] = []

    async def call(client: Client, n: int) -> None:
        assert await client.get(b"fifo") is None
        finished.append(n)

    async def scenario() -> None:
        client = Client([server.location], max_connections=1, timeout=10.0)
        try:
            await client.get(b"warm-up")  # the one connection is open
            server.pause()
            try:
                tasks = [asyncio.create_task(call(client, 0))]
                await asyncio.sleep(0)  # task 0 takes the connection and sends its request
                for n in range(1, 6):
                    tasks.append(asyncio.create_task(call(client, n)))
                    # Task n is queued before task n + 1 is even created.
                    await eventually(lambda n=n: metrics(client, server)["waits"] == n)
            finally:
                server.resume()
            await asyncio.gather(*tasks)
            assert metrics(client, server)["opened"] == 1
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert finished == [0, 1, 2, 3, 4, 5]


# -- idle connections ----------------------------------------------------------------------------
async def _open_four(client: Client) -> None:
    """Four calls at once: each needs a connection of its own."""
    await asyncio.gather(*[client.set(b"idle:%d" % n, b"v") for n in range(4)])


def test_idle_connections_beyond_the_minimum_are_closed(
    server: MemcachedServer, probe: Probe
) -> None:
    """No call is made after the burst: the pool's own timer lets the extra three go."""
    baseline = probe.current()

    async def scenario() -> None:
        client = Client([server.location], min_connections=1, max_connections=4, idle_timeout=0.05)
        try:
            await _open_four(client)
            assert metrics(client, server)["open"] == 4
            assert probe.current() == baseline + 4
            await eventually(lambda: metrics(client, server)["open"] == 1)
            assert metrics(client, server)["closed"] == 3
            assert metrics(client, server)["idle"] == 1
            # The server sees the connections go, and the minimum stays for good.
            await eventually(lambda: probe.current() == baseline + 1)
            await asyncio.sleep(0.1)
            assert metrics(client, server)["open"] == 1
            assert await client.get(b"idle:0") is not None
            assert metrics(client, server)["opened"] == 4
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_busy_pool_keeps_what_it_uses_and_drops_the_rest(
    server: MemcachedServer, probe: Probe
) -> None:
    """One connection stays busy while the other three sit idle: only those three go."""

    async def scenario() -> None:
        client = Client([server.location], min_connections=1, max_connections=4, idle_timeout=0.2)
        try:
            await _open_four(client)
            began = time.monotonic()
            # Sequential calls reuse the most recently used connection and keep it fresh.
            while metrics(client, server)["open"] > 1:
                assert await client.get(b"idle:0") is not None
                await asyncio.sleep(0.01)
                assert time.monotonic() - began < 5, "the idle connections were never closed"
            assert time.monotonic() - began >= 0.2  # none went before idle_timeout
            assert metrics(client, server)["closed"] == 3
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_idle_connections_are_kept_within_the_idle_timeout(
    server: MemcachedServer, probe: Probe
) -> None:
    async def scenario() -> None:
        client = Client([server.location], min_connections=1, max_connections=4)
        try:
            await _open_four(client)
            for _ in range(5):
                assert await client.get(b"idle:0") is not None
            assert metrics(client, server)["open"] == 4
            assert metrics(client, server)["closed"] == 0
        finally:
            await client.aclose()

    asyncio.run(scenario())


# -- one pool per event loop ---------------------------------------------------------------------
def test_each_event_loop_has_its_own_connections(server: MemcachedServer, probe: Probe) -> None:
    client = Client([server.location])
    total_before = probe.total()
    both_connected = threading.Barrier(2, timeout=10)
    both_checked = threading.Barrier(2, timeout=10)
    seen: dict[str, dict[str, int]] = {}
    errors: list[BaseException] = []

    async def in_loop(name: str) -> None:
        key = name.encode()
        assert await client.set(key, key) is True
        both_connected.wait()  # both loops are alive and each has used the client
        seen[name] = metrics(client, server)
        both_checked.wait()
        assert await client.get(key) == Item(key, key, 0, None)
        await client.aclose()

    def thread_main(name: str) -> None:
        try:
            asyncio.run(in_loop(name))
        except BaseException as exc:
            errors.append(exc)
            both_connected.abort()
            both_checked.abort()

    threads = [threading.Thread(target=thread_main, args=(name,)) for name in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    # Two loops, two connections, though each loop alone needed only one.
    assert seen["one"]["open"] == seen["two"]["open"] == 2
    assert seen["one"]["opened"] == 2
    assert probe.total() - total_before == 2


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_closed_loops_connections_are_ended_when_the_next_loop_starts(
    server: MemcachedServer, probe: Probe, pipelining: bool
) -> None:
    # A loop per call, as Django gives an async view under WSGI: each loop's connection
    # is ended once the next loop first uses the client, not left open on memcached until
    # the garbage collector (held off here) gets to it.
    baseline = probe.current()
    total_before = probe.total()
    client = _Client([server.location], pipelining=pipelining, autobatching=pipelining)
    gc.disable()
    try:
        for _ in range(10):
            assert asyncio.run(client.get(b"loop:absent")) is None
        # Nine loops' connections ended; the last loop's is let go by the next loop.
        asyncio.run(eventually(lambda: probe.current() <= baseline + 1))

        async def last() -> None:
            assert await client.get(b"loop:absent") is None
            await client.aclose()

        asyncio.run(last())
        asyncio.run(eventually(lambda: probe.current() == baseline))
    finally:
        gc.enable()
    assert probe.total() - total_before == 11


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_closed_loops_connections_are_closed_without_a_resource_warning(
    server: MemcachedServer, pipelining: bool
) -> None:
    # asyncio's transports of a closed loop cannot close on it: ended by the next loop,
    # their sockets are closed then, not left to the garbage collector, which would warn
    # of each (ResourceWarning: what `python -X dev` and test runners show).
    client = _Client([server.location], pipelining=pipelining, autobatching=pipelining)
    gc.collect()  # earlier tests' garbage warns of its own leaks, not of these
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for _ in range(3):
                loop = asyncio.new_event_loop()  # asyncio's own (uvloop warns at its close)
                try:
                    assert loop.run_until_complete(client.get(b"loop:absent")) is None
                finally:
                    loop.close()
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(client.get(b"loop:absent"))  # ends the three
                loop.run_until_complete(client.aclose())
            finally:
                loop.close()
            gc.collect()
    finally:
        gc.enable()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_a_closed_loops_connections_held_by_cancelled_retrievals_are_ended_too() -> None:
    # A pipelined retrieval cancelled with its reply still due keeps its connection from
    # going back to the pool (the reply would be misread). When its loop closes so (here:
    # the node never answers, and asyncio.run cancels the waiting task), the next loop's
    # first call ends that connection all the same.
    with FakeMemcached(default=Action.IGNORE) as silent:
        client = _Client([silent.location], pipelining=True, autobatching=False, timeout=30)

        async def call_then_leave(sent: int) -> None:
            waiting = asyncio.ensure_future(client.get(b"k"))
            await eventually(lambda: len(silent.requests) == sent)
            assert not waiting.done()

        gc.disable()
        try:
            for sent in range(1, 6):
                asyncio.run(call_then_leave(sent))
            # Four loops' connections ended; the fifth's is let go by the next loop.
            assert silent.wait_for(lambda: silent.closed_by_client == [1, 2, 3, 4])
        finally:
            gc.enable()
        assert silent.accepted == 5


# -- aclose ----------------------------------------------------------------------------------------
def test_aclose_closes_the_loops_connections_and_the_client_stays_usable(
    server: MemcachedServer, probe: Probe
) -> None:
    baseline = probe.current()

    async def scenario() -> None:
        client = Client([server.location], max_connections=4)
        await _open_four(client)
        assert probe.current() == baseline + 4
        await client.aclose()
        assert client.pool_metrics() == {}
        await eventually(lambda: probe.current() == baseline)
        # A later call in the same loop opens a new pool.
        assert await client.get(b"idle:1") == Item(b"idle:1", b"v", 0, None)
        assert metrics(client, server)["opened"] == 1
        await client.aclose()
        await eventually(lambda: probe.current() == baseline)

    asyncio.run(scenario())


def test_aclose_with_calls_in_flight_leaves_no_connection_open(
    server: MemcachedServer, probe: Probe
) -> None:
    """A call in flight when the pool closes finishes; its connection is closed afterwards,
    and a call waiting for a connection is told the client is closed."""
    baseline = probe.current()

    async def scenario() -> None:
        client = Client([server.location], max_connections=1, timeout=10.0)
        await client.set(b"k", b"v")
        server.pause()
        try:
            in_flight = asyncio.create_task(client.get(b"k"))
            await asyncio.sleep(0)
            waiting = asyncio.create_task(client.get(b"k"))
            await eventually(lambda: metrics(client, server)["waits"] == 1)
            await client.aclose()
        finally:
            server.resume()
        assert await in_flight == Item(b"k", b"v", 0, None)
        with pytest.raises(ClientClosedError):
            await waiting
        await eventually(lambda: probe.current() == baseline)

    asyncio.run(scenario())


def test_aclose_in_one_loop_leaves_other_loops_alone(server: MemcachedServer, probe: Probe) -> None:
    client = Client([server.location])
    other_ready = threading.Event()
    closed_here = threading.Event()
    outcome: list[object] = []

    async def other_loop() -> None:
        await client.set(b"other", b"1")
        other_ready.set()
        await eventually(closed_here.is_set, timeout=10)
        outcome.append(await client.get(b"other"))
        outcome.append(metrics(client, server)["opened"])
        await client.aclose()

    thread = threading.Thread(target=asyncio.run, args=(other_loop(),))
    thread.start()
    try:
        assert other_ready.wait(10)

        async def here() -> None:
            await client.set(b"here", b"2")
            await client.aclose()

        asyncio.run(here())
    finally:
        closed_here.set()
        thread.join(10)
    assert not thread.is_alive()
    # The other loop's connection survived: its get needed no new one.
    assert outcome == [Item(b"other", b"1", 0, None), 1]
