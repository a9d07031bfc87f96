"""The public asyncio memcached client.

One :class:`Client` serves every event loop of the process: the cluster view (nodes,
hashing, counters) is shared and thread-safe, while connection pools belong to one event
loop each, created the first time a loop uses the client. That lets a synchronous caller
drive the client on its own thread's loop (see :mod:`django_fastcache.bridge`) and an
ASGI application await it on its server's loop, with no thread hop on either path.

Every operation is bounded by ``timeout``: a request whose reply is late, or whose caller
is cancelled, discards its connection, so a late reply is never read as another
request's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import CommandError, ConnectionLostError, FastCacheError
from ..protocol import Item, ReplyKind, Status, get_command, validate_key
from . import forksafe
from .address import Address
from .batching import GetBatcher, Round  # at import: a first get must not need a file (see Lane)
from .cluster import ClientSettings, Cluster, check_setting_types
from .commands import CommandSet, Expected, Meanwhile, Replies, Requests
from .connection import Connection, WriteReply
from .events import NodeEventCallback, NodeHealth
from .metrics import ClientMetrics, MetricsSnapshot
from .pipelining import UNLIMITED, Lane
from .pool import Pool, PoolSettings
from .security import SSLOption, make_security


class Client(CommandSet):
    """An asyncio memcached client over one or more nodes.

    ``servers`` are addresses (``"host:port"``, ``"[::1]:11211"``, ``"unix:/path"``);
    keys are routed to nodes by rendezvous hashing. Keys and values are ``bytes``. The
    commands are those of :class:`~django_fastcache.client.commands.CommandSet`.
    ``meta=False`` sends no meta command (see :class:`.ClientSettings`).
    """

    def __init__(
        self,
        servers: Sequence[str | Address],
        *,
        timeout: float = 1.0,
        connect_timeout: float = 1.0,
        min_connections: int = 1,
        max_connections: int = 4,
        idle_timeout: float = 60.0,
        max_value_size: int = 1024 * 1024,
        latency_metrics: bool = False,
        autobatching: bool = True,
        pipelining: bool = True,
        ssl: SSLOption = None,
        username: str | None = None,
        password: str | None = None,
        placement: str = "rendezvous",
        autodiscovery: bool = False,
        autodiscovery_interval: float = 60.0,
        meta: bool = True,
    ) -> None:
        # Checked here too, not only by ClientSettings: compiled, it refuses a wrong type
        # with a bare TypeError of its own, and takes a bool for a count.
        check_setting_types(
            {
                "timeout": timeout,
                "connect_timeout": connect_timeout,
                "min_connections": min_connections,
                "max_connections": max_connections,
                "idle_timeout": idle_timeout,
                "max_value_size": max_value_size,
                "latency_metrics": latency_metrics,
                "autobatching": autobatching,
                "pipelining": pipelining,
                "autodiscovery": autodiscovery,
                "autodiscovery_interval": autodiscovery_interval,
                "meta": meta,
            }
        )
        security = make_security(ssl, username, password)
        settings = ClientSettings(
            timeout=timeout,
            connect_timeout=connect_timeout,
            min_connections=min_connections,
            max_connections=max_connections,
            idle_timeout=idle_timeout,
            max_value_size=max_value_size,
            security=security,
            placement=placement,
            autodiscovery=autodiscovery,
            autodiscovery_interval=autodiscovery_interval,
            meta=meta,
        )
        self.cluster = Cluster(servers, settings)
        self.timeout = settings.timeout
        #: The nodes' health as this process's requests find it (see :mod:`.events`).
        self.health = NodeHealth()
        # Latency histograms cost a clock read and a bucket per call: asked for, not default.
        self._metrics = ClientMetrics("async", self.cluster, latency=latency_metrics)
        self._pool_settings = PoolSettings(
            metrics=self._metrics,
            health=self.health,
            timeout=settings.timeout,
            min_connections=min_connections,
            max_connections=max_connections,
            idle_timeout=idle_timeout,
            connect_timeout=connect_timeout,
            max_value_size=max_value_size,
            security=security,
        )
        self._pools_by_loop: dict[asyncio.AbstractEventLoop, list[Pool]] = {}
        #: Whether concurrent single-key gets of one loop iteration share a request.
        self.autobatching = autobatching
        #: Whether concurrent requests for one node share connections (see pipelining.py)
        #: rather than each waiting for a connection of its own.
        self.pipelining = pipelining
        # Per event loop, per node: the pool, its shared connections and the batchers.
        self._lanes_by_loop: dict[asyncio.AbstractEventLoop, list[Lane]] = {}
        # The placement whose answers are remembered, and those answers (see _node_of),
        # and the same for keys checked too (see _checked_node_of).
        self._placement_memo: tuple[object, dict[bytes, int]] = (None, {})
        self._checked_memo: tuple[object, dict[bytes, int]] = (None, {})
        self._lock = threading.Lock()
        forksafe.register(self)
        if self.cluster.dynamic:  # autodiscovery: pools follow the node list
            self.cluster.add_listener(self._nodes_added, self._nodes_removed)

    @property
    def addresses(self) -> tuple[Address, ...]:
        return self.cluster.addresses

    # -- pools, one list per event loop ------------------------------------------------
    def _pools(self) -> list[Pool]:
        loop = asyncio.get_running_loop()
        pools = self._pools_by_loop.get(loop)
        if pools is None:
            pools = self._create_pools(loop)
        return pools

    def _create_pools(self, loop: asyncio.AbstractEventLoop) -> list[Pool]:
        with self._lock:
            pools = self._pools_by_loop.get(loop)
            if pools is None:
                # A closed loop never runs again: let its pools go, and their connections,
                # those its pipelined requests held too (a retrieval cancelled with its
                # reply still due keeps its connection from going back to the pool).
                for old_loop in [lp for lp in self._pools_by_loop if lp.is_closed()]:
                    held = [lane.shared for lane in self._lanes_by_loop.pop(old_loop, ())]
                    for pool in self._pools_by_loop.pop(old_loop):
                        _quietly(pool.release_closed_loop)
                    for shared in held:
                        _quietly(shared.end_after_loop_closed)
                pools = [Pool(a, self._pool_settings, loop) for a in self.cluster.addresses]
                self._pools_by_loop[loop] = pools
        if self.cluster.discovery is not None:
            self.cluster.discovery.start()  # again, after an aclose()
        return pools

    # -- autodiscovery: the node list changed (called from the refresher thread) ---------
    def _nodes_added(self, slots: tuple[int, ...]) -> None:
        """Pools for nodes that joined (or came back), before keys are routed to them."""
        addresses = self.cluster.addresses
        with self._lock:
            for loop, pools in self._pools_by_loop.items():
                while len(pools) < len(addresses):
                    pools.append(Pool(addresses[len(pools)], self._pool_settings, loop))
                for slot in slots:  # a node that comes back: its old pool was closed
                    pools[slot] = Pool(addresses[slot], self._pool_settings, loop)
            # The loops' lanes go with their pools: built afresh on next use.
            self._lanes_by_loop.clear()

    def _nodes_removed(self, slots: tuple[int, ...]) -> None:
        """Close the pools of nodes that left, on their own loops."""
        with self._lock:
            for loop, pools in self._pools_by_loop.items():
                if not loop.is_closed():
                    for slot in slots:
                        loop.call_soon_threadsafe(pools[slot].close)

    def _lanes(self) -> list[Lane]:
        """The running loop's way to each node (pool, shared connections, batchers)."""
        lanes = self._lanes_by_loop.get(asyncio.get_running_loop())
        if lanes is None:
            lanes = self._create_lanes()
        return lanes

    def _create_lanes(self) -> list[Lane]:
        pools = self._pools()
        round = Round(pools[0].loop)  # every node's batches go in rounds together
        lanes = [Lane(pool, round) for pool in pools]
        with self._lock:
            for old_loop in [lp for lp in self._lanes_by_loop if lp.is_closed()]:
                del self._lanes_by_loop[old_loop]
            return self._lanes_by_loop.setdefault(pools[0].loop, lanes)

    def _node_of(self, key: bytes) -> int:
        """``key``'s node, remembered: over several nodes, placement hashes the key once
        per node, which costs more than the rest of a batched get."""
        cluster = self.cluster
        if cluster.single_node:
            return cluster.node_index(key)
        placement = cluster.placement
        memo = self._placement_memo
        if memo[0] is not placement:  # the node list changed: placement is new
            memo = self._placement_memo = (placement, {})
        nodes = memo[1]
        node = nodes.get(key)
        if node is None:
            node = placement.node_index(key)
            if len(nodes) >= _PLACEMENT_MEMO_SIZE:
                nodes.clear()
            nodes[key] = node
        return node

    def _checked_node_of(self, key: bytes) -> int:
        """``key``'s node, once ``key`` is checked: a key remembered here was checked when
        it was first seen, so a key asked for again costs one dict lookup (validation and
        placement together cost several times that)."""
        placement = self.cluster.placement
        memo = self._checked_memo
        if memo[0] is not placement:  # the node list changed: placement is new
            memo = self._checked_memo = (placement, {})
        nodes = memo[1]
        # Only exact bytes are remembered: anything else (a str, an unhashable object)
        # goes to validate_key, which says what is wrong with it.
        node = nodes.get(key) if key.__class__ is bytes else None
        if node is None:
            validate_key(key)  # before hashing: a str key must not reach the hash
            node = self.cluster.node_index(key)
            if key.__class__ is bytes:
                if len(nodes) >= _PLACEMENT_MEMO_SIZE:
                    nodes.clear()
                nodes[key] = node
        return node

    # -- autobatched retrieval ------------------------------------------------------------
    async def get(self, key: bytes) -> Item | None:
        """The item (``value``, ``flags``) stored under ``key``, or None.

        With autobatching, the gets of one loop iteration for one node share a request."""
        if not self.autobatching:
            keys = (key,)
            data = get_command(keys)  # validates the key before it is hashed
            items = await self._request(self._node_of(key), data, _RETRIEVAL, None, keys)
            return items[0] if items else None
        # _checked_node_of's commonest case, inline: a key seen before, same node list
        # (the placement read as the attribute behind Cluster.placement: a property costs
        # a call per get).
        memo = self._checked_memo
        node = memo[1].get(key) if key.__class__ is bytes else None
        if node is None or memo[0] is not self.cluster._hashing:
            node = self._checked_node_of(key)
        lanes = self._lanes_by_loop.get(_running_loop())
        if lanes is None:
            lanes = self._create_lanes()
        batcher: GetBatcher = lanes[node].get
        future = batcher.submit(key, self.timeout)
        batch = batcher.current
        try:
            return await future
        except asyncio.CancelledError:
            batch.cancelled()  # type: ignore[union-attr]  # submit() set it
            raise

    async def gets(self, key: bytes) -> Item | None:
        """Like :meth:`get`, with the item's CAS token in ``item.cas``."""
        if not self.autobatching:
            keys = (key,)
            data = get_command(keys, cas=True)
            items = await self._request(self._node_of(key), data, _RETRIEVAL, None, keys)
            return items[0] if items else None
        node = self._checked_node_of(key)
        lanes = self._lanes_by_loop.get(asyncio.get_running_loop())
        if lanes is None:
            lanes = self._create_lanes()
        batcher: GetBatcher = lanes[node].gets
        future = batcher.submit(key, self.timeout)
        batch = batcher.current
        try:
            return await future
        except asyncio.CancelledError:
            batch.cancelled()  # type: ignore[union-attr]  # submit() set it
            raise

    def _forget_after_fork(self) -> object:
        """In a forked child: drop (and hand back) the parent's pools without touching them."""
        inherited = (self._pools_by_loop, self._lanes_by_loop)
        self._pools_by_loop = {}
        self._lanes_by_loop = {}
        self._lock = threading.Lock()
        return inherited

    # -- the I/O primitives ------------------------------------------------------------
    async def _acquire(self, pool: Pool, deadline: float) -> Connection:
        connection = pool.try_acquire()
        if connection is not None:
            return connection
        # The pool bounds the wait itself and gives back whatever a cancellation interrupts.
        return await pool.acquire(deadline)

    async def _request(
        self,
        node: int,
        data: bytes,
        kind: ReplyKind,
        meanwhile: Meanwhile = None,
        keys: Sequence[bytes] | None = None,
    ) -> Any:
        if meanwhile is None and self.pipelining:
            return await self._pipelined(node, data, kind, keys)
        pool = self._pools()[node]
        # One budget for the whole call: waiting for a connection uses it up too.
        deadline = pool.loop.time() + self.timeout
        try:
            connection = await self._acquire(pool, deadline)
        except FastCacheError as exc:
            pool.failed(kind, exc)
            raise
        try:
            future = connection.request(data, kind, deadline, keys)
        except FastCacheError:
            pool.release(connection)
            raise
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                pool.discard(connection, ConnectionLostError("request abandoned"))
                raise
        try:
            reply = await future
        except asyncio.CancelledError:
            if future.cancelled():  # a retrieval's: its reply, still due, would be misread
                pool.discard(connection, ConnectionLostError("request cancelled"))
            else:  # a write's, cancelled once it was answered (WriteReply): in step
                pool.release(connection)  # (or aborted already: the pool lets it go)
                _failure_seen(pool, kind, future)
            raise
        except BaseException as exc:
            pool.release(connection)  # aborted already: the pool lets it go
            pool.failed(kind, exc)
            raise
        pool.release(connection)
        pool.answered(kind, deadline)
        if isinstance(reply, CommandError):
            pool.failed(kind, reply, replied=True)
            raise reply
        return reply

    async def _pipelined(
        self, node: int, data: bytes, kind: ReplyKind, keys: Sequence[bytes] | None
    ) -> Any:
        """One request on a connection it may share with other callers' requests."""
        lane = self._lanes()[node]
        pool = lane.pool
        deadline = pool.loop.time() + self.timeout
        shared = lane.shared
        connection = shared.pick()
        while connection is None:
            connection = pool.try_acquire()
            if connection is not None:
                shared.share(connection)
                break
            if pool.size >= pool.settings.max_connections:
                # No room for another connection: go deeper on a shared one, if any.
                connection = shared.pick(UNLIMITED)
                if connection is not None:
                    break
            opening = shared.opening
            if opening is not None:
                # Another caller is getting a connection: wait for it, then look again.
                # Its deadline comes before ours (it started first), so this is bounded.
                await asyncio.shield(opening)
                connection = shared.pick()
                continue
            opening = shared.opening = pool.loop.create_future()
            try:
                connection = await pool.acquire(deadline)
            except FastCacheError as exc:
                pool.failed(kind, exc)
                raise
            finally:
                shared.opening = None
                opening.set_result(None)
            shared.share(connection)
        try:
            future = connection.request_soon(data, kind, deadline, keys)
        except FastCacheError:
            if connection.on_drained is not None and not connection.in_flight:
                connection.on_drained(connection)  # nothing will drain it: give it back
            raise
        # A cancelled retrieval just stops waiting: its reply is read (and dropped) in
        # turn. A cancelled write waits for its reply first (WriteReply).
        try:
            reply = await future
        except asyncio.CancelledError:
            _failure_seen(pool, kind, future)
            raise
        except BaseException as exc:
            pool.failed(kind, exc)
            raise
        pool.answered(kind, deadline)
        if isinstance(reply, CommandError):
            pool.failed(kind, reply, replied=True)
            raise reply
        return reply

    async def _pipeline(
        self,
        pool: Pool,
        data: bytes,
        kinds: list[ReplyKind],
        expected: list[Sequence[bytes] | None] | None,
    ) -> list[Any]:
        deadline = pool.loop.time() + self.timeout
        try:
            connection = await self._acquire(pool, deadline)
        except FastCacheError as exc:
            pool.failed(kinds[0], exc)
            raise
        try:
            futures = connection.request_many(data, kinds, deadline, expected)
        except FastCacheError:
            pool.release(connection)
            raise
        try:
            replies = [await future for future in futures]
        except asyncio.CancelledError:
            await _writes_answered(futures)  # before the connection is reset under them
            pool.discard(connection, ConnectionLostError("request cancelled"))
            _consume(futures)
            raise
        except BaseException as exc:
            pool.release(connection)
            _consume(futures)
            pool.failed(kinds[0], exc)
            raise
        pool.release(connection)
        pool.answered(kinds[0], deadline)
        return replies

    async def _pipelines(self, requests: Requests, expected: Expected | None = None) -> Replies:
        pools = self._pools()
        if len(requests) == 1:
            # One node (a single-node cluster's every multi-key call): awaited here, without
            # the task asyncio.gather would make for it (a quarter of a one-node aget_many's CPU).
            for node, (data, kinds) in requests.items():
                keys = None if expected is None else expected[node]
                try:
                    return {node: await self._pipeline(pools[node], data, kinds, keys)}
                except FastCacheError as exc:
                    return {node: exc}
        nodes = list(requests)
        outcomes = await asyncio.gather(
            *[
                self._pipeline(pools[n], *requests[n], None if expected is None else expected[n])
                for n in nodes
            ],
            return_exceptions=True,
        )
        results: Replies = {}
        for node, outcome in zip(nodes, outcomes):
            if isinstance(outcome, FastCacheError):
                results[node] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results[node] = outcome
        return results

    async def _send_noreply(self, node: int, data: bytes) -> None:
        pool = self._pools()[node]
        connection = await self._acquire(pool, pool.loop.time() + self.timeout)
        try:
            connection.send_noreply(data)
        finally:
            pool.release(connection)

    # -- lifecycle -----------------------------------------------------------------------
    def pool_metrics(self) -> dict[str, dict[str, int]]:
        """Connection counters per node, summed over the event loops that used the client."""
        totals: dict[str, dict[str, int]] = {}
        with self._lock:
            pool_lists = list(self._pools_by_loop.values())
        for pools in pool_lists:
            for pool in pools:
                entry = totals.setdefault(
                    pool.address.node_id,
                    dict.fromkeys(
                        ("open", "idle", "opened", "closed", "connect_failures", "waits"), 0
                    ),
                )
                entry["open"] += pool.size
                entry["idle"] += pool.idle
                entry["opened"] += pool.metrics.connections_opened
                entry["closed"] += pool.metrics.connections_closed
                entry["connect_failures"] += pool.metrics.connect_failures
                entry["waits"] += pool.metrics.waits
        return totals

    def metrics(self) -> MetricsSnapshot:
        """Per node: calls, errors, timeouts and latency per operation, the pools (summed
        over the event loops that used the client) and health. See docs/metrics.md."""
        return self._metrics.snapshot(self.health.healthy)

    def on_node_event(self, callback: NodeEventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` (a :class:`~.events.NodeEvent`) whenever a node turns
        unhealthy or healthy again; returns a function that unsubscribes."""
        return self.health.subscribe(callback)

    async def aclose(self) -> None:
        """Close the running event loop's connections to every node."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pools = self._pools_by_loop.pop(loop, [])
            # Gets already submitted still flush, into the closed pools: they fail at once.
            self._lanes_by_loop.pop(loop, None)
        for pool in pools:
            pool.close()
        if self.cluster.discovery is not None:
            self.cluster.discovery.close()
        await asyncio.sleep(0)  # one turn for the transports to finish closing


_RETRIEVAL = ReplyKind.RETRIEVAL
_running_loop = asyncio.get_running_loop
#: Keys whose node is remembered, at most (then forgotten all at once).
_PLACEMENT_MEMO_SIZE = 16384


async def _writes_answered(futures: list[asyncio.Future[Any]]) -> None:
    """Wait, through further cancellations, until each write among ``futures`` is answered
    or failed (see :class:`WriteReply`; each one's deadline bounds the wait)."""
    for future in futures:
        while isinstance(future, WriteReply) and not future.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await future


def _quietly(release: Callable[[], None]) -> None:
    """Let go of a closed loop's connections; a failure there must not fail the call that
    opens the new loop's pools, nor stop the others' release."""
    with contextlib.suppress(Exception):
        release()


def _failure_seen(pool: Pool, kind: ReplyKind, future: asyncio.Future[Any]) -> None:
    """A write whose caller was cancelled once it failed (a timeout, a lost connection):
    the node's health and metrics count the failure as if the caller had seen it."""
    if future.done() and not future.cancelled():
        error = future.exception()
        if error is not None:
            pool.failed(kind, error)


def _consume(futures: list[asyncio.Future[Any]]) -> None:
    """Mark the errors of abandoned futures as seen (they were all failed together)."""
    for future in futures:
        if future.done() and not future.cancelled():
            future.exception()


__all__ = ["Client", "Item", "Status"]
