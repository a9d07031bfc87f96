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

from ..errors import ClientClosedError, ConnectFailedError, FastCacheError, OperationTimeoutError
from .address import Address
from .connection import Connection


@dataclass(frozen=True)
class PoolSettings:
    min_connections: int = 1
    max_connections: int = 4
    idle_timeout: float = 60.0
    connect_timeout: float = 1.0
    max_value_size: int = 1024 * 1024


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

    async def acquire(self) -> Connection:
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
            return await self._open()
        return await self._wait()

    async def _wait(self) -> Connection:
        waiter: asyncio.Future[Connection | None] = self._loop.create_future()
        self._waiters.append(waiter)
        self.metrics.waits += 1
        try:
            connection = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # We were handed something while being cancelled: pass it on.
                handed = waiter.result()
                if handed is None:
                    self._slot_freed()
                else:
                    self.release(handed)
            else:
                waiter.cancel()
            raise
        if connection is None:
            return await self._open()
        return connection

    async def _open(self) -> Connection:
        """Open a connection for a slot already counted in ``_size``."""
        address = self.address
        loop = self._loop
        settings = self.settings

        def factory() -> Connection:
            return Connection(loop, settings.max_value_size, address)

        if address.path is not None:
            connecting = loop.create_unix_connection(factory, address.path)
        else:
            assert address.host is not None
            assert address.port is not None
            connecting = loop.create_connection(factory, address.host, address.port)
        try:
            _transport, connection = await asyncio.wait_for(connecting, settings.connect_timeout)
        except BaseException as exc:
            self._slot_freed()
            self.metrics.connect_failures += 1
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                error: FastCacheError = OperationTimeoutError(
                    f"connecting to {address} took longer than {settings.connect_timeout}s"
                )
            elif isinstance(exc, OSError):
                error = ConnectFailedError(f"cannot connect to {address}: {exc}")
            else:
                raise
            if self._on_connect_failure is not None:
                self._on_connect_failure(error)
            raise error from exc
        self.metrics.connections_opened += 1
        if self._closed:
            connection.close()
            self._slot_freed()
            raise ClientClosedError("the client is closed")
        return connection

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
