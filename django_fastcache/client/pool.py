"""Connections to one node, for one event loop.

A pool lends a connection to one operation at a time. It opens connections on demand up
to ``max_connections``; callers beyond that wait in FIFO order. Idle connections beyond
``min_connections`` are closed once they have been idle for ``idle_timeout`` seconds; the
check runs when connections are returned, so no timer outlives the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ClientClosedError, FastCacheError, NetworkError, OperationTimeoutError
from .address import Address
from .connect import open_connection
from .connection import Connection
from .failures import connect_error
from .security import Security


@dataclass(frozen=True)
class PoolSettings:
    min_connections: int = 1
    max_connections: int = 4
    idle_timeout: float = 60.0
    connect_timeout: float = 1.0
    max_value_size: int = 1024 * 1024
    security: Security | None = None


@dataclass
class PoolMetrics:
    """Counters for one pool (one node, one event loop)."""

    connections_opened: int = 0
    connections_closed: int = 0
    connect_failures: int = 0
    waits: int = 0


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
        self.metrics.waits += 1
        timer = self._loop.call_at(deadline, _expire, waiter, self.address)
        try:
            connection = await waiter
        except BaseException:
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
                OperationTimeoutError(
                    f"connecting to {address} took longer than {settings.connect_timeout}s"
                    if connect_deadline <= deadline
                    else f"no connection to {address} within the call's timeout"
                )
            )
        exc = task.exception()
        if exc is not None:
            self._slot_freed()
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
        now = time.monotonic()
        connection.last_used = now
        self._idle.append(connection)
        # Let go of the longest-idle connection when it has sat unused for too long.
        oldest = self._idle[0]
        if (
            now - oldest.last_used > self.settings.idle_timeout
            and self._size > self.settings.min_connections
        ):
            self._idle.popleft()
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

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
            self._size -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ClientClosedError("the client is closed"))


def _wake(watch: asyncio.Future[None]) -> None:
    if not watch.done():
        watch.set_result(None)


def _expire(waiter: asyncio.Future[Connection | None], address: Address) -> None:
    if not waiter.done():
        waiter.set_exception(OperationTimeoutError(f"no connection to {address} in time"))
