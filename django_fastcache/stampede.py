"""Stampede protection behind ``get_or_set``: memcached's leases, for both clients.

When a value is missing, ``mg <key> c N<lease>`` makes memcached create an empty item (a
*stub*) and hand exactly one caller, in any thread, task, process or host, the win (``W``);
every other caller sees ``Z`` and waits, polling with backoff, for the value to appear.
The winner computes it and stores it with ``ms … C<cas>``: a ``set`` or ``delete`` that
lands while it computes changes the CAS and wins (the winner's value is then returned to
its caller but not stored). A winner that raises (or is cancelled) deletes its stub
(``md … C<cas>``, see :func:`let_go`) so the next caller wins at once; one that dies
leaves the stub to expire after ``stampede_lease`` seconds, and a waiter's next poll wins
then.

With ``stale_while_revalidate`` the lease is also handed out during a value's last seconds
(``R<seconds>``) while the others keep getting the current value, and a value marked stale
by :func:`invalidate` (``md … I``) is served at once while one caller recomputes it.

A stub is an empty value with flags 0, which the backend never writes (the serializer
stores ``b""`` compressed): the classic read path reads it as a miss, and ``add`` and
``incr`` look for one when memcached refuses them (see :func:`add_over_stub` and
:func:`is_stub_now`).

With the disk tier on, a won miss first asks the tier for its disk entry (stored back
under the lease, :meth:`TieredStore.answer_leased_miss`), and the winner's store is a write
by the tier's rules (:meth:`TieredStore.store_leased`: stamped, CAS-stored, disk copy
queued).

Whether a node speaks meta is the ``protocol`` option's business (:class:`MetaSupport`):
``auto`` asks each node with ``mn`` the first time get_or_set needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .client.blocking import BlockingClient
from .client.cluster import Cluster
from .client.commands import CommandSet
from .errors import FastCacheError, NetworkError, ProtocolError
from .expiry import memcached_exptime
from .logs import RateLimit, logger
from .protocol import MetaReply, MetaStatus, MetaUnsupportedError

if TYPE_CHECKING:
    from .backends.fastcache import FastCache
    from .backends.options import FastCacheOptions

#: Pauses between two polls of a waiting caller: doubling from the first to the last.
FIRST_PAUSE = 0.002
MAX_PAUSE = 0.05

Pause = Callable[[float], Awaitable[None]]


def makes_stubs(options: FastCacheOptions) -> bool:
    """Whether caches of these settings leave lease stubs in memcached (get_or_set's
    leases): where they do not, a refused ``add`` has no stub to look for."""
    return options.stampede_protection and options.protocol != "classic"


def is_stub(data: bytes, flags: int) -> bool:
    """Whether a value read back is a lease's stub (memcached's empty vivified item)."""
    return not data and not flags


async def blocking_pause(seconds: float) -> None:
    """The sync API's pause: the calling thread sleeps (its coroutine never suspends)."""
    time.sleep(seconds)  # noqa: ASYNC251 - run by the sync bridge, never on a loop


async def async_pause(seconds: float) -> None:
    await asyncio.sleep(seconds)


# -- which nodes speak meta ----------------------------------------------------------------


class MetaSupport:
    """Per node of one cluster: whether get_or_set may use meta commands there.

    ``protocol="meta"`` assumes every node does and ``"classic"`` that none does; ``"auto"``
    asks a node (``mn``: ``MN`` from memcached 1.6+, ``ERROR`` from older servers and
    proxies) the first time it is needed, and remembers the answer for the process.
    """

    def __init__(self, setting: str, node_ids: tuple[str, ...]) -> None:
        self.setting = setting
        self.node_ids = node_ids
        start: bool | None = None
        if setting == "meta":
            start = True
        elif setting == "classic":
            start = False
        self._answers: list[bool | None] = [start] * len(node_ids)

    async def speaks(self, client: CommandSet, node: int) -> bool:
        """Whether ``node`` speaks meta, asking it once (``auto``). A node that cannot be
        reached now is not asked again until the next call."""
        answer = self._answers[node]
        if answer is None:
            try:
                answers = await client.speaks_meta(nodes=[node])
            except FastCacheError:
                return False  # not now: get_or_set goes the classic way this once
            answer = answers[self.node_ids[node]]
            self._answers[node] = answer
            logger.info(
                "memcached node %s %s the meta protocol: get_or_set %s",
                self.node_ids[node],
                "speaks" if answer else "does not speak",
                "uses leases" if answer else "runs without stampede protection",
            )
        return answer

    def refused(self, node: int, error: MetaUnsupportedError) -> None:
        """``node`` answered a meta command with ``ERROR``."""
        node_id = self.node_ids[node]
        if self.setting == "meta":
            raise MetaUnsupportedError(
                f"memcached node {node_id} does not speak the meta protocol (it answered"
                " ERROR), but OPTIONS['protocol'] is 'meta': set it to 'auto' or 'classic'"
            ) from error
        if self._answers[node] is not False:
            self._answers[node] = False
            logger.warning(
                "memcached node %s stopped speaking the meta protocol (it answered ERROR):"
                " get_or_set runs without stampede protection there",
                node_id,
            )


_supports: dict[tuple[str, tuple[str, ...]], MetaSupport] = {}
_supports_lock = threading.Lock()
_warnings = RateLimit()


def meta_support(setting: str, cluster: Cluster) -> MetaSupport:
    """The process's :class:`MetaSupport` for these nodes and this ``protocol`` setting."""
    identity = (setting, cluster.node_ids)
    support = _supports.get(identity)
    if support is None:
        with _supports_lock:
            support = _supports.setdefault(identity, MetaSupport(setting, cluster.node_ids))
    return support


# -- get_or_set ----------------------------------------------------------------------------


class _Missing:
    pass


_MISSING: Any = _Missing()


async def _call(default: Any, awaitable_ok: bool) -> Any:
    if not callable(default):
        return default
    value = default()
    if awaitable_ok and inspect.isawaitable(value):
        value = await value
    return value


async def get_or_set(
    cache: FastCache,
    client: CommandSet,
    key: Any,
    default: Any,
    timeout: Any,
    version: int | None,
    *,
    pause: Pause,
    refused: Any,
    is_async: bool = False,
) -> Any:
    """Django's ``get_or_set`` with a lease per missing value (see the module docs).

    ``refused`` is the backend's marker for a value it must not load; ``pause`` waits
    between polls (a thread sleep on the sync API, an ``asyncio.sleep`` on the async one).
    """
    options = cache._options
    stack = cache._shared()
    wire = cache.wire_key(key, version)
    node = client.cluster.node_index(wire)
    support = meta_support(options.protocol, client.cluster)
    if not options.stampede_protection or not await support.speaks(client, node):
        return await _unprotected(cache, client, key, default, timeout, version, is_async)
    tier = stack.tiered
    tiered = tier is not None
    epoch = 0 if tier is None else tier.states.epoch(node)
    if epoch & 1:
        # The node is out, no one to hold a lease with: the tier answers from disk.
        return await _unprotected(cache, client, key, default, timeout, version, is_async)
    lease = max(1, math.ceil(options.stampede_lease))
    ahead = options.stale_while_revalidate
    recache = math.ceil(ahead) if ahead > 0 else None
    deadline = time.monotonic() + options.stampede_wait
    delay = FIRST_PAUSE
    while True:
        try:
            reply = await client.meta_get(wire, cas=True, vivify=lease, recache=recache)
        except MetaUnsupportedError as exc:
            support.refused(node, exc)
            return await _unprotected(cache, client, key, default, timeout, version, is_async)
        except (NetworkError, ProtocolError):
            if not tiered:
                raise
            # The tier has marked the node out (or will): it answers from disk.
            return await _unprotected(cache, client, key, default, timeout, version, is_async)
        stub = reply is None or is_stub(reply.value or b"", reply.client_flags or 0)
        if tier is not None and tier.went_out(node, epoch):
            # Answered after its node went out: not to be served (see TieredStore.went_out).
            if reply is not None and reply.win:
                await release(client, wire, reply, stub)
            return await _unprotected(cache, client, key, default, timeout, version, is_async)
        if reply is not None and reply.win and stub and tier is not None:
            # memcached's miss: the disk tier's copy, if it answers, goes back under this
            # lease (as the tier's own refill would put it back) instead of a computation.
            try:
                found = await tier.answer_leased_miss(client, wire, reply.cas)
            except BaseException:
                await release(client, wire, reply, stub)
                raise
            if found is not None:
                value = cache._decode(wire, *found)
                if value is not refused:
                    return value
        if reply is not None and reply.win:
            return await _recompute(cache, client, wire, reply, stub, default, timeout, is_async)
        if reply is not None and not stub and (not reply.stale or ahead > 0):
            assert reply.value is not None
            assert reply.client_flags is not None
            value = cache._decode(wire, reply.value, reply.client_flags)
            if value is refused:
                # A value this site must not load (see the security docs): computed for
                # this caller, and left for whoever wrote it (Django's add would fail too).
                return await _call(default, is_async)
            return value
        # Another caller holds the lease: wait for its value.
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if _warnings.allow(("wait", wire)):
                logger.warning(
                    "get_or_set waited stampede_wait (%ss) for another caller to compute %r;"
                    " computing it here (not stored: the lease holder's value will be)",
                    options.stampede_wait,
                    wire.decode("utf-8", "replace"),
                )
            return await _call(default, is_async)
        await pause(min(delay, remaining))
        delay = min(delay * 2, MAX_PAUSE)


async def _recompute(
    cache: FastCache,
    client: CommandSet,
    wire: bytes,
    lease: MetaReply,
    stub: bool,
    default: Any,
    timeout: Any,
    is_async: bool,
) -> Any:
    """The lease's winner: compute, store with the lease's CAS, and on failure let go."""
    tier = cache._shared().tiered
    try:
        value = await _call(default, is_async)
        data, flags = cache._encode(value, wire)
        ttl = cache._ttl(timeout)
        if tier is not None:
            # A write by the tier's rules (stamped, then memcached, then the disk copy),
            # so that no older disk copy answers once get_or_set has returned.
            await tier.store_leased(client, wire, data, flags, ttl, lease.cas)
        else:
            await client.meta_set(
                wire, data, flags=flags, exptime=memcached_exptime(ttl, time.time()), cas=lease.cas
            )
    except BaseException:
        await release(client, wire, lease, stub)
        raise
    return value


async def release(client: CommandSet, wire: bytes, lease: MetaReply, stub: bool) -> None:
    """Give back a lease whose winner failed (or was cancelled): its stub deleted (if still
    its own), or a stale value marked stale again, so that the next caller wins at once. A
    win near expiry needs nothing: the value still serves, and expires as it would have."""
    if stub:
        await let_go(client, client.meta_delete(wire, cas=lease.cas))
    elif lease.stale:
        await let_go(client, client.meta_delete(wire, cas=lease.cas, invalidate=True))


#: Give-backs still running after their caller was cancelled (the event loop keeps only a
#: weak reference to a task).
_letting_go: set[asyncio.Future[None]] = set()


async def let_go(client: CommandSet, give_back: Coroutine[Any, Any, object]) -> None:
    """Run ``give_back``, the ``md`` that gives a lease back, to its end; memcached's errors
    are let go (the stub then expires with its lease).

    A cancellation of the caller (the one that brought it here, or another landing
    meanwhile) must not cut it short: a request cut short may never reach memcached, and
    a stub left behind reads as a miss that nobody holds the CAS to replace until it
    expires. On the asyncio client it runs as a task of its own, which the caller's
    cancellation does not reach (the caller's CancelledError is raised at once all the
    same). The blocking client's coroutines never suspend, and need no loop: in place."""
    if isinstance(client, BlockingClient):
        await _quietly(give_back)
        return
    task = asyncio.ensure_future(_quietly(give_back))
    _letting_go.add(task)
    task.add_done_callback(_letting_go.discard)
    await asyncio.shield(task)


async def _quietly(request: Coroutine[Any, Any, object]) -> None:
    with contextlib.suppress(FastCacheError):
        await request


async def _unprotected(
    cache: FastCache,
    client: CommandSet,
    key: Any,
    default: Any,
    timeout: Any,
    version: int | None,
    is_async: bool,
) -> Any:
    """Django's own get_or_set: get, compute on a miss, add, get again."""
    value = await cache._get(client, key, _MISSING, version)
    if value is not _MISSING:
        return value
    value = await _call(default, is_async)
    await cache._add(client, key, value, timeout, version)
    return await cache._get(client, key, value, version)


# -- invalidate, and the classic commands a stub must not trip up ---------------------------


async def invalidate(
    cache: FastCache,
    client: CommandSet,
    key: Any,
    version: int | None,
    stale_timeout: float | None,
) -> bool:
    """Mark the value stale (``md … I``) instead of deleting it (with the disk tier on, its
    disk copy is deleted); a plain delete where the node does not speak meta."""
    stack = cache._shared()
    wire = cache.wire_key(key, version)
    node = client.cluster.node_index(wire)
    support = meta_support(cache._options.protocol, client.cluster)
    tier = stack.tiered
    if (tier is not None and tier.states.is_out(node)) or not await support.speaks(client, node):
        return await stack.store.delete(client, wire)
    exptime = None if stale_timeout is None else memcached_exptime(stale_timeout, time.time())
    try:
        if tier is not None:
            return await tier.invalidate(client, wire, exptime)
        reply = await client.meta_delete(wire, invalidate=True, exptime=exptime)
    except MetaUnsupportedError as exc:
        support.refused(node, exc)
        return await stack.store.delete(client, wire)
    return reply.status is MetaStatus.HD


async def add_over_stub(
    cache: FastCache,
    client: CommandSet,
    wire: bytes,
    data: bytes,
    flags: int,
    ttl: float | None,
    stub_seen: bool = False,
) -> bool:
    """After memcached refused an ``add``: store anyway when what holds the key is a lease's
    stub (a missing value being computed), with the stub's CAS, so the add wins over the
    lease as a set would. False when the key holds a value. Without the disk tier only:
    the tier's own add replaces a stub, and only when the disk has no value for the key
    either (:meth:`TieredStore.add`). ``stub_seen``: the caller's own plain get found the
    stub already."""
    # A plain get first, which every node answers: the common refusal (a value holds the
    # key) costs one round trip, and no node is asked about meta for it.
    if not stub_seen and (not makes_stubs(cache._options) or not await is_stub_now(client, wire)):
        return False
    node = client.cluster.node_index(wire)
    # A stub is a lease, most likely another process's: whether this one ever ran
    # get_or_set must not decide what its add does, so the node is asked if need be.
    if not await meta_support(cache._options.protocol, client.cluster).speaks(client, node):
        return False
    reply = await client.meta_get(wire, cas=True, no_bump=True)
    if reply is None:
        return False
    if not is_stub(reply.value or b"", reply.client_flags or 0):
        if reply.win and reply.stale:
            # Reading a stale value took its win: mark it stale again for get_or_set.
            await release(client, wire, reply, False)
        return False
    exptime = memcached_exptime(ttl, time.time())
    stored = await client.meta_set(wire, data, flags=flags, exptime=exptime, cas=reply.cas)
    return stored.status is MetaStatus.HD


async def is_stub_now(client: CommandSet, wire: bytes) -> bool:
    """Whether ``wire`` holds a lease's stub (asked after memcached refused to count or add
    it), by a plain get, which every node answers."""
    item = await client.get(wire)
    return item is not None and is_stub(item.value, item.flags)


__all__ = [
    "FIRST_PAUSE",
    "MAX_PAUSE",
    "MetaSupport",
    "add_over_stub",
    "async_pause",
    "blocking_pause",
    "get_or_set",
    "invalidate",
    "is_stub",
    "is_stub_now",
    "let_go",
    "makes_stubs",
    "meta_support",
    "release",
]
