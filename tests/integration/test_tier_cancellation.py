"""Leases of the disk tier cut short by cancellation, and stubs nobody gives back, against
a real memcached.

A refill, an add or a get_or_set holds a lease (``mg … N``: a stub in memcached, read as a
miss) between its request and its store. An ASGI server cancels the task of a client that
went away, at any await: a lease whose store was cut short must be given back, or its stub
reads as a miss until it expires. A stub whose ``mg`` reply never reached its caller (or
whose holder died) cannot be given back: an incr that meets it must still count on the
value get answers from disk, never report the counter missing and hide it.

The cancellations land at known points: the client is wrapped (:class:`CutShort`) so that
the calling task is cancelled as a chosen call is made, before the call is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from django.core.cache.backends.base import DEFAULT_TIMEOUT

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.errors import OutcomeUnknownError
from django_fastcache.protocol import MetaReply, MetaStatus
from django_fastcache.serializers import FLAG_INTEGER
from django_fastcache.stampede import async_pause, get_or_set
from django_fastcache.testing.servers import MemcachedServer
from tests.integration.test_tiered import (
    Raw,
    assert_the_win_is_free,
    landed,
    on_disk,
    tiered,
)

pytestmark = pytest.mark.integration

#: A stand-in for the cut-off lease reply: the ``mg … N`` itself, its reply lost.
LEASE = "lease"


class CutShort:
    """The asyncio client, with ``task`` cancelled at chosen points once a lease request
    (``mg … N``) was answered: each call named in ``cuts`` in turn cancels ``task`` as it is
    made. Made in that task, the call then never reaches memcached, as when the
    cancellation lands while it waits for a connection; made in another task (a give-back
    running on its own), it goes on. :data:`LEASE` cancels as the lease's reply arrives:
    the reply is lost, and its stub is nobody's to give back."""

    def __init__(self, inner: Client, cuts: list[str]) -> None:
        self._inner = inner
        self.cuts = list(cuts)
        self.task: asyncio.Future[Any] | None = None
        self.leased = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in ("meta_set", "meta_delete"):
            return attribute

        async def cut(*args: Any, **kwargs: Any) -> Any:
            if self.leased and self.cuts and self.cuts[0] == name:
                await self._cancel()
            return await attribute(*args, **kwargs)

        return cut

    async def meta_get(self, *args: Any, **kwargs: Any) -> MetaReply | None:
        reply = await self._inner.meta_get(*args, **kwargs)
        if kwargs.get("vivify") is not None:
            self.leased = True
            if self.cuts and self.cuts[0] == LEASE:
                await self._cancel()
        return reply

    async def _cancel(self) -> None:
        self.cuts.pop(0)
        assert self.task is not None
        self.task.cancel()
        await asyncio.sleep(0)  # raises CancelledError here when this is that task


async def cancelled(
    cache: FastCache, cuts: list[str], call: Callable[[CutShort], Awaitable[Any]]
) -> None:
    """Run ``call`` with a :class:`CutShort` client in a task of its own, which must end
    cancelled at every cut; then wait for whatever it left running (a give-back)."""
    client = CutShort(cache.client, cuts)
    task = asyncio.ensure_future(call(client))
    client.task = task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.cuts == [], "a cut was not reached"
    others = asyncio.all_tasks() - {asyncio.current_task()}
    await asyncio.wait_for(asyncio.gather(*others), 10)


def counter_on_disk_only(cache: FastCache, memcached: MemcachedServer) -> None:
    """``n`` is 5, acknowledged; its disk copy landed, and memcached lost everything."""
    cache.set("n", 5, timeout=1000)
    landed(cache)
    memcached.flush()


OPERATIONS: dict[str, Callable[[FastCache, CutShort], Awaitable[Any]]] = {
    # A miss answered from disk and refilled under the get's lease.
    "get": lambda cache, client: cache._get(client, "n"),
    # A touch of a key memcached lost: put back with its new expiry, under a lease.
    "touch": lambda cache, client: cache._touch(client, "n", 500),
    # An add refused by the disk's value, which goes back under the add's lease.
    "add refused": lambda cache, client: cache._add(client, "n", 0),
    # An add of a key missing in both tiers: its value stored under its lease.
    "add": lambda cache, client: cache._add(client, "fresh", 7),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize(
    "cuts",
    [["meta_set"], ["meta_set", "meta_delete"]],
    ids=["cancelled", "cancelled again while giving it back"],
)
def test_a_lease_whose_store_is_cut_short_by_a_cancellation_is_given_back(
    cache: FastCache, memcached: MemcachedServer, raw: Raw, operation: str, cuts: list[str]
) -> None:
    counter_on_disk_only(cache, memcached)

    async def run() -> None:
        await cancelled(cache, cuts, lambda client: OPERATIONS[operation](cache, client))

    asyncio.run(run())
    # No stub left: memcached holds nothing, as before the call.
    assert raw.get(cache.wire_key("n")) is None
    assert raw.get(cache.wire_key("fresh")) is None
    landed(cache)  # (a touch's copy, under its new stamp)
    assert cache.incr("n") == 6
    assert cache.get("n") == 6
    assert cache.add("fresh", 8) is True


def test_a_get_or_set_cancelled_again_while_giving_its_lease_back_still_gives_it_back(
    cache: FastCache, raw: Raw
) -> None:
    async def run() -> None:
        await cancelled(
            cache,
            ["meta_set", "meta_delete"],
            lambda client: get_or_set(
                cache,
                client,  # type: ignore[arg-type]
                "fresh",
                7,
                DEFAULT_TIMEOUT,
                None,
                pause=async_pause,
                refused=object(),
                is_async=True,
            ),
        )

    asyncio.run(run())
    assert raw.get(cache.wire_key("fresh")) is None
    assert cache.get_or_set("fresh", 8) == 8
    assert cache.get("fresh") == 8


def test_an_add_cancelled_while_giving_back_a_stale_values_win_gives_it_back(
    cache: FastCache,
) -> None:
    cache.set("k", "old", timeout=1000)
    assert cache.invalidate("k")

    async def run() -> None:
        await cancelled(cache, ["meta_delete"], lambda client: cache._add(client, "k", "new"))

    asyncio.run(run())
    assert_the_win_is_free(cache, "k")


def plant_stub(cache: FastCache, how: str) -> int | None:
    """A stub of ``n`` in memcached that its holder never gives back: its holder died
    (the CAS returned), or its ``mg … N`` reply was lost to a cancellation."""
    wire = cache.wire_key("n")
    if how == "holder died":
        lease = run_blocking(tiered(cache).blocking.meta_get(wire, cas=True, vivify=30))
        assert lease is not None
        assert lease.win
        return lease.cas

    async def run() -> None:
        await cancelled(cache, [LEASE], lambda client: cache._get(client, "n"))

    asyncio.run(run())
    return None


@pytest.mark.parametrize("how", ["holder died", "reply lost"])
@pytest.mark.parametrize("api", ["sync", "async"])
def test_incr_counts_on_the_disk_value_over_a_stub_nobody_gives_back(
    cache: FastCache, memcached: MemcachedServer, raw: Raw, api: str, how: str
) -> None:
    counter_on_disk_only(cache, memcached)
    cas = plant_stub(cache, how)
    wire = cache.wire_key("n")
    assert raw.get(wire) == (b"", 0)  # the stub
    assert cache.get("n") == 5  # read as a miss: answered from disk
    if api == "sync":
        assert cache.incr("n") == 6
        assert cache.decr("n", 2) == 4
    else:

        async def count() -> tuple[int, int]:
            return await cache.aincr("n"), await cache.adecr("n", 2)

        assert asyncio.run(count()) == (6, 4)
    assert cache.get("n") == 4
    assert raw.get(wire) == (b"4", FLAG_INTEGER)
    entry = on_disk(cache, "n")
    assert entry is not None
    assert (entry.data, entry.flags) == (b"4", FLAG_INTEGER)
    if cas is not None:
        # The holder's late give-back finds the stub replaced, and leaves the count.
        reply = run_blocking(tiered(cache).blocking.meta_delete(wire, cas=cas))
        assert reply.status is MetaStatus.EX
        assert cache.get("n") == 4


class Refusing:
    """The asyncio client, with memcached refusing every store under a CAS (``NS``, as
    when it is out of memory)."""

    def __init__(self, inner: Client) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def meta_set(self, *args: Any, **kwargs: Any) -> MetaReply:
        return MetaReply(MetaStatus.NS)


def test_an_incr_that_cannot_replace_a_stub_keeps_the_disk_counter_answering(
    cache: FastCache, memcached: MemcachedServer
) -> None:
    counter_on_disk_only(cache, memcached)
    plant_stub(cache, "holder died")

    async def count() -> None:
        with pytest.raises(OutcomeUnknownError, match="was not made"):
            await cache._incr(Refusing(cache.client), "n")  # type: ignore[arg-type]

    asyncio.run(count())
    # Not reported missing, and not lost: get answers the count it had, then counts on.
    landed(cache)
    assert cache.get("n") == 5
    assert cache.incr("n") == 6
