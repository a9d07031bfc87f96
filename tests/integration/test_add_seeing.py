"""An add and a get of its key in one round trip: ``CommandSet.add_seeing`` (both clients)
and the blocking client's plain ``add_seeing_now``.

The backend's ``add`` sends them where get_or_set's leases leave stubs, so that a refused
add tells a stub (which it replaces) from a value at the cost of one round trip. Both
replies are always read: whatever the server answers, the connection stays in step or is
dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_fastcache.client import blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import ADD_SEEING_MAX, CommandSet
from django_fastcache.errors import ProtocolError, ServerError
from django_fastcache.protocol import Item
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.servers import MemcachedServer
from tests.integration.client_runner import Runner, runner_fixture

pytestmark = pytest.mark.integration

#: Long enough that a loaded machine never turns a reply into a timeout.
PATIENT = 5.0
#: Longer than the client's first read of a reply (a few hundred bytes), shorter than what
#: the backend sends this way: read back in several reads.
LONG = b"v" * ADD_SEEING_MAX


run = runner_fixture(timeout=PATIENT)


def client_of(location: str) -> BlockingClient:
    return BlockingClient(Cluster([location], ClientSettings(timeout=PATIENT)))


@pytest.fixture
def real(memcached: MemcachedServer) -> Iterator[BlockingClient]:
    client = client_of(memcached.location)
    yield client
    client.close_thread_connections()


def test_an_add_of_a_new_key_takes_and_stores_its_value(real: BlockingClient) -> None:
    assert real.delete_now(b"seeing-new") in (True, False)
    assert real.add_seeing_now(b"seeing-new", b"fresh", 7, 0) == (True, None)
    assert real.value_now(b"seeing-new") == (b"fresh", 7)


@pytest.mark.parametrize("value", [b"held", LONG], ids=["short", "long"])
def test_a_refused_add_sees_the_value_that_holds_the_key(
    real: BlockingClient, value: bytes
) -> None:
    real.store_now(b"set", b"seeing-held", value, 3, 0)
    assert real.add_seeing_now(b"seeing-held", b"other", 0, 0) == (False, (value, 3))
    # Both replies were read: the connection answers the next call in step.
    assert real.value_now(b"seeing-held") == (value, 3)


def test_a_long_value_added_is_read_back_whole_and_the_connection_stays_in_step(
    real: BlockingClient,
) -> None:
    real.delete_now(b"seeing-long")
    assert real.add_seeing_now(b"seeing-long", LONG, 0, 0) == (True, None)
    assert real.value_now(b"seeing-long") == (LONG, 0)
    assert real.add_seeing_now(b"seeing-long", LONG, 0, 0) == (False, (LONG, 0))


def test_a_refused_add_sees_a_leases_stub(real: BlockingClient) -> None:
    real.delete_now(b"seeing-stub")
    # get_or_set's lease: memcached's empty item, made by mg … N.
    lease = real.meta_at(0, b"mg seeing-stub c N30\r\n")
    assert lease.win
    assert real.add_seeing_now(b"seeing-stub", b"added", 0, 0) == (False, (b"", 0))


def fake_client(fake: FakeMemcached) -> BlockingClient:
    return client_of(fake.location)


def test_replies_that_come_apart_are_read_by_the_general_parser() -> None:
    with FakeMemcached(values={b"k": b"old"}, slow_delay=0.1) as fake:
        client = fake_client(fake)
        fake.script(Action.REPLY, Action.SLOW)  # the get's reply comes later
        assert client.add_seeing_now(b"k", b"new", 0, 0) == (False, (b"old", 0))
        fake.script(Action.REPLY, Action.SLOW)
        assert client.add_seeing_now(b"n", b"new", 0, 0) == (True, None)
        assert client.value_now(b"n") == (b"new", 0)
        assert fake.accepted == 1


def test_garbage_for_the_get_fails_the_call_and_drops_the_connection() -> None:
    with FakeMemcached(values={b"k": b"old"}) as fake:
        client = fake_client(fake)
        fake.script(Action.REPLY, Action.GARBAGE)
        with pytest.raises(ProtocolError):
            client.add_seeing_now(b"k", b"new", 0, 0)
        assert client.value_now(b"k") == (b"old", 0)  # on a new connection, in step
        assert fake.accepted == 2


def test_an_item_of_another_key_in_the_get_fails_the_call() -> None:
    forged = b"NOT_STORED\r\nVALUE victim 0 6\r\nsecret\r\nEND\r\n"
    with FakeMemcached(values={b"k": b"old"}, garbage=forged) as fake:
        client = fake_client(fake)
        # One garbage write answers both requests; the second reply is dropped.
        fake.script(Action.GARBAGE, Action.IGNORE)
        with pytest.raises(ProtocolError, match="not asked for"):
            client.add_seeing_now(b"k", b"new", 0, 0)
        # The get may be read after the failure came back: the next connection's request
        # must not take its IGNORE.
        assert fake.wait_for(lambda: fake.scripted == 0)
        assert client.value_now(b"k") == (b"old", 0)
        assert fake.accepted == 2


def test_an_error_reply_to_the_add_is_raised_and_the_get_still_read() -> None:
    with FakeMemcached(values={b"k": b"old"}, garbage=b"SERVER_ERROR out of memory\r\n") as fake:
        client = fake_client(fake)
        fake.script(Action.GARBAGE, Action.REPLY)
        with pytest.raises(ServerError, match="out of memory"):
            client.add_seeing_now(b"k", b"new", 0, 0)
        assert client.value_now(b"k") == (b"old", 0)  # the same connection, in step
        assert fake.accepted == 1


def test_a_stored_reply_followed_by_another_value_is_read_whole() -> None:
    # Another client's set landed between the add and the get: the value read back is not
    # the add's own, and is read by the general path, whole.
    racing = b"STORED\r\nVALUE k 0 5\r\nracer\r\nEND\r\n"
    with FakeMemcached(garbage=racing) as fake:
        client = fake_client(fake)
        fake.script(Action.GARBAGE, Action.IGNORE)
        assert client.add_seeing_now(b"k", b"mine", 0, 0) == (True, None)
        fake.values[b"x"] = b"1"
        assert client.value_now(b"x") == (b"1", 0)
        assert fake.accepted == 1


def test_a_first_read_that_ends_like_a_whole_reply_inside_the_value_is_not_taken_for_one(
    real: BlockingClient,
) -> None:
    # The value holds "\r\nEND\r\n" exactly where the client's first (short) read of the
    # reply ends: only the length tells that read from the whole reply.
    key = b"seeing-framing"
    header = b"VALUE %s 0 " % key
    first_read = blocking._SHORT_READ
    prefix = first_read - len(b"STORED\r\n") - len(b"END\r\n") - 2
    # (The header's length field has 3 digits: the value is 100 to 999 bytes long.)
    head = b"a" * (prefix - len(header) - len(b"999\r\n"))
    value = head + b"\r\nEND\r\n" + b"b" * 100
    assert 100 <= len(value) <= 999
    real.delete_now(key)
    assert real.add_seeing_now(key, value, 0, 0) == (True, None)
    assert real.value_now(key) == (value, 0)


# -- the coroutine, on both clients ------------------------------------------------------------
def test_the_coroutine_adds_and_sees_what_holds_the_key(
    run: Runner, memcached: MemcachedServer
) -> None:
    async def scenario(client: CommandSet) -> None:
        await client.delete(b"co-new")
        assert await client.add_seeing(b"co-new", b"fresh", flags=7) == (True, None)
        assert await client.add_seeing(b"co-new", b"other") == (
            False,
            Item(b"co-new", b"fresh", 7, None),
        )
        # The stream stayed in step: the next call reads its own reply.
        item = await client.get(b"co-new")
        assert item is not None
        assert item.value == b"fresh"
        await client.delete(b"co-stub")
        lease = await client.meta_get(b"co-stub", cas=True, vivify=30)
        assert lease is not None
        assert lease.win
        assert await client.add_seeing(b"co-stub", b"added") == (
            False,
            Item(b"co-stub", b"", 0, None),
        )

    run([memcached.location], scenario)


def test_the_coroutine_raises_an_error_reply_and_stays_in_step(run: Runner) -> None:
    async def scenario(client: CommandSet) -> None:
        with pytest.raises(ServerError, match="out of memory"):
            await client.add_seeing(b"k", b"new")
        item = await client.get(b"k")
        assert item is not None
        assert item.value == b"old"

    with FakeMemcached(values={b"k": b"old"}, garbage=b"SERVER_ERROR out of memory\r\n") as fake:
        fake.script(Action.GARBAGE, Action.REPLY)
        run([fake.location], scenario)
        assert fake.accepted == 1


def test_the_coroutine_fails_on_garbage_for_the_get(run: Runner) -> None:
    async def scenario(client: CommandSet) -> None:
        with pytest.raises(ProtocolError):
            await client.add_seeing(b"k", b"new")
        item = await client.get(b"k")  # on a new connection
        assert item is not None
        assert item.value == b"old"

    with FakeMemcached(values={b"k": b"old"}) as fake:
        fake.script(Action.REPLY, Action.GARBAGE)
        run([fake.location], scenario)
        assert fake.accepted == 2
