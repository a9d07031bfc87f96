"""Pipelining: concurrent requests for one node share connections instead of queueing for one.

memcached answers a connection's requests in the order it got them, so requests of many
callers can be in flight on one connection at once, each matched to its reply by position
(the connection's FIFO). :class:`SharedConnections` keeps, per pool, the connections lent to
such requests: a request joins the least busy of them (up to ``PIPELINE_DEPTH`` in flight),
takes an idle connection from the pool, or has the pool open (or wait for) one. The requests
made on one connection in one turn of the loop go out in one write, so many callers cost one
send and, usually, one receive. A connection goes back to the pool as soon as nothing is
pending on it.

A retrieval cancelled while its request is in flight stops waiting; its reply is still
read (and dropped) in its turn, so the others' replies stay in step. A write's caller is
cancelled only once its reply is in (:class:`~.connection.WriteReply`), so that it cannot
land after a later write sent on another connection. A reply that does not come
by the oldest request's deadline fails every request on the connection, which is dropped.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from .connection import Connection
from .pool import Pool

if TYPE_CHECKING:
    from .batching import Round

#: Requests in flight on one connection before another connection is preferred.
PIPELINE_DEPTH = 16
#: No limit: when the pool cannot give one more connection at once, any shared one does.
UNLIMITED = sys.maxsize


class SharedConnections:
    """The connections of one pool lent to pipelined requests."""

    __slots__ = ("_connections", "_pool", "opening")

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._connections: list[Connection] = []
        #: Set while a caller gets one more connection from the pool for the others: they
        #: wait for it rather than queue in the pool one by one.
        self.opening: asyncio.Future[None] | None = None

    def pick(self, depth: int = PIPELINE_DEPTH) -> Connection | None:
        """The least busy shared connection with fewer than ``depth`` requests in flight,
        else None."""
        best: Connection | None = None
        fewest = depth
        for connection in self._connections:
            in_flight = connection.in_flight
            if in_flight < fewest and not connection.closed:
                best, fewest = connection, in_flight
        return best

    def share(self, connection: Connection) -> None:
        """A connection just taken from the pool starts taking pipelined requests."""
        connection.on_drained = self._drained
        self._connections.append(connection)

    def end_after_loop_closed(self) -> None:
        """The loop these connections served has closed with requests still in flight on
        them (cancelled retrievals, whose replies never came): end them."""
        connections, self._connections = self._connections, []
        for connection in connections:
            connection.on_drained = None
            connection.end_after_loop_closed()

    def _drained(self, connection: Connection) -> None:
        connection.on_drained = None
        self._connections.remove(connection)
        self._pool.release(connection)  # a broken one is forgotten by the pool


class Lane:
    """What one event loop uses to reach one node: its pool, the pool's connections shared
    by pipelined requests, and the autobatchers of ``get`` and ``gets``."""

    __slots__ = ("get", "gets", "pool", "shared")

    def __init__(self, pool: Pool, round: Round | None = None) -> None:
        # Late (batching imports this module); client.py imports it at start, so that a
        # first get needs no file (an import may fail once descriptors run out).
        from .batching import GetBatcher, Round

        if round is None:
            round = Round(pool.loop)

        self.pool = pool
        self.shared = SharedConnections(pool)
        self.get = GetBatcher(pool, round=round)
        self.gets = GetBatcher(pool, cas=True, round=round)
