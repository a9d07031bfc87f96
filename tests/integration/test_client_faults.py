"""Both clients facing servers that misbehave.

The scripted :class:`FakeMemcached` produces what a real server cannot: garbage, a reply cut
short, a reply that never comes or comes late, bytes nobody asked for. A real memcached is
stopped with SIGSTOP for the "server hangs" case, and a free port with nothing listening
plays a dead node. Time bounds are deliberately loose: a call must come back within about
its timeout, never hang.

Load on the machine only delays, by seconds at worst: a call that must time out faces a
server that never answers (or answers long after); a call that must succeed has ``PATIENT``
seconds, or ``TIMEOUT`` in a scenario that also times calls out, for a server thread
starved of CPU. A bound that tells a bug apart lies between what the code does and what
the bug would take, or is read off the socket, not the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import CommandSet
from django_fastcache.client.connection import Connection
from django_fastcache.errors import (
    ConnectFailedError,
    ConnectionLostError,
    OperationTimeoutError,
    ProtocolError,
)
from django_fastcache.protocol import Item, ReplyKind
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.servers import MemcachedServer, free_port
from tests.integration.client_runner import Runner, runner_fixture

pytestmark = [pytest.mark.integration, pytest.mark.faults]


#: The client's timeout in scenarios where calls time out.
TIMEOUT = 1.0
#: For a scenario in which every call times out (nothing needs time to succeed).
SHORT_TIMEOUT = 0.3
#: The client's timeout where no call should time out.
PATIENT = 5.0
#: How far past its timeout a failing call may come back, at most: loose, it tells a call
#: that hangs (or starts its timeout again) from one a loaded machine delayed.
SLACK = 5.0

VALUES = {b"a": b"alpha", b"b": b"beta", b"c": b"gamma"}


def item(key: bytes) -> Item:
    return Item(key, VALUES[key], 0, None)


run = runner_fixture(timeout=PATIENT)


@pytest.fixture
def fake() -> Iterator[FakeMemcached]:
    with FakeMemcached(values=VALUES) as server:
        yield server


@pytest.fixture(scope="module")
def stoppable_memcached() -> Iterator[MemcachedServer]:
    """A memcached of this module's own, for tests that stop it with SIGSTOP (and resume it)."""
    server = MemcachedServer().start()
    try:
        yield server
    finally:
        server.kill()


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the event loop run until ``condition`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def connections_of_requests(fake: FakeMemcached) -> list[int]:
    return [request.connection for request in fake.requests]


def poll_after_idle(c: CommandSet, seconds: float) -> None:
    """Set how long the blocking client's connection (to the only node) may sit idle and
    still carry a request without a poll first: 0 polls before every request, ``math.inf``
    never does. Nothing to set on the asyncio client, which sees bytes as they come."""
    if isinstance(c, BlockingClient):
        c._local.by_node[0].poll_after_idle = seconds


# -- bad replies -----------------------------------------------------------------------------
def test_garbage_fails_the_call_and_discards_the_connection(
    run: Runner, fake: FakeMemcached
) -> None:
    fake.script(Action.GARBAGE)

    async def scenario(c: CommandSet) -> None:
        with pytest.raises(ProtocolError):
            await c.get(b"a")
        assert await c.get(b"b") == item(b"b")
        assert await c.get(b"a") == item(b"a")

    run([fake.location], scenario)
    # The garbled connection was dropped; the next calls came on a new one.
    assert connections_of_requests(fake) == [1, 2, 2]
    assert fake.wait_for(lambda: 1 in fake.closed_by_client)


def test_truncated_reply_then_close(run: Runner, fake: FakeMemcached) -> None:
    fake.script(Action.TRUNCATE)

    async def scenario(c: CommandSet) -> None:
        with pytest.raises(ConnectionLostError):
            await c.get(b"a")
        assert await c.get(b"b") == item(b"b")

    run([fake.location], scenario)
    assert connections_of_requests(fake) == [1, 2]


def test_server_closing_at_once_fails_with_connection_lost(run: Runner) -> None:
    with FakeMemcached(values=VALUES, close_on_connect=True) as closing:

        async def scenario(c: CommandSet) -> None:
            for _ in range(3):
                with pytest.raises(ConnectionLostError):
                    await c.get(b"a")

        run([closing.location], scenario)
        assert closing.accepted == 3


def test_close_instead_of_a_reply(run: Runner, fake: FakeMemcached) -> None:
    fake.script(Action.REPLY, Action.CLOSE)

    async def scenario(c: CommandSet) -> None:
        assert await c.set(b"x", b"1") is True
        poll_after_idle(c, 0.0)  # a polled connection: the close fails the call
        with pytest.raises(ConnectionLostError):
            await c.get(b"x")
        assert await c.get(b"x") == Item(b"x", b"1", 0, None)

    run([fake.location], scenario)
    assert connections_of_requests(fake) == [1, 1, 2]


@pytest.mark.parametrize("request_kind", ["get", "get_now", "value_now"])
def test_close_instead_of_a_reply_sends_an_unpolled_get_again(
    fake: FakeMemcached, request_kind: str
) -> None:
    """A connection used a moment ago goes out without a poll: an end of stream before the
    reply is what the poll would have seen, and a retrieval goes once more, on a new
    connection, neither counted as failed nor marking the node unhealthy."""
    fake.script(Action.REPLY, Action.CLOSE)
    client = BlockingClient(Cluster([fake.location], ClientSettings(timeout=PATIENT)))
    try:
        assert run_blocking(client.set(b"x", b"1")) is True
        poll_after_idle(client, math.inf)
        if request_kind == "get":
            assert run_blocking(client.get(b"x")) == Item(b"x", b"1", 0, None)
        elif request_kind == "get_now":
            assert client.get_now(b"x") == Item(b"x", b"1", 0, None)
        else:
            assert client.value_now(b"x") == (b"1", 0)
        node = client.metrics().nodes[fake.location]
        assert client.health.unhealthy == set()
    finally:
        client.close_thread_connections()
    assert connections_of_requests(fake) == [1, 1, 2]
    assert node.healthy
    assert node.errors == 0
    assert node.operations["get"].calls == 1


def test_a_get_sent_again_is_still_bounded_by_its_timeout(fake: FakeMemcached) -> None:
    """The connection is closed under the get, and the new connection's server never
    answers: the call times out within its one timeout, the retry included."""
    fake.script(Action.REPLY, Action.CLOSE, Action.IGNORE)
    client = BlockingClient(Cluster([fake.location], ClientSettings(timeout=TIMEOUT)))
    try:
        assert run_blocking(client.set(b"x", b"1")) is True
        poll_after_idle(client, math.inf)
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            client.value_now(b"x")
        assert time.monotonic() - started < TIMEOUT + SLACK
    finally:
        client.close_thread_connections()
    assert connections_of_requests(fake) == [1, 1, 2]


@pytest.mark.parametrize("fails", [Action.CLOSE, Action.TRUNCATE])
def test_close_before_an_unpolled_write_or_after_part_of_a_reply_fails_the_call(
    fake: FakeMemcached, fails: Action
) -> None:
    """Only a retrieval whose reply has not begun is sent again: a write may have been done
    (and a repeated add or incr is not the same call), a reply cut short is a failure."""
    fake.script(Action.REPLY, fails, Action.REPLY)
    client = BlockingClient(Cluster([fake.location], ClientSettings(timeout=PATIENT)))
    try:
        assert run_blocking(client.set(b"x", b"1")) is True
        poll_after_idle(client, math.inf)
        call: Callable[[], object] = (
            (lambda: client.store_now(b"add", b"y", b"2", 0, 0))
            if fails is Action.CLOSE
            else (lambda: client.value_now(b"x"))
        )
        with pytest.raises(ConnectionLostError):
            call()
        assert client.value_now(b"x") == (b"1", 0)
    finally:
        client.close_thread_connections()
    assert connections_of_requests(fake) == [1, 1, 2]


# -- late and missing replies ----------------------------------------------------------------
def test_hung_server_times_out_and_its_late_reply_is_never_delivered(
    run: Runner, fake: FakeMemcached
) -> None:
    """The held reply to "a" is sent the moment the request for "b" reaches the server."""
    fake.script(Action.HOLD)

    async def scenario(c: CommandSet) -> float:
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            await c.get(b"a")
        elapsed = time.monotonic() - started
        # A scripted action goes to the request a server thread reads first: "b", on a
        # new connection, must not take HOLD if the first connection's thread ran late.
        assert fake.wait_for(lambda: fake.scripted == 0)
        assert await c.get(b"b") == item(b"b")
        assert await c.get(b"c") == item(b"c")
        return elapsed

    elapsed = run([fake.location], scenario, timeout=TIMEOUT)
    assert elapsed < TIMEOUT + SLACK
    assert connections_of_requests(fake) == [1, 2, 2]


def test_never_answering_server_times_out_every_call(run: Runner) -> None:
    with FakeMemcached(values=VALUES, default=Action.IGNORE) as silent:

        async def scenario(c: CommandSet) -> None:
            for call in (c.get(b"a"), c.set(b"k", b"v"), c.get_many([b"a", b"b"]), c.version()):
                started = time.monotonic()
                with pytest.raises(OperationTimeoutError):
                    await call
                assert time.monotonic() - started < SHORT_TIMEOUT + SLACK

        run([silent.location], scenario, timeout=SHORT_TIMEOUT)
        # Every timed-out connection was dropped, never reused: four calls, four
        # connections, each closed by the client. (Not counted by request: a reset may
        # throw away a request the server's thread, starved, had not read yet.)
        assert silent.wait_for(lambda: silent.closed_by_client == [1, 2, 3, 4])
        assert silent.accepted == 4


def test_slow_reply_within_the_timeout_is_read(run: Runner) -> None:
    with FakeMemcached(values=VALUES, default=Action.SLOW, slow_delay=0.2) as slow:

        async def scenario(c: CommandSet) -> None:
            assert await c.get(b"a") == item(b"a")
            assert await c.get_many([b"b", b"c"]) == {b"b": item(b"b"), b"c": item(b"c")}

        run([slow.location], scenario, timeout=5.0)
        assert connections_of_requests(slow) == [1, 1]


def test_slow_reply_past_the_timeout_is_dropped(run: Runner) -> None:
    # Long past the timeout (the fake stops waiting when it is stopped): however late the
    # client gets to its read, the reply has not come.
    with FakeMemcached(values=VALUES, slow_delay=30.0) as slow:
        slow.script(Action.SLOW)

        async def scenario(c: CommandSet) -> None:
            with pytest.raises(OperationTimeoutError):
                await c.get(b"a")
            # "b" goes on a new connection: only once "a" has taken SLOW may it be sent.
            assert slow.wait_for(lambda: slow.scripted == 0)
            assert await c.get(b"b") == item(b"b")

        run([slow.location], scenario, timeout=TIMEOUT)
        assert connections_of_requests(slow) == [1, 2]


# -- bytes nobody asked for ----------------------------------------------------------------------
def test_extra_bytes_after_a_reply_are_not_read_as_the_next_reply(
    run: Runner, fake: FakeMemcached
) -> None:
    """The server answers "a" and, in the same write, sends an END that answers nothing."""
    fake.script(Action.EXTRA)

    async def scenario(c: CommandSet) -> None:
        assert await c.get(b"a") == item(b"a")
        assert await c.get(b"b") == item(b"b")
        assert await c.get(b"c") == item(b"c")

    run([fake.location], scenario)


def test_unsolicited_bytes_on_an_idle_connection_are_not_read_as_a_reply(
    run: Runner, fake: FakeMemcached
) -> None:
    async def scenario(c: CommandSet) -> None:
        assert await c.get(b"a") == item(b"a")
        # The connection now sits idle (polled before its next request, however soon that
        # comes); a forged reply arrives on it.
        poll_after_idle(c, 0.0)
        assert fake.send_unsolicited(b"VALUE b 0 6\r\nforged\r\nEND\r\n") == 1
        if isinstance(c, Client):
            # The asyncio connection sees the bytes as they come: let it.
            await eventually(lambda: fake.closed_by_client == [1])
        assert await c.get(b"b") == item(b"b")
        assert await c.get(b"c") == item(b"c")

    run([fake.location], scenario)
    assert connections_of_requests(fake) == [1, 2, 2]


# -- dropped connections -------------------------------------------------------------------------
def test_drop_fails_every_pipelined_request_at_once(fake: FakeMemcached) -> None:
    async def scenario() -> list[BaseException | Any]:
        loop = asyncio.get_running_loop()
        _transport, connection = await loop.create_connection(
            lambda: Connection(loop, 1024 * 1024), fake.host, fake.port
        )
        fake.script(Action.REPLY, Action.CLOSE)
        futures = connection.request_many(
            b"get a\r\nget b\r\nget c\r\nget a\r\n",
            [ReplyKind.RETRIEVAL] * 4,
            loop.time() + PATIENT,
        )
        outcomes = await asyncio.wait_for(
            asyncio.gather(*futures, return_exceptions=True), PATIENT + SLACK
        )
        assert connection.closed
        assert connection.in_flight == 0
        return outcomes

    first, *rest = asyncio.run(scenario())
    assert first == [item(b"a")]
    assert all(isinstance(outcome, ConnectionLostError) for outcome in rest), rest
    assert len({id(outcome) for outcome in rest}) == 1  # failed together, by one error


def test_drop_during_a_pipelined_get_many(run: Runner) -> None:
    """Over 100 keys go out as several pipelined get lines; the server drops after one."""
    values = {b"key:%03d" % i: b"value %d" % i for i in range(250)}
    with FakeMemcached(values=values) as server:
        server.script(Action.REPLY, Action.CLOSE)

        async def scenario(c: CommandSet) -> None:
            # ConnectionLostError, not OperationTimeoutError: failed when the drop was seen.
            with pytest.raises(ConnectionLostError):
                await c.get_many(list(values))
            found = await c.get_many(list(values))
            assert {k: i.value for k, i in found.items()} == values

        run([server.location], scenario)
        # The server dropped the first connection before reading its third get line.
        assert connections_of_requests(server) == [1, 1, 2, 2, 2]


def test_drop_during_set_many_reports_the_nodes_keys_as_failed(
    run: Runner, fake: FakeMemcached
) -> None:
    keys = [b"s%d" % i for i in range(5)]
    fake.script(Action.REPLY, Action.CLOSE)

    async def scenario(c: CommandSet) -> list[bytes]:
        return await c.set_many([(k, b"v", 0) for k in keys])

    failed = run([fake.location], scenario)
    # The first was stored before the drop; the node failed, so all may be reported.
    assert set(keys[1:]) <= set(failed) <= set(keys)


# -- cancellation (asyncio only) -----------------------------------------------------------------
def test_a_cancelled_request_leaves_its_connection_in_step(fake: FakeMemcached) -> None:
    # Requests are pipelined: a cancelled one stays in the connection's queue, and its late
    # reply is read (and dropped) in its turn, never taken for the next caller's answer.
    fake.script(Action.HOLD)

    async def scenario() -> None:
        client = Client([fake.location], timeout=5.0, autobatching=False)
        try:
            task = asyncio.create_task(client.get(b"a"))
            await eventually(lambda: len(fake.requests) == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The held reply to "a" goes out when "b" arrives, ahead of b's own.
            assert await client.get(b"b") == item(b"b")
            metrics = client.pool_metrics()[fake.location]
            assert (metrics["open"], metrics["idle"], metrics["closed"]) == (1, 1, 0)
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert connections_of_requests(fake) == [1, 1]


def test_cancelled_pipeline_discards_its_connection(fake: FakeMemcached) -> None:
    fake.script(Action.HOLD)

    async def scenario() -> None:
        client = Client([fake.location], timeout=5.0)
        try:
            task = asyncio.create_task(client.get_many([b"a", b"b"]))
            # Taken, not only read: the next request, on a new connection, must not get HOLD.
            await eventually(lambda: len(fake.requests) == 1 and fake.scripted == 0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client.pool_metrics()[fake.location]["closed"] == 1
            assert await client.get_many([b"c"]) == {b"c": item(b"c")}
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert connections_of_requests(fake) == [1, 2]


# -- dead and stopped nodes ----------------------------------------------------------------------
def test_dead_node_fails_fast_and_keeps_failing_fast(run: Runner) -> None:
    location = f"127.0.0.1:{free_port()}"

    timeout = 5.0

    async def scenario(c: CommandSet) -> None:
        # More attempts than the pool has connections: no slot may leak on failure.
        for _ in range(6):
            started = time.monotonic()
            with pytest.raises(ConnectFailedError):
                await c.get(b"a")
            assert time.monotonic() - started < timeout / 2  # refused, not timed out
        if isinstance(c, Client):
            metrics = c.pool_metrics()[location]
            assert (metrics["open"], metrics["connect_failures"]) == (0, 6)

    run([location], scenario, timeout=timeout, connect_timeout=timeout, max_connections=2)


def test_dead_node_among_live_ones(run: Runner, fake: FakeMemcached) -> None:
    dead = f"127.0.0.1:{free_port()}"
    locations = [fake.location, dead]
    routing = Cluster(locations, ClientSettings())
    keys = [b"k%d" % i for i in range(20)]
    on_dead = {k for k in keys if routing.node_index(k) == 1}
    assert on_dead
    assert on_dead != set(keys)

    async def scenario(c: CommandSet) -> None:
        assert set(await c.set_many([(k, b"v", 0) for k in keys])) == on_dead
        with pytest.raises(ConnectFailedError):
            await c.get_many(keys)
        live_key = next(k for k in keys if k not in on_dead)
        assert await c.get(live_key) == Item(live_key, b"v", 0, None)

    run(locations, scenario, connect_timeout=5.0)


def test_stopped_memcached_times_out_then_recovers(
    run: Runner, stoppable_memcached: MemcachedServer
) -> None:
    server = stoppable_memcached

    async def scenario(c: CommandSet) -> None:
        assert await c.set(b"k", b"v") is True  # the connection is open before the stop
        server.pause()
        try:
            for call in (c.get(b"k"), c.get_many([b"k"]), c.set(b"k", b"w")):
                started = time.monotonic()
                with pytest.raises(OperationTimeoutError):
                    await call
                assert time.monotonic() - started < TIMEOUT + SLACK
        finally:
            server.resume()
        found = await c.get(b"k")
        assert found is not None
        assert found.value in (b"v", b"w")  # the timed-out set may have landed after all

    run([server.location], scenario, timeout=TIMEOUT)


def test_stopped_node_in_a_cluster(
    run: Runner, memcached: MemcachedServer, stoppable_memcached: MemcachedServer
) -> None:
    stopped = stoppable_memcached
    locations = [memcached.location, stopped.location]
    routing = Cluster(locations, ClientSettings())
    keys = [b"n%d" % i for i in range(20)]
    on_stopped = {k for k in keys if routing.node_index(k) == 1}
    assert on_stopped
    assert on_stopped != set(keys)

    async def scenario(c: CommandSet) -> None:
        assert await c.set_many([(k, b"v", 0) for k in keys]) == []
        stopped.pause()
        try:
            started = time.monotonic()
            failed = await c.set_many([(k, b"w", 0) for k in keys])
            assert time.monotonic() - started < TIMEOUT + SLACK
            assert set(failed) == on_stopped
            with pytest.raises(OperationTimeoutError):
                await c.get_many(keys)
        finally:
            stopped.resume()
        found = await c.get_many(keys)
        assert {k for k, i in found.items() if i.value == b"w"} >= set(keys) - on_stopped

    run(locations, scenario, timeout=TIMEOUT)


def test_blocking_client_replaces_a_connection_the_server_closed(
    stoppable_memcached: MemcachedServer,
) -> None:
    """memcached restarts between two calls: the idle connection's end of stream is noticed
    before the next request is written on it, so that request goes out on a new connection."""
    server = stoppable_memcached
    client = BlockingClient(Cluster([server.location], ClientSettings(timeout=2.0)))
    try:
        assert run_blocking(client.set(b"k", b"v")) is True
        server.kill()
        server.restart()  # same port, empty
        assert run_blocking(client.get(b"k")) is None
        assert run_blocking(client.set(b"k", b"again")) is True
        assert run_blocking(client.get(b"k")) == Item(b"k", b"again", 0, None)
    finally:
        client.close_thread_connections()


# -- the timeout bounds the whole call -----------------------------------------------------------
def test_waiting_for_a_connection_counts_against_the_timeout() -> None:
    """With one connection per node, a second call waits for the first; both share one budget.

    The first call times out after ``timeout``; the second, queued behind it, must not start a
    fresh ``timeout`` once it finally gets a connection: it ends at its own deadline, about
    as long after the first's end as it started after the first's start, not a whole
    ``timeout`` later. (Both deadlines are timers of one event loop: a loaded machine
    delays both alike.)
    """
    timeout = 3.0
    with FakeMemcached(values=VALUES, default=Action.IGNORE) as silent:

        async def timed(client: Client, key: bytes) -> tuple[float, float]:
            started = time.monotonic()
            with pytest.raises(OperationTimeoutError):
                await client.get(key)
            return started, time.monotonic()

        async def scenario() -> list[tuple[float, float]]:
            # Neither pipelined onto the first call's connection nor batched with it.
            client = Client(
                [silent.location],
                timeout=timeout,
                max_connections=1,
                pipelining=False,
                autobatching=False,
            )
            try:
                first = asyncio.create_task(timed(client, b"a"))
                # The first call holds the only connection (sent, unanswered): the second
                # waits for it.
                await eventually(lambda: _in_use(client, silent.location) == 1)
                second = asyncio.create_task(timed(client, b"b"))
                return [await first, await second]
            finally:
                await client.aclose()

        (first_start, first_end), (second_start, second_end) = asyncio.run(scenario())
    assert first_end - first_start < timeout + SLACK
    lead = second_start - first_start
    assert lead < timeout / 2, f"the second call started {lead:.2f}s after the first"
    assert second_end - first_end < lead + timeout / 2


def _in_use(client: Client, location: str) -> int:
    metrics = client.pool_metrics().get(location)  # none before the loop's first call
    return 0 if metrics is None else metrics["open"] - metrics["idle"]


#: A slow connect's share of the blocking client's timeout (1 s) in the tests below.
SLOW_CONNECT = 0.5


@pytest.fixture
def slow_connects(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every connect takes ``SLOW_CONNECT`` seconds more; returns, as they are set, the
    receive timeouts (``SO_RCVTIMEO``, what a read then waits at most) given to the kernel.
    Checked on the socket, not by the clock: load on the machine cannot change them."""
    connect, setsockopt = socket.socket.connect, socket.socket.setsockopt
    receive_timeouts: list[float] = []

    def slow(sock: socket.socket, address: Any) -> None:
        connect(sock, address)
        time.sleep(SLOW_CONNECT)  # the connect is slow, its time part of the call's

    def recording(sock: socket.socket, level: int, option: int, value: Any) -> None:
        if (level, option) == (socket.SOL_SOCKET, socket.SO_RCVTIMEO):
            seconds, microseconds = struct.unpack("@ll", value)
            receive_timeouts.append(seconds + microseconds / 1e6)
        setsockopt(sock, level, option, value)

    monkeypatch.setattr(socket.socket, "connect", slow)
    monkeypatch.setattr(socket.socket, "setsockopt", recording)
    return receive_timeouts


@pytest.mark.parametrize("call", ["value_now", "store_now", "get_many"])
def test_a_slow_connect_counts_against_the_timeout(call: str, slow_connects: list[float]) -> None:
    """The blocking client's call opens its connection, slowly, to a server that never
    answers: the read waits only for what the connect left of the call's timeout (given
    the whole timeout, the call would end ``SLOW_CONNECT`` past its deadline)."""
    timeout = 1.0
    with FakeMemcached(values=VALUES, default=Action.IGNORE) as silent:
        settings = ClientSettings(timeout=timeout, connect_timeout=timeout)
        client = BlockingClient(Cluster([silent.location], settings))
        calls: dict[str, Callable[[], object]] = {
            "value_now": lambda: client.value_now(b"a"),
            "store_now": lambda: client.store_now(b"set", b"a", b"1", 0, 0),
            "get_many": lambda: run_blocking(client.get_many([b"a", b"b"])),
        }
        try:
            with pytest.raises(OperationTimeoutError):
                calls[call]()
        finally:
            client.close_thread_connections()
        assert silent.wait_for(lambda: len(silent.requests) == 1)  # sent, never answered
    # The connection's own timeout, set as it was opened; then at most what was left.
    assert slow_connects[0] == pytest.approx(timeout, abs=1e-3)
    assert slow_connects[-1] <= timeout - SLOW_CONNECT


def test_a_noreply_set_on_a_new_connection_leaves_the_next_call_its_whole_timeout(
    fake: FakeMemcached, slow_connects: list[float]
) -> None:
    """A noreply request has no reply to restore the timeout its slow connect shortened:
    the connection's next read must not inherit what was left of that call's."""
    timeout = 1.0
    settings = ClientSettings(timeout=timeout, connect_timeout=timeout)
    client = BlockingClient(Cluster([fake.location], settings))
    try:
        run_blocking(client.set(b"x", b"1", noreply=True))
        assert slow_connects[-1] == pytest.approx(timeout, abs=1e-3)
        assert client.value_now(b"x") == (b"1", 0)  # the same connection, in step
    finally:
        client.close_thread_connections()
    assert connections_of_requests(fake) == [1, 1]


def test_several_stopped_nodes_share_one_timeout(run: Runner) -> None:
    """A blocking multi-node call reads the nodes one after another; the budget is shared.

    Six nodes: a timeout per node, one after another, would take six timeouts at least,
    five more than the one shared timeout (room for a loaded machine's delays)."""
    nodes = 6
    with contextlib.ExitStack() as stack:
        silent = [
            stack.enter_context(FakeMemcached(values=VALUES, default=Action.IGNORE))
            for _ in range(nodes)
        ]
        locations = [server.location for server in silent]
        routing = Cluster(locations, ClientSettings())
        keys = [b"t%d" % i for i in range(60)]
        assert set(routing.group(keys)) == set(range(nodes))

        async def scenario(c: CommandSet) -> float:
            started = time.monotonic()
            with pytest.raises(OperationTimeoutError):
                await c.get_many(keys)
            return time.monotonic() - started

        elapsed = run(locations, scenario, timeout=TIMEOUT)
    assert elapsed < nodes * TIMEOUT
