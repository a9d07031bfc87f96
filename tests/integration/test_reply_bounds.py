"""Replies are checked against the request, and every call is bounded in time and memory.

Servers that a real memcached never is: one answering a get with another key's value, one
streaming a value forever, one that stops reading requests. Each call must come back within
about its timeout with a typed error, holding no more than the value limit, and the
connection it used is never reused.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import CommandSet
from django_fastcache.errors import OperationTimeoutError, ProtocolError
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.loopback import LoopbackServer, ThreadPerConnectionServer
from tests.integration.client_runner import Runner, runner_fixture

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: The client's timeout where the timeout is the subject: the servers never finish.
TIMEOUT = 0.3
#: The client's timeout where calls must succeed or fail by the reply's content (at 0.3 s
#: a call delayed by load timed out instead).
PATIENT = 5.0
#: How far past its timeout a failing call may come back, at most: loose, it tells a call
#: that hangs (or waits without bound) from one a loaded machine delayed (by seconds).
SLACK = 5.0
VALUES = {b"asked": b"mine", b"victim": b"secret"}

run = runner_fixture(timeout=PATIENT)


@pytest.fixture
def forging() -> Iterator[FakeMemcached]:
    """Answers the first request with the victim's item instead of the one asked for."""
    with FakeMemcached(values=VALUES, garbage=b"VALUE victim 0 6\r\nsecret\r\nEND\r\n") as fake:
        fake.script(Action.GARBAGE)
        yield fake


def blocking_client(location: str, **settings: float) -> BlockingClient:
    return BlockingClient(Cluster([location], ClientSettings(**{"timeout": PATIENT, **settings})))


# -- replies checked against the request -----------------------------------------------------
def test_a_get_answered_with_another_keys_item_fails_and_drops_the_connection(
    run: Runner, forging: FakeMemcached
) -> None:
    async def scenario(client: CommandSet) -> None:
        with pytest.raises(ProtocolError, match="not asked for"):
            await client.get(b"asked")
        # The next call has a connection of its own, in step, and gets its own item.
        item = await client.get(b"asked")
        assert item is not None
        assert item.value == b"mine"

    run([forging.location], scenario)
    assert forging.wait_for(lambda: 1 in forging.closed_by_client)
    assert forging.accepted == 2


def test_the_flat_get_checks_the_key_too(forging: FakeMemcached) -> None:
    client = blocking_client(forging.location)
    with pytest.raises(ProtocolError, match="not asked for"):
        client.get_now(b"absent")
    assert client.get_now(b"absent") is None


def test_get_many_refuses_an_item_nobody_asked_for(run: Runner, forging: FakeMemcached) -> None:
    async def scenario(client: CommandSet) -> None:
        with pytest.raises(ProtocolError, match="not asked for"):
            await client.get_many([b"asked", b"other"])

    run([forging.location], scenario)


def test_get_many_refuses_the_same_key_twice(run: Runner) -> None:
    twice = b"VALUE asked 0 4\r\nmine\r\nVALUE asked 0 4\r\nmine\r\nEND\r\n"
    with FakeMemcached(values=VALUES, garbage=twice) as fake:
        fake.script(Action.GARBAGE)

        async def scenario(client: CommandSet) -> None:
            with pytest.raises(ProtocolError, match="already answered"):
                await client.get_many([b"asked", b"victim"])

        run([fake.location], scenario)


# -- servers that never finish ---------------------------------------------------------------
class _Streaming(ThreadPerConnectionServer):
    """Reads one request, then writes ``first`` (its ``%s`` replaced by the first key asked
    for) and ``chunk`` after it forever (every ``interval`` seconds), until the client goes
    away."""

    thread_name = "streaming-server"

    def __init__(self, first: bytes, chunk: bytes, interval: float) -> None:
        super().__init__()
        self.first, self.chunk, self.interval = first, chunk, interval
        self.sent = 0

    def _serve(self, sock: socket.socket) -> None:
        try:
            request = sock.recv(65536)
            first = self.first
            if b"%s" in first:
                first = first % request.split()[1]
            sock.sendall(first)
            while not self.stopping.wait(self.interval):
                sock.sendall(self.chunk)
                self.sent += len(self.chunk)
        except OSError:
            return


class _Deaf(LoopbackServer):
    """Accepts connections and never reads from them."""

    thread_name = "deaf-server"

    def __init__(self) -> None:
        super().__init__()
        self._socks: list[socket.socket] = []

    def _connected(self, sock: socket.socket) -> None:
        self._socks.append(sock)

    def _close_connections(self) -> None:
        for sock in self._socks:
            sock.close()


def test_a_value_that_trickles_forever_is_bounded_by_the_timeout(run: Runner) -> None:
    # A declared length within the limit, whose bytes come a few at a time, forever.
    with _Streaming(b"VALUE asked 0 1000000\r\n", b"x" * 64, 0.002) as server:

        async def scenario(client: CommandSet) -> float:
            start = time.monotonic()
            with pytest.raises(OperationTimeoutError):
                await client.get(b"asked")
            return time.monotonic() - start

        assert run([server.location], scenario, timeout=TIMEOUT) < TIMEOUT + SLACK


def test_an_endless_stream_of_items_stops_at_the_first_one_not_asked_for() -> None:
    item = b"VALUE asked 0 4\r\nmine\r\n"
    with _Streaming(item, item * 256, 0.0005) as server:
        client = blocking_client(server.location)
        with pytest.raises(ProtocolError):
            client.get_now(b"asked")
        # What the client held never grew past the one item it took in before failing.
        assert server.sent < 64 * 1024 * 1024


def test_a_fast_endless_stream_is_bounded_by_the_timeout(run: Runner) -> None:
    """An item (within the limit) arriving as fast as the server can write it: still
    bounded by the timeout, and the buffer never holds more than the declared value."""
    with _Streaming(b"VALUE asked 0 900000\r\n", b"y" * 1024, 0.0) as server:

        async def scenario(client: CommandSet) -> float:
            start = time.monotonic()
            with pytest.raises((OperationTimeoutError, ProtocolError)):
                await client.get(b"asked")
            return time.monotonic() - start

        assert run([server.location], scenario, timeout=TIMEOUT) < TIMEOUT + SLACK


def test_a_server_that_stops_reading_bounds_a_large_set_by_the_timeout(run: Runner) -> None:
    value = b"v" * (32 * 1024 * 1024)  # more than the socket buffers on both sides hold
    with _Deaf() as server:

        async def scenario(client: CommandSet) -> float:
            start = time.monotonic()
            with pytest.raises(OperationTimeoutError):
                await client.set(b"big", value)
            return time.monotonic() - start

        assert run([server.location], scenario, timeout=TIMEOUT) < TIMEOUT + SLACK


def test_a_deadline_shared_by_nodes_still_bounds_a_trickling_node() -> None:
    """get_many over two nodes: one answers at once, the other trickles forever."""
    with (
        _Streaming(b"VALUE %s 0 1000000\r\n", b"x" * 64, 0.002) as slow,
        FakeMemcached(values={b"b": b"bee"}) as fast,
    ):
        client = BlockingClient(
            Cluster([slow.location, fast.location], ClientSettings(timeout=TIMEOUT))
        )
        keys = [b"a", b"b", *[b"k%d" % i for i in range(20)]]
        start = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            run_blocking(client.get_many(keys))
        assert time.monotonic() - start < TIMEOUT + SLACK


def test_a_wait_shortened_for_a_shared_deadline_is_not_kept_for_the_next_call() -> None:
    """Reading the second node of a get_many waits only for what is left of the shared
    deadline; the next call on that connection may wait its whole timeout again. The
    answers come well within the timeout (1.8 s to spare for a loaded machine), and the
    later one always leaves less of it than a node's delay."""
    timeout = 4.0
    with (
        FakeMemcached(values=VALUES, slow_delay=2.0) as first,
        FakeMemcached(values=VALUES, slow_delay=2.2) as second,
    ):
        client = BlockingClient(
            Cluster([first.location, second.location], ClientSettings(timeout=timeout))
        )
        keys = [b"asked", b"victim", *[b"k%d" % i for i in range(20)]]
        assert {client.cluster.node_index(key) for key in keys} == {0, 1}
        for fake in (first, second):
            fake.script(Action.SLOW, Action.SLOW)
        # Both nodes answer within the timeout, the later one with less than 2.0 s left.
        assert set(run_blocking(client.get_many(keys))) == set(VALUES)
        # Each node now answers a one-key get after 2.0-2.2 s: within the timeout.
        for key in keys:
            client.get_now(key)
        assert first.accepted == second.accepted == 1  # the same connections, kept
