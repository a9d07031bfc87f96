"""Autobatching: concurrent single-key gets of one loop iteration share one request per node.

Real memcached checks the answers; the scripted fake shows what reached the wire and plays
the failures (an error reply, a dropped connection, a server that never answers). Every
waiter must get its own answer or its error, and none may hang: each scenario runs under an
outer bound far above the client's timeout.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from django_fastcache.client import Client
from django_fastcache.errors import (
    ClientClosedError,
    ConnectionLostError,
    InvalidKeyError,
    OperationTimeoutError,
    ServerError,
)
from django_fastcache.protocol import Item
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.servers import MemcachedServer

pytestmark = [pytest.mark.integration]

T = TypeVar("T")

#: The client's timeout: long enough for a server thread starved of CPU on a loaded
#: machine to answer a call that must succeed.
TIMEOUT = 1.0
#: The outer bound on a scenario: a waiter still waiting by then has hung.
HANG = 10.0

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[T]], T]:
    """Runs a scenario on a fresh loop of each kind, bounded so a hang fails the test."""

    def runner(scenario: Awaitable[T]) -> T:
        async def bounded() -> T:
            return await asyncio.wait_for(scenario, HANG)

        if request.param == "uvloop":
            import uvloop

            return uvloop.run(bounded())
        return asyncio.run(bounded())

    return runner


VALUES = {b"k%d" % i: b"value-%d" % i for i in range(300)}


@pytest.fixture
def fake() -> Iterator[FakeMemcached]:
    with FakeMemcached(values=VALUES) as server:
        yield server


def get_lines(server: FakeMemcached) -> list[bytes]:
    return [r.line for r in server.requests if r.line.split()[0] in (b"get", b"gets")]


async def gather_gets(client: Client, keys: list[bytes], *, cas: bool = False) -> list[Any]:
    call = client.gets if cas else client.get
    return await asyncio.gather(*[call(key) for key in keys], return_exceptions=True)


# -- answers -----------------------------------------------------------------------------


def test_two_keys_of_one_node_each_get_their_own_item_and_flags(
    memcached: MemcachedServer, run: Callable[[Awaitable[Any]], Any]
) -> None:
    # The case that breaks emcache's autobatching (its callers hang): two hits, one node,
    # each with flags of its own.
    async def scenario() -> list[Any]:
        client = Client([memcached.location], timeout=TIMEOUT)
        try:
            await client.set(b"first", b"one", flags=5)
            await client.set(b"second", b"two", flags=7)
            return await gather_gets(client, [b"first", b"second"])
        finally:
            await client.aclose()

    assert run(scenario()) == [Item(b"first", b"one", 5, None), Item(b"second", b"two", 7, None)]


def test_a_loop_iterations_gets_go_out_as_one_request(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    keys = [b"k1", b"missing", b"k2", b"k3", b"other-missing"]

    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            return await gather_gets(client, keys)
        finally:
            await client.aclose()

    results = run(scenario())
    assert results == [
        Item(b"k1", b"value-1", 0, None),
        None,
        Item(b"k2", b"value-2", 0, None),
        Item(b"k3", b"value-3", 0, None),
        None,
    ]
    assert get_lines(fake) == [b"get k1 missing k2 k3 other-missing"]


def test_duplicate_keys_are_asked_once_and_answer_every_caller(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            return await gather_gets(client, [b"k1", b"k2", b"k1", b"nope", b"k1", b"nope"])
        finally:
            await client.aclose()

    one, two = Item(b"k1", b"value-1", 0, None), Item(b"k2", b"value-2", 0, None)
    assert run(scenario()) == [one, two, one, None, one, None]
    assert get_lines(fake) == [b"get k1 k2 nope"]


def test_gets_batches_carry_cas(
    memcached: MemcachedServer, run: Callable[[Awaitable[Any]], Any]
) -> None:
    async def scenario() -> tuple[list[Any], list[bool]]:
        client = Client([memcached.location], timeout=TIMEOUT)
        try:
            await client.set(b"a", b"1")
            await client.set(b"b", b"2")
            items = await gather_gets(client, [b"a", b"b", b"absent"], cas=True)
            # Each token is the item's own: a cas with it succeeds, once.
            stored = [await client.cas(item.key, b"new", item.cas) for item in items[:2]]
            return items, stored
        finally:
            await client.aclose()

    items, stored = run(scenario())
    assert [(i.key, i.value) for i in items[:2]] == [(b"a", b"1"), (b"b", b"2")]
    assert all(isinstance(i.cas, int) for i in items[:2])
    assert items[2] is None
    assert stored == [True, True]


def test_more_keys_than_a_line_holds_are_split_into_pipelined_lines(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    keys = sorted(VALUES)[:250]

    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            return await gather_gets(client, keys)
        finally:
            await client.aclose()

    assert run(scenario()) == [Item(key, VALUES[key], 0, None) for key in keys]
    lines = get_lines(fake)
    assert [len(line.split()) - 1 for line in lines] == [100, 100, 50]
    assert {r.connection for r in fake.requests} == {1}


def test_keys_of_several_nodes_go_to_their_nodes(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    with FakeMemcached(values=VALUES) as one, FakeMemcached(values=VALUES) as two:

        async def scenario() -> tuple[list[Any], Client]:
            client = Client([one.location, two.location], timeout=TIMEOUT)
            try:
                keys = sorted(VALUES)[:40] + [b"absent-%d" % i for i in range(10)]
                return await gather_gets(client, keys), client
            finally:
                await client.aclose()

        results, client = run(scenario())
        keys = sorted(VALUES)[:40] + [b"absent-%d" % i for i in range(10)]
        assert results == [Item(k, VALUES[k], 0, None) if k in VALUES else None for k in keys]
        for index, server in enumerate((one, two)):
            lines = get_lines(server)
            assert len(lines) == 1  # one request per node
            asked = lines[0].split()[1:]
            assert asked == [k for k in keys if client.cluster.node_index(k) == index]


def test_many_concurrent_gets_over_real_nodes(
    memcached_cluster: Any, run: Callable[[Awaitable[Any]], Any]
) -> None:
    keys = [b"key-%d" % i for i in range(500)]

    async def scenario() -> list[Any]:
        client = Client(memcached_cluster.locations, timeout=2.0, max_connections=2)
        try:
            await client.set_many([(k, b"v" + k, int(k[4:]) % 7) for k in keys[::2]])
            # Every key asked by several tasks, in several iterations, over every node.
            results: list[Any] = []
            for _ in range(3):
                results = await gather_gets(client, keys + keys[::-1])
            return results
        finally:
            await client.aclose()

    expected = [
        Item(k, b"v" + k, int(k[4:]) % 7, None) if int(k[4:]) % 2 == 0 else None for k in keys
    ]
    assert run(scenario()) == expected + expected[::-1]


# -- failures ----------------------------------------------------------------------------


class ErrorReplies(FakeMemcached):
    """Answers every retrieval with a server error; the stream stays in step."""

    def _execute(self, verb: bytes, args: list[bytes], data: bytes | None) -> bytes:
        if verb in (b"get", b"gets"):
            return b"SERVER_ERROR out of memory reading request\r\n"
        return super()._execute(verb, args, data)


def test_an_error_reply_reaches_every_waiter_and_keeps_the_connection(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    with ErrorReplies(values=VALUES) as server:

        async def scenario() -> tuple[list[Any], str]:
            client = Client([server.location], timeout=TIMEOUT)
            try:
                results = await gather_gets(client, [b"k1", b"k2", b"k1"])
                return results, await client.set(b"after", b"x") and "stored"
            finally:
                await client.aclose()

        results, after = run(scenario())
        assert all(isinstance(r, ServerError) for r in results), results
        assert after == "stored"
        assert server.accepted == 1  # the connection stayed in step and was reused


def test_a_dropped_connection_fails_every_waiter(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fake.script(Action.CLOSE)

    async def scenario() -> tuple[list[Any], Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            results = await gather_gets(client, [b"k1", b"k2", b"k3", b"k2"])
            return results, await client.get(b"k1")  # a new connection serves the next
        finally:
            await client.aclose()

    results, after = run(scenario())
    assert [type(r) for r in results] == [ConnectionLostError] * 4
    assert after == Item(b"k1", b"value-1", 0, None)


def test_a_server_that_never_answers_times_every_waiter_out(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fake.script(Action.IGNORE)

    async def scenario() -> tuple[list[Any], float]:
        client = Client([fake.location], timeout=TIMEOUT)
        loop = asyncio.get_running_loop()
        try:
            began = loop.time()
            results = await gather_gets(client, [b"k1", b"k2", b"k3"])
            return results, loop.time() - began
        finally:
            await client.aclose()

    results, elapsed = run(scenario())
    assert [type(r) for r in results] == [OperationTimeoutError] * 3
    # Bounded by the timeout (a hang would have hit the outer bound instead).
    assert elapsed < HANG / 2


def test_waiting_for_a_busy_pool_is_bounded_by_the_timeout(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    # The only connection is held by a request the server never answers: the batch waits
    # for a connection, and its waiters fail by their deadline.
    fake.script(Action.IGNORE)

    async def scenario() -> list[Any]:
        # The set's own deadline is the scenario's outer bound: with a timeout near the
        # gets', the set could time out first (a loop running late fires both timers in
        # one turn), and the slot it freed let the batch connect and be answered in time.
        client = Client([fake.location], timeout=HANG, max_connections=1)
        try:
            hung = asyncio.ensure_future(client.set(b"x", b"y"))
            await asyncio.sleep(0)  # the set takes the connection, with its deadline
            client.timeout = TIMEOUT  # the gets' deadlines
            results = await gather_gets(client, [b"k1", b"k2"])
            # The set still held the only slot when the gets failed.
            assert not hung.done()
            hung.cancel()
            # A cancelled write ends once answered or failed: here the server's connections
            # close under it.
            await asyncio.to_thread(fake.stop)
            results.append(await asyncio.gather(hung, return_exceptions=True))
            return results
        finally:
            await client.aclose()

    one, two, (hung,) = run(scenario())
    assert isinstance(one, OperationTimeoutError)
    assert isinstance(two, OperationTimeoutError)
    assert isinstance(hung, asyncio.CancelledError)


def test_cancelling_one_waiter_leaves_the_others_answered_and_the_connection_whole(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fake.script(Action.SLOW)  # the batch's reply comes after slow_delay

    async def scenario() -> tuple[list[Any], bool, Any]:
        client = Client([fake.location], timeout=2.0)
        try:
            tasks = [asyncio.ensure_future(client.get(k)) for k in (b"k1", b"k2", b"k3")]
            await asyncio.sleep(0)  # submitted
            await asyncio.sleep(0)  # flushed: the request is on the wire
            tasks[1].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            # The same connection answers the next batch: nothing was left unread on it.
            after = await client.get(b"k2")
            return results, isinstance(results[1], asyncio.CancelledError), after
        finally:
            await client.aclose()

    results, cancelled, after = run(scenario())
    assert cancelled
    assert results[0] == Item(b"k1", b"value-1", 0, None)
    assert results[2] == Item(b"k3", b"value-3", 0, None)
    assert after == Item(b"k2", b"value-2", 0, None)
    assert fake.accepted == 1
    assert get_lines(fake) == [b"get k1 k2 k3", b"get k2"]


def test_waiters_cancelled_before_the_flush_send_nothing(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    async def scenario() -> Any:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            await client.set(b"warm", b"up")  # a connection is open and idle
            tasks = [asyncio.ensure_future(client.get(k)) for k in (b"k1", b"k2")]
            await asyncio.sleep(0)  # submitted, flush scheduled
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return await client.get(b"k3")
        finally:
            await client.aclose()

    assert run(scenario()) == Item(b"k3", b"value-3", 0, None)
    assert get_lines(fake) == [b"get k3"]


def test_a_bad_key_fails_its_caller_alone(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            return await gather_gets(client, [b"k1", b"bad key", b"k2"])
        finally:
            await client.aclose()

    one, bad, two = run(scenario())
    assert isinstance(bad, InvalidKeyError)
    assert (one.value, two.value) == (b"value-1", b"value-2")
    assert get_lines(fake) == [b"get k1 k2"]


def test_gets_pending_at_aclose_fail_instead_of_hanging(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        tasks = [asyncio.ensure_future(client.get(k)) for k in (b"k1", b"k2")]
        await asyncio.sleep(0)  # submitted, not flushed yet
        await client.aclose()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = run(scenario())
    assert all(isinstance(r, ClientClosedError) for r in results), results


def test_without_autobatching_each_get_is_its_own_request(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT, autobatching=False)
        try:
            return await gather_gets(client, [b"k1", b"k2"])
        finally:
            await client.aclose()

    assert [r.value for r in run(scenario())] == [b"value-1", b"value-2"]
    assert sorted(get_lines(fake)) == [b"get k1", b"get k2"]


def test_autobatching_must_be_a_bool() -> None:
    from django_fastcache.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="autobatching"):
        Client(["127.0.0.1:11211"], autobatching="yes")  # type: ignore[arg-type]


async def cancel_a_batch_nobody_answers(fake: FakeMemcached) -> tuple[dict[str, int], Any]:
    """Three callers of a batch the server never answers are cancelled; then one more get.
    Returns the pool's metrics after the cancellations and that get's item."""
    # The batch's reply never comes: only the cancellation ends the wait.
    fake.script(Action.REPLY, Action.IGNORE)
    client = Client([fake.location], timeout=5.0, max_connections=1)
    try:
        await client.set(b"warm", b"up")  # the connection is open and idle
        tasks = [asyncio.ensure_future(client.get(k)) for k in (b"k1", b"k2", b"k1")]
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # on the wire
        # Each connection has a server thread of its own, and a scripted action goes to
        # the request a thread reads first: until the batch's thread has taken IGNORE,
        # the next get (on a new connection) may take it instead and never be answered.
        # The wait blocks the loop on purpose: the callers are cancelled at this turn.
        assert fake.wait_for(lambda: fake.scripted == 0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics = client.pool_metrics()[fake.location]
        # The only slot is free again at once: the next get opens a new connection.
        return metrics, await client.get(b"k2")
    finally:
        await client.aclose()


def test_a_batch_whose_callers_are_all_cancelled_frees_its_connection(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    metrics, after = run(cancel_a_batch_nobody_answers(fake))
    assert (metrics["open"], metrics["closed"]) == (0, 1)
    assert after == Item(b"k2", b"value-2", 0, None)


def test_a_batch_abandoned_while_waiting_for_a_connection_holds_no_later_get(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    # The only connection is held by a set the server never answers, so the batch waits
    # for the pool; its callers are cancelled there. The next get must go at once (and
    # wait for the pool itself), not be held until the abandoned batch gets a connection.
    fake.script(Action.IGNORE)

    async def waits_after(client: Client, turns: int, waits: int) -> int:
        """The pool's waits once it reaches ``waits``, or after ``turns`` loop turns."""
        for _ in range(turns):
            if client.pool_metrics().get(fake.location, {}).get("waits", 0) >= waits:
                break
            await asyncio.sleep(0)
        return client.pool_metrics()[fake.location]["waits"]

    async def scenario() -> tuple[int, int, Any, Any]:
        client = Client([fake.location], timeout=TIMEOUT, max_connections=1)
        try:
            hung = asyncio.ensure_future(client.set(b"x", b"y"))
            tasks = [asyncio.ensure_future(client.get(k)) for k in (b"k1", b"k2")]
            waiting = await waits_after(client, 20, 1)  # the batch waits for the pool
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            later = asyncio.ensure_future(client.get(b"k3"))
            # A few turns are enough for its flush to reach the pool.
            waiting_too = await waits_after(client, 20, 2)
            later.cancel()
            results = await asyncio.gather(hung, later, return_exceptions=True)
            return waiting, waiting_too, *results
        finally:
            await client.aclose()

    waiting, waiting_too, hung, later = run(scenario())
    assert (waiting, waiting_too) == (1, 2)
    assert isinstance(hung, OperationTimeoutError)
    assert isinstance(later, asyncio.CancelledError)


class LateFirstConnection(FakeMemcached):
    """Its first connection's thread reads a get only once a request of the second
    connection has been handled (or after ``late`` seconds): the order a loaded machine
    may run the threads in."""

    late = 1.0

    def _handle(self, peer: Any, request: Any) -> bool:
        if peer.number == 1 and request.line.startswith(b"get"):
            self.wait_for(lambda: self.second_handled, self.late)
        try:
            return super()._handle(peer, request)
        finally:
            if peer.number == 2:
                self.second_handled = True

    second_handled = False


def test_the_cancelled_batch_scenario_holds_when_the_batch_is_read_late(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    # Without the wait for the script, the next get took IGNORE and timed out.
    with LateFirstConnection(values=VALUES) as fake:
        metrics, after = run(cancel_a_batch_nobody_answers(fake))
        assert (metrics["open"], metrics["closed"]) == (0, 1)
        assert after == Item(b"k2", b"value-2", 0, None)
        assert [(r.connection, r.line) for r in fake.requests][1:] == [
            (1, b"get k1 k2"),
            (2, b"get k2"),
        ]


# -- one batch in flight per node: later gets wait for its reply, then go together --------


def test_gets_made_while_a_batch_is_in_flight_go_out_together_after_its_reply(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fake.script(Action.SLOW)  # the first batch is answered after slow_delay

    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=2.0)
        try:
            first = asyncio.ensure_future(client.get(b"k1"))
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # "get k1" is on the wire
            # Gets of three later turns, each of which would have been a request of its own.
            later = [asyncio.ensure_future(client.get(b"k2"))]
            await asyncio.sleep(0)
            later.append(asyncio.ensure_future(client.get(b"k3")))
            await asyncio.sleep(0)
            later.append(asyncio.ensure_future(client.get(b"missing")))
            return await asyncio.gather(first, *later)
        finally:
            await client.aclose()

    assert run(scenario()) == [
        Item(b"k1", b"value-1", 0, None),
        Item(b"k2", b"value-2", 0, None),
        Item(b"k3", b"value-3", 0, None),
        None,
    ]
    assert get_lines(fake) == [b"get k1", b"get k2 k3 missing"]


def test_a_batch_in_flight_that_fails_lets_the_held_one_go(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fake.script(Action.CLOSE)  # the first batch's connection is dropped unanswered

    async def scenario() -> tuple[Any, Any]:
        client = Client([fake.location], timeout=2.0)
        try:
            first = asyncio.ensure_future(client.get(b"k1"))
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # on the wire
            held = asyncio.ensure_future(client.get(b"k2"))
            outcome = await asyncio.gather(first, return_exceptions=True)
            return outcome[0], await held
        finally:
            await client.aclose()

    failed, answered = run(scenario())
    assert isinstance(failed, ConnectionLostError)
    assert answered == Item(b"k2", b"value-2", 0, None)


def test_a_held_batch_whose_callers_are_cancelled_sends_nothing(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    fake.script(Action.SLOW)

    async def scenario() -> tuple[Any, Any]:
        client = Client([fake.location], timeout=2.0)
        try:
            first = asyncio.ensure_future(client.get(b"k1"))
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # on the wire
            held = asyncio.ensure_future(client.get(b"k2"))
            await asyncio.sleep(0)  # submitted: held behind "get k1"
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
            return await first, await client.get(b"k3")
        finally:
            await client.aclose()

    assert run(scenario()) == (Item(b"k1", b"value-1", 0, None), Item(b"k3", b"value-3", 0, None))
    assert get_lines(fake) == [b"get k1", b"get k3"]


# -- rounds: a node's next batch waits for the other nodes' batches in flight -------------


def keys_by_node(client: Client) -> tuple[list[bytes], list[bytes]]:
    """VALUES' keys of the client's first and second node."""
    nodes: tuple[list[bytes], list[bytes]] = ([], [])
    for key in sorted(VALUES):
        nodes[client.cluster.node_index(key)].append(key)
    return nodes


def test_gets_for_an_idle_node_wait_for_the_round_in_flight_then_go_together(
    run: Callable[[Awaitable[Any]], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_fastcache.client import batching

    monkeypatch.setattr(batching, "HOLD_LIMIT", 30.0)  # the slow reply ends the round
    with FakeMemcached(values=VALUES) as one, FakeMemcached(values=VALUES) as two:
        one.script(Action.SLOW)

        async def scenario() -> tuple[list[Any], list[bytes], list[bytes]]:
            client = Client([one.location, two.location], timeout=5.0)
            on_one, on_two = keys_by_node(client)
            try:
                first = asyncio.ensure_future(client.get(on_one[0]))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # on the wire
                later = [asyncio.ensure_future(client.get(on_two[0]))]
                await asyncio.sleep(0)  # held by the round, not sent
                later.append(asyncio.ensure_future(client.get(on_two[1])))
                later.append(asyncio.ensure_future(client.get(on_two[0])))
                return await asyncio.gather(first, *later), on_one[:1], on_two[:2]
            finally:
                await client.aclose()

        results, on_one, on_two = run(scenario())
        assert results == [Item(k, VALUES[k], 0, None) for k in on_one + on_two + on_two[:1]]
        assert get_lines(one) == [b"get " + on_one[0]]
        assert get_lines(two) == [b"get " + b" ".join(on_two)]  # one batch, once the round ended


def test_a_node_that_never_answers_holds_the_other_nodes_gets_no_longer_than_the_limit(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    with FakeMemcached(values=VALUES) as one, FakeMemcached(values=VALUES) as two:
        one.script(Action.IGNORE)

        async def scenario() -> tuple[Any, Any, Any]:
            client = Client([one.location, two.location], timeout=2.0)
            on_one, on_two = keys_by_node(client)
            try:
                stuck = asyncio.ensure_future(client.get(on_one[0]))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # on the wire, never answered
                held = asyncio.ensure_future(client.get(on_two[0]))
                done, _ = await asyncio.wait({stuck, held}, return_when=asyncio.FIRST_COMPLETED)
                # The round ended early: the next get for the healthy node goes at once.
                after = await client.get(on_two[1])
                answered_first = done == {held}
                outcome = (await asyncio.gather(stuck, return_exceptions=True))[0]
                return answered_first, (held.result(), after), outcome
            finally:
                await client.aclose()

        answered_first, items, outcome = run(scenario())
        on_two = keys_by_node(Client([one.location, two.location]))[1]
        assert answered_first  # long before the stuck get's timeout
        assert items == tuple(Item(k, VALUES[k], 0, None) for k in on_two[:2])
        assert isinstance(outcome, OperationTimeoutError)


def test_a_get_held_by_the_round_and_cancelled_sends_nothing(
    run: Callable[[Awaitable[Any]], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_fastcache.client import batching

    monkeypatch.setattr(batching, "HOLD_LIMIT", 30.0)
    with FakeMemcached(values=VALUES) as one, FakeMemcached(values=VALUES) as two:
        one.script(Action.SLOW)

        async def scenario() -> tuple[Any, Any, bytes]:
            client = Client([one.location, two.location], timeout=5.0)
            on_one, on_two = keys_by_node(client)
            try:
                first = asyncio.ensure_future(client.get(on_one[0]))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # on the wire
                held = asyncio.ensure_future(client.get(on_two[0]))
                await asyncio.sleep(0)  # held by the round
                held.cancel()
                await asyncio.gather(held, return_exceptions=True)
                answered = await first
                # The round is over: a get for the second node goes, alone, at once.
                return answered, await client.get(on_two[1]), on_two[1]
            finally:
                await client.aclose()

        answered, after, key = run(scenario())
        assert answered is not None
        assert after == Item(key, VALUES[key], 0, None)
        assert get_lines(two) == [b"get " + key]


def test_a_caller_cancelled_as_the_reply_arrives_is_skipped_and_the_others_answered() -> None:
    # The race no scenario can time: a caller's future is cancelled (its task was
    # cancelled) in the turn its batch's reply is read, before its task could tell the
    # batch. The reply goes to everyone else, before and after it.
    from django_fastcache.client.address import parse_address
    from django_fastcache.client.batching import Batch, GetBatcher
    from django_fastcache.client.pool import Pool, PoolSettings

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        pool = Pool(parse_address("127.0.0.1:9"), PoolSettings(), loop)
        batcher = GetBatcher(pool)
        batch = Batch(batcher, loop.time() + 1)
        items = [Item(k, b"v-" + k, 0, None) for k in (b"a", b"b", b"c")]
        for item in items:
            batch.keys.append(item.key)
            batch.futures.append(loop.create_future())
        batcher._in_flight = 1  # as if sent
        batch.futures[1].cancel()
        batch.set_result(items)
        return [None if f.cancelled() else f.result() for f in batch.futures]

    items = asyncio.run(scenario())
    assert items == [Item(b"a", b"v-a", 0, None), None, Item(b"c", b"v-c", 0, None)]


def test_keys_that_are_not_bytes_fail_as_invalid_keys_before_and_after_a_good_one(
    fake: FakeMemcached, run: Callable[[Awaitable[Any]], Any]
) -> None:
    # A key asked for before is remembered as checked: what is not exactly bytes is
    # checked every time (and an unhashable one must not fail with a TypeError).
    class Key(bytes):
        pass

    async def scenario() -> list[Any]:
        client = Client([fake.location], timeout=TIMEOUT)
        try:
            first = await client.get(b"k1")
            bad = await asyncio.gather(
                client.get("k1"),  # type: ignore[arg-type]
                client.get(["k1"]),  # type: ignore[arg-type]
                client.get(bytearray(b"k1")),  # type: ignore[arg-type]
                client.get(b"k 1"),
                return_exceptions=True,
            )
            return [first, *bad, await client.get(Key(b"k1")), await client.get(b"k1")]
        finally:
            await client.aclose()

    first, *bad, subclass, again = run(scenario())
    assert [type(error) for error in bad] == [InvalidKeyError] * 4
    assert first == subclass == again == Item(b"k1", b"value-1", 0, None)
