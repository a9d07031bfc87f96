"""The backend's ``autobatching`` and ``pipelining`` OPTIONS, seen on the wire.

A scripted fake memcached records every request line and the connection it came on: with
autobatching, concurrent ``aget`` calls of one loop turn are one ``get`` line; without, one
line each. With pipelining, concurrent ``aset`` calls share a connection; without, each
takes a connection of its own. The values are the fake's (flags 0: raw bytes), so values
are not sealed here.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.testing.fake_server import Action, FakeMemcached

pytestmark = pytest.mark.integration

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
KEYS = ["alpha", "beta", "gamma"]


@pytest.fixture
def fake() -> Iterator[FakeMemcached]:
    # The wire keys of Django's default key function, version 1.
    with FakeMemcached(values={b":1:" + k.encode(): k.encode() * 2 for k in KEYS}) as server:
        yield server


def make_cache(fake: FakeMemcached, **options: Any) -> FastCache:
    options = {"disk_tier": False, "sign_values": False, "operation_timeout": 5.0, **options}
    return FastCache(fake.location, {"TIMEOUT": 300, "OPTIONS": options})


def run(loop: str, cache: FastCache, work: Any) -> Any:
    async def main() -> Any:
        try:
            return await asyncio.wait_for(work(), 30)
        finally:
            await cache.client.aclose()

    if loop == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def get_lines(fake: FakeMemcached) -> list[bytes]:
    return [r.line for r in fake.requests if r.line.startswith(b"get ")]


def test_both_are_on_by_default(fake: FakeMemcached) -> None:
    client = make_cache(fake).client
    assert (client.autobatching, client.pipelining) == (True, True)


def test_the_options_reach_the_client(fake: FakeMemcached) -> None:
    client = make_cache(fake, autobatching=False, pipelining=False).client
    assert (client.autobatching, client.pipelining) == (False, False)


@pytest.mark.parametrize("loop", LOOPS)
def test_with_autobatching_concurrent_agets_are_one_request(loop: str, fake: FakeMemcached) -> None:
    cache = make_cache(fake)

    async def work() -> list[Any]:
        return await asyncio.gather(*[cache.aget(k) for k in [*KEYS, "missing"]])

    assert run(loop, cache, work) == [b"alphaalpha", b"betabeta", b"gammagamma", None]
    assert get_lines(fake) == [b"get :1:alpha :1:beta :1:gamma :1:missing"]


@pytest.mark.parametrize("loop", LOOPS)
def test_without_autobatching_each_aget_is_a_request(loop: str, fake: FakeMemcached) -> None:
    cache = make_cache(fake, autobatching=False)

    async def work() -> list[Any]:
        return await asyncio.gather(*[cache.aget(k) for k in KEYS])

    assert run(loop, cache, work) == [b"alphaalpha", b"betabeta", b"gammagamma"]
    assert sorted(get_lines(fake)) == [b"get :1:alpha", b"get :1:beta", b"get :1:gamma"]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(("pipelining", "connections"), [(True, 1), (False, 3)])
def test_pipelining_decides_whether_concurrent_asets_share_a_connection(
    loop: str, fake: FakeMemcached, pipelining: bool, connections: int
) -> None:
    # The first set is answered late, so the others are made while it is in flight.
    fake.script(Action.SLOW)
    cache = make_cache(fake, pipelining=pipelining)

    async def work() -> None:
        first = asyncio.ensure_future(cache.aset("one", b"1"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the first set is on the wire
        # A scripted action goes to the request a server thread reads first: without
        # pipelining the next sets go on connections of their own, and one of them could
        # take SLOW if the first connection's thread ran late.
        for _ in range(1000):
            if fake.scripted == 0:
                break
            await asyncio.sleep(0.005)
        assert fake.scripted == 0
        await asyncio.gather(first, cache.aset("two", b"2"), cache.aset("three", b"3"))

    run(loop, cache, work)
    sets = [r for r in fake.requests if r.line.startswith(b"set ")]
    assert len(sets) == 3
    assert len({r.connection for r in sets}) == connections
