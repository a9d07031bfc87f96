"""Connections to one node, for one event loop.

A pool lends a connection to one operation at a time. It opens connections on demand up
to ``max_connections``; callers beyond that wait in FIFO order. Idle connections beyond
``min_connections`` are closed once they have been idle for ``idle_timeout`` seconds: by a
timer on the pool's loop, armed only while such connections exist, cancelled by
:meth:`Pool.close`, and inert in a forked child (it never touches the parent's sockets).

The pool also keeps the node's per-loop counters (calls, latencies, waits; see
:mod:`.metrics`) and reports request outcomes to the node's health (:mod:`.events`).
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import (
    ClientClosedError,
    ConnectFailedError,
    ConnectionLostError,
    ConnectTimeoutError,
    FastCacheError,
    LocalResourceError,
    NetworkError,
)
from .address import Address
from .connect import open_connection
from .connection import Connection
from .events import NodeHealth
from .failures import connect_error
from .metrics import ClientMetrics, Latencies, PoolStats, new_calls
from .security import Security


@dataclass(frozen=True)
class PoolSettings:
    min_connections: int = 1
    max_connections: int = 4
    idle_timeout: float = 60.0
    connect_timeout: float = 1.0
    max_value_size: int = 1024 * 1024
    #: Where the pools of one client count (None: not counted), and the node health they
    #: report request outcomes to; ``timeout`` is the client's, for latencies.
    metrics: ClientMetrics | None = None
    health: NodeHealth | None = None
    timeout: float = 1.0
    security: Security | None = None


@dataclass
class PoolMetrics:
    """Counters for one pool (one node, one event loop)."""

    connections_opened: int = 0
    connections_closed: int = 0
    connect_failures: int = 0
    waits: int = 0
    #: Waits that ended with the call's deadline, and the seconds spent waiting.
    wait_timeouts: int = 0
    wait_seconds: float = 0.0


class _WaitTimeout(ConnectTimeoutError, LocalResourceError):
    """No connection came free in time: the pool was busy, which says nothing of the node
    (and nothing was sent). A :class:`LocalResourceError` too: the disk tier answers the
    read without marking the node out for every process on the host."""


class Pool:
    def __init__(
        self,
        address: Address,
        settings: PoolSettings,
        loop: asyncio.AbstractEventLoop,
        on_connect_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.address = address
        self.settings = settings
        self.metrics = PoolMetrics()
        self._loop = loop
        self.loop = loop  # the event loop this pool's connections belong to
        self._idle: deque[Connection] = deque()
        # A waiter receives a connection, or None meaning "a slot is free: open one".
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._size = 0  # open connections plus connections being opened
        self._closed = False
        self._on_connect_failure = on_connect_failure
        # The idle purge's timer, armed while idle connections beyond the minimum exist.
        self._purge_timer: asyncio.TimerHandle | None = None
        self._pid = os.getpid()
        # Request outcomes: this loop's counters (no lock: one loop, one thread) and the
        # node's process-wide health.
        self.node = node = address.node_id
        self._timeout = settings.timeout
        self._client_metrics = metrics = settings.metrics
        self.calls = new_calls()
        self.latencies = Latencies() if metrics is not None and metrics.latency else None
        self._health = settings.health
        if metrics is not None:
            metrics.attach(node, self.calls, self.latencies, self._alive, self.stats)

    @property
    def size(self) -> int:
        return self._size

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def acquire(self, deadline: float) -> Connection:
        """A connection for one operation, by ``deadline`` (the loop's clock).

        Cancellation at any point gives back whatever the caller was about to receive: a
        connection handed over, a slot freed for it, or a connection being opened."""
        idle = self._idle
        while idle:
            connection = idle.pop()  # the most recently used: its socket is warm
            if not connection.closed:
                return connection
            self._forget()
        if self._closed:
            raise ClientClosedError("the client is closed")
        if self._size < self.settings.max_connections:
            self._size += 1
            return await self._open(deadline)
        return await self._wait(deadline)

    async def _wait(self, deadline: float) -> Connection:
        # A timer fails the waiter at the deadline. No wait_for here: on Python 3.11 it can
        # drop a result that arrives together with a cancellation, losing the connection.
        waiter: asyncio.Future[Connection | None] = self._loop.create_future()
        self._waiters.append(waiter)
        metrics = self.metrics
        metrics.waits += 1
        began = self._loop.time()
        timer = self._loop.call_at(deadline, _expire, waiter, self.address)
        try:
            connection = await waiter
        except BaseException as exc:
            metrics.wait_seconds += self._loop.time() - began
            if isinstance(exc, _WaitTimeout):
                metrics.wait_timeouts += 1
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # We were handed something while being cancelled: pass it on.
                handed = waiter.result()
                if handed is None:
                    self._slot_freed()
                else:
                    self.release(handed)
            else:
                waiter.cancel()
            raise
        finally:
            timer.cancel()
        metrics.wait_seconds += self._loop.time() - began
        if connection is None:
            return await self._open(deadline)
        return connection

    async def _open(self, deadline: float) -> Connection:
        """Open a connection for a slot already counted in ``_size``."""
        address = self.address
        loop = self._loop
        settings = self.settings

        connecting = open_connection(
            loop, address, settings.max_value_size, settings.security, settings.connect_timeout
        )
        # The connect runs as a task of its own, watched here until a timer fires. Whatever
        # stops the watch (timeout, cancellation), the task's outcome is still taken care of:
        # a connection it opens is kept or closed and the slot freed, never lost.
        task = loop.create_task(connecting)
        watch: asyncio.Future[None] = loop.create_future()
        connect_deadline = loop.time() + settings.connect_timeout
        timer = loop.call_at(min(deadline, connect_deadline), _wake, watch)
        task.add_done_callback(lambda _task: _wake(watch))
        try:
            await watch
        except BaseException:
            timer.cancel()
            if task.done():
                self._settle(task)  # opened just as we were cancelled: keep it for others
            else:
                task.cancel()
                task.add_done_callback(self._settle)
            raise
        timer.cancel()
        if not task.done():
            task.cancel()
            task.add_done_callback(self._settle)
            raise self._connect_failed(
                ConnectTimeoutError(
                    f"connecting to {address} took longer than {settings.connect_timeout}s"
                    if connect_deadline <= deadline
                    else f"no connection to {address} within the call's timeout"
                )
            )
        exc = task.exception()
        if exc is not None:
            self._slot_freed()
            if isinstance(exc, ConnectionLostError):
                # Lost while authenticating: nothing of the caller's was sent.
                raise self._connect_failed(
                    ConnectFailedError(f"connecting to {address}: {exc}")
                ) from exc
            if isinstance(exc, NetworkError):  # a refused TLS handshake or credentials
                raise self._connect_failed(exc) from None
            if isinstance(exc, OSError):
                raise self._connect_failed(connect_error(address, exc)) from exc
            raise exc
        _transport, connection = task.result()
        self.metrics.connections_opened += 1
        if self._closed:
            connection.close()
            self._slot_freed()
            raise ClientClosedError("the client is closed")
        return connection

    def _connect_failed(self, error: FastCacheError) -> FastCacheError:
        self.metrics.connect_failures += 1
        if self._on_connect_failure is not None:
            self._on_connect_failure(error)
        return error

    def _settle(self, task: asyncio.Task[tuple[asyncio.BaseTransport, Connection]]) -> None:
        """Take care of a connect nobody waits for any more: keep what it opened."""
        if task.cancelled() or task.exception() is not None:
            self._slot_freed()
            return
        _transport, connection = task.result()
        self.metrics.connections_opened += 1
        self.release(connection)

    def release(self, connection: Connection) -> None:
        """Return a connection after a completed operation."""
        if self._closed and not connection.closed:
            # In use when the pool was closed: nobody will take it from the idle list again.
            connection.close()
        if connection.closed:
            self._forget()
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        connection.last_used = self._loop.time()
        self._idle.append(connection)
        if self._purge_timer is None and self._size > self.settings.min_connections:
            self._purge()

    def _purge(self) -> None:
        """Close connections idle for ``idle_timeout`` while more than the minimum are open,
        longest-idle first; re-arm for the next one that may come due."""
        self._purge_timer = None
        if self._closed or os.getpid() != self._pid:
            # Closed, or a forked child running the parent's loop: the sockets are not ours.
            return
        idle = self._idle
        settings = self.settings
        now = self._loop.time()
        while idle and self._size > settings.min_connections:
            oldest = idle[0]
            due = oldest.last_used + settings.idle_timeout
            if due > now:
                self._purge_timer = self._loop.call_at(due, self._purge)
                return
            idle.popleft()
            oldest.close()
            self._forget()

    def discard(self, connection: Connection, error: FastCacheError) -> None:
        """Drop a connection that can no longer be trusted (timeout, cancel, bad reply)."""
        connection.abort(error)
        self.release(connection)

    def try_acquire(self) -> Connection | None:
        """An idle connection, without waiting; None when one would have to be opened."""
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
            self._forget()
        return None

    def _forget(self) -> None:
        self.metrics.connections_closed += 1
        self._slot_freed()

    def _slot_freed(self) -> None:
        self._size -= 1
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                self._size += 1
                waiter.set_result(None)
                return

    # -- outcomes of requests, for the metrics and the node's health --------------------------
    def answered(self, kind: int, deadline: float) -> None:
        """A request of ``kind`` made with ``deadline`` got its reply (an error reply too)."""
        self.calls[kind] += 1
        latencies = self.latencies
        if latencies is not None:
            latencies.observe(kind, self._loop.time() - (deadline - self._timeout))
        health = self._health
        if health is not None and health.unhealthy:
            health.answered(self.node)

    def failed(self, kind: int, error: BaseException, replied: bool = False) -> None:
        """A request of ``kind`` failed with ``error``; ``replied``: the error is the
        server's reply, already counted by :meth:`answered`."""
        if not replied:
            self.calls[kind] += 1
        if self._client_metrics is not None:
            self._client_metrics.failed(self.node, kind, error)
        if self._health is not None and not replied and not isinstance(error, _WaitTimeout):
            self._health.failed(self.node, error)

    def stats(self) -> PoolStats:
        metrics = self.metrics
        idle = len(self._idle)
        return PoolStats(
            open=self._size,
            idle=idle,
            in_use=self._size - idle,
            opened=metrics.connections_opened,
            closed=metrics.connections_closed,
            connect_failures=metrics.connect_failures,
            waits=metrics.waits,
            wait_timeouts=metrics.wait_timeouts,
            wait_seconds=metrics.wait_seconds,
        )

    def _alive(self) -> bool:
        return not self._closed and not self._loop.is_closed()

    def release_closed_loop(self) -> None:
        """Let go of a pool whose event loop has closed: its idle connections are ended
        now, not left open to the garbage collector. A loop per call, as Django gives an
        async view under WSGI, would otherwise leave a connection per request open on
        memcached until a collection. (No waiter is left: none waits on a closed loop.)"""
        self._shut(Connection.end_after_loop_closed)

    def close(self) -> None:
        self._shut(Connection.close)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ClientClosedError("the client is closed"))

    def _shut(self, end: Callable[[Connection], None]) -> None:
        """Take no more calls, and ``end`` each idle connection."""
        if self._purge_timer is not None:
            self._purge_timer.cancel()
            self._purge_timer = None
        self._closed = True
        if self._client_metrics is not None:
            self._client_metrics.detach(self.calls)
        while self._idle:
            end(self._idle.pop())
            self._size -= 1


def _wake(watch: asyncio.Future[None]) -> None:
    if not watch.done():
        watch.set_result(None)


def _expire(waiter: asyncio.Future[Connection | None], address: Address) -> None:
    if not waiter.done():
        waiter.set_exception(
            _WaitTimeout(
                f"no connection to {address} came free in time: every one of this process's "
                "connections to it was busy (the node may be fine); raise max_connections, "
                "or make fewer calls at once"
            )
        )
