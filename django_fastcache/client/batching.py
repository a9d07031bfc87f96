"""Autobatching: the single-key gets of one event-loop iteration go to their node as one request.

Callers that ask for keys concurrently (many tasks, each awaiting ``client.get(key)``) all
submit within the same turn of the loop. A :class:`GetBatcher` (one per node, event loop and
verb) collects those keys, and a callback scheduled for the next turn sends them as
``get k1 k2 …`` lines (up to ``MULTI_GET_CHUNK`` keys each, pipelined in one write) on one
connection of the node's pool. Each caller awaits its own future, which the reply resolves.

While one batch of a node is in flight (``BATCHES_IN_FLIGHT``), the gets of later turns are
held and go as one batch once its reply is read (or it fails), after the callers it answered
have had their turn to ask again. Without the hold, callers spread over several nodes drift
apart: each node's reply wakes a few of them, and each turn sends a few small requests to
every node (a mean of 4.6 keys per request with 32 tasks over 4 nodes, against 6.1 with it);
each request costs a send and a receive on both sides. A lone caller is never held: with
nothing in flight its get goes at the next turn, as before. Over several nodes the same
holds for the loop's batches together (a :class:`Round`): a node with nothing in flight
waits, at most ``HOLD_LIMIT``, for the other nodes' batches in flight, so that the callers
they answer ask again in one turn (8 keys per request with 32 tasks over 4 nodes, not 6).

What each caller sees is what a lone ``get`` would give it:

- a key asked for twice is sent once, and both callers get its item;
- an error reply (``SERVER_ERROR`` …) raises in every caller whose key was in that line,
  and the connection, still in step, goes back to the pool;
- a dropped, broken or late connection fails every caller of the batch with the
  connection's error (the connection's watchdog fires at the batch's deadline, which is the
  earliest of its callers' deadlines, so nobody waits past their own timeout);
- a cancelled caller just stops waiting: the reply is still read in full and handed to the
  others, so the connection stays in step and is reused. Once every caller of a batch in
  flight is cancelled, nobody needs its reply: the connection is discarded, as a lone
  request's would be, and its pool slot freed at once (a batch still waiting for a
  connection stops waiting). It stops counting in flight then, so the next get is not
  held behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..errors import CommandError, ConnectionLostError, FastCacheError
from ..protocol import Item, ReplyKind
from .connection import Connection
from .pool import Pool

#: Keys per ``get`` line (the lines of a batch are pipelined in one write).
BATCH_CHUNK = 100
#: Batches of one batcher sent and not answered yet, at most: further gets wait for a reply.
BATCHES_IN_FLIGHT = 1
#: Seconds a round of batches in flight holds a new batch for another node, at most (the
#: loop's timers count whole milliseconds).
HOLD_LIMIT = 0.001

_RETRIEVAL = ReplyKind.RETRIEVAL
_CRLF = b"\r\n"


class Round:
    """The batches that one event loop's batchers (every node's) have in flight together.

    While a round is in flight, a new batch for a node with nothing in flight waits for
    the round to end too, so the callers the round answers ask again in one turn and each
    node's next batch carries a whole round's keys. Without it the nodes' replies, coming
    one by one, each wake a few callers whose gets go at once in small batches (4 nodes
    took 5.5 batches per 32 gets instead of 4), and a batch costs a send and a receive on
    both sides whatever its size.

    A round holds nobody past ``HOLD_LIMIT``: then it ends as it is (a node that is slow,
    or gone, keeps only its own next batch waiting) and the next batches start a new one.
    """

    __slots__ = ("_held", "_loop", "_timer", "generation", "in_flight")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: Batches of the current round in flight.
        self.in_flight = 0
        #: The round's number: it advances when a round ends, or is ended early (then the
        #: ends of its batches still in flight no longer count).
        self.generation = 0
        self._held: list[GetBatcher] = []
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, batcher: GetBatcher) -> None:
        """``batcher``'s batch goes when the round ends."""
        held = self._held
        if not held:
            self._timer = self._loop.call_later(HOLD_LIMIT, self._overdue, self.generation)
        held.append(batcher)

    def ended(self, generation: int) -> None:
        """A batch of round ``generation`` was answered (or failed, or abandoned)."""
        if generation != self.generation:
            return  # a batch of a round that ended early
        self.in_flight -= 1
        if not self.in_flight:
            self.generation += 1
            if self._held:
                self._loop.call_soon(self._release)

    def _overdue(self, generation: int) -> None:
        # Due by the clock, but a busy loop may not have read the replies that came in
        # time: decide after its next read of the sockets (two callbacks later).
        self._timer = None
        self._loop.call_soon(self._loop.call_soon, self._expire, generation)

    def _expire(self, generation: int) -> None:
        if generation != self.generation:
            return  # the round ended meanwhile
        self.generation += 1
        self.in_flight = 0
        self._release()

    def _release(self) -> None:
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
        held, self._held = self._held, []
        for batcher in held:
            batcher.round_ended()


class GetBatcher:
    """Collects one node's single-key gets (or gets with CAS) for one event loop."""

    __slots__ = (
        "_held",
        "_in_flight",
        "_limit",
        "_loop",
        "_pool",
        "_round",
        "_tasks",
        "_verb",
        "current",
    )

    def __init__(
        self,
        pool: Pool,
        *,
        cas: bool = False,
        in_flight: int = BATCHES_IN_FLIGHT,
        round: Round | None = None,
    ) -> None:
        self._pool = pool
        self._round = round if round is not None else Round(pool.loop)
        self._limit = in_flight
        # Batches sent (or waiting for a connection) and not answered yet.
        self._in_flight = 0
        # Whether :attr:`current` waits for a batch in flight to be answered before it goes.
        self._held = False
        self._loop = pool.loop
        self._verb = b"gets " if cas else b"get "
        #: The batch the keys submitted in this turn of the loop join (None: no flush is
        #: scheduled yet).
        self.current: Batch | None = None
        # Batches waiting for a connection (held here so they are not garbage collected).
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, key: bytes, timeout: float) -> asyncio.Future[Item | None]:
        """A future for ``key``'s item (or None), in :attr:`current`, due within
        ``timeout`` seconds. ``key`` must have been validated."""
        batch = self.current
        if batch is None:
            loop = self._loop
            # The first caller of the batch sets its deadline: later callers of the same
            # turn have later deadlines of their own, so none waits past its timeout.
            batch = self.current = Batch(self, loop.time() + timeout)
            if self._in_flight >= self._limit:
                self._held = True  # sent once a batch in flight is answered
            elif self._round.in_flight:
                self._held = True  # sent once the round in flight ends
                self._round.hold(self)
            else:
                loop.call_soon(self._flush)
        future: asyncio.Future[Item | None] = self._loop.create_future()
        batch.keys.append(key)
        batch.futures.append(future)
        return future

    def _flush(self) -> None:
        batch = self.current
        assert batch is not None
        self.current = None
        if batch.abandoned():
            return  # every caller was cancelled before anything was sent
        self._in_flight += 1
        batch.counted = True
        round = self._round
        round.in_flight += 1
        batch.generation = round.generation
        connection = self._pool.try_acquire()
        if connection is not None:
            batch.send(connection, self._verb)
            return
        task = batch.acquiring = self._loop.create_task(self._acquire_and_send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _acquire_and_send(self, batch: Batch) -> None:
        pool = self._pool
        try:
            # The pool bounds the wait by the deadline and loses no slot to a cancellation.
            connection = await pool.acquire(batch.deadline)
        except asyncio.CancelledError:
            for future in batch.futures:
                future.cancel()
            self.finished(batch)
            raise
        except Exception as exc:
            pool.failed(_RETRIEVAL, exc)
            _fail(batch.futures, exc)
            self.finished(batch)
            return
        batch.acquiring = None
        if batch.abandoned():
            pool.release(connection)
            self.finished(batch)
            return
        batch.send(connection, self._verb)

    def finished(self, batch: Batch) -> None:
        """``batch``, in flight, is answered (or failed, or abandoned): a held batch may
        go. It goes in a later callback, after the wake-ups of the callers just answered,
        so that the gets they make next join it. A batch counts once, however it ends."""
        if not batch.counted:
            return
        batch.counted = False
        self._in_flight -= 1
        round = self._round
        round.ended(batch.generation)
        if self._held:
            if round.in_flight and batch.generation == round.generation:
                round.hold(self)  # its node is free now, the round is not over yet
            else:
                self._held = False
                self._loop.call_soon(self._flush)

    def round_ended(self) -> None:
        """The round this batcher's batch waited for ended: it goes, unless its own node
        has a batch in flight still (then it goes once that is answered)."""
        if self._held and self._in_flight < self._limit:
            self._held = False
            self._flush()


class Batch:
    """One turn's gets for one node: the callers' keys and futures, and once sent, the
    receiver of the reply to each of its ``get`` lines, which resolves the callers once the
    last line is answered."""

    __slots__ = (
        "_batcher",
        "_cancelled",
        "_chunks",
        "_connection",
        "_errors",
        "_found",
        "_pool",
        "acquiring",
        "counted",
        "deadline",
        "futures",
        "generation",
        "keys",
    )

    def __init__(self, batcher: GetBatcher, deadline: float) -> None:
        self._batcher = batcher
        self._pool = batcher._pool
        self.deadline = deadline
        # The callers, in order: a key appears once per caller.
        self.keys: list[bytes] = []
        self.futures: list[asyncio.Future[Item | None]] = []
        self._cancelled = 0
        #: Whether the batcher counts it in flight (from its flush until it ends).
        self.counted = False
        #: The round it was sent in.
        self.generation = 0
        #: The task getting it a connection, while there is one.
        self.acquiring: asyncio.Task[None] | None = None
        self._connection: Connection | None = None
        self._chunks: list[Sequence[bytes] | None] = []  # the lines not answered yet
        self._found: dict[bytes, Item] = {}
        self._errors: dict[bytes, BaseException] | None = None

    def abandoned(self) -> bool:
        return all(future.done() for future in self.futures)

    def cancelled(self) -> None:
        """One caller was cancelled. When it was the last one waiting for a batch in
        flight, the reply is not worth waiting for: drop the connection, or stop waiting
        for one. Either way the batch stops counting in flight now, so that a get made
        next is not held behind it."""
        self._cancelled += 1
        if self._cancelled < len(self.futures) or not self.abandoned():
            return
        connection = self._connection
        if connection is not None:
            # Aborting fails the lines still pending, which releases the connection.
            connection.abort(ConnectionLostError("request cancelled"))
            return
        acquiring = self.acquiring
        if acquiring is not None:
            self.acquiring = None
            self._batcher.finished(self)
            # The pool gives back a connection or slot the task was about to receive.
            acquiring.cancel()

    def send(self, connection: Connection, verb: bytes) -> None:
        keys = self.keys
        unique = list(dict.fromkeys(keys)) if len(keys) > 1 else keys
        if len(unique) <= BATCH_CHUNK:
            chunks: list[Sequence[bytes] | None] = [unique]
            data = verb + b" ".join(unique) + _CRLF
        else:
            chunks = [unique[i : i + BATCH_CHUNK] for i in range(0, len(unique), BATCH_CHUNK)]
            data = b"".join([verb + b" ".join(chunk) + _CRLF for chunk in chunks if chunk])
        self._chunks = list(chunks)
        try:
            if len(chunks) == 1:
                connection.request_one(self, data, _RETRIEVAL, self.deadline, unique)
            else:
                connection.request_into(
                    [self] * len(chunks), data, [_RETRIEVAL] * len(chunks), self.deadline, chunks
                )
        except FastCacheError as exc:
            self._pool.release(connection)  # closed already: the pool lets it go
            _fail(self.futures, exc)
            self._batcher.finished(self)
            return
        self._connection = connection

    # -- the connection's receiver interface ---------------------------------------------
    def done(self) -> bool:
        return False  # the connection hands each line's reply over exactly once

    def set_result(self, reply: Any, /) -> None:
        if isinstance(reply, CommandError):
            self._failed(reply)
            return
        keys = self.keys
        if len(reply) == len(keys) and len(self._chunks) == 1:
            # Every key a hit, asked once, answered in order (memcached keeps the request's
            # order): each caller's item is at its own position; nothing to look up.
            futures = self.futures
            if [item[0] for item in reply] == keys:  # item[0]: the key
                self._release()
                if not (self._cancelled and self.abandoned()):
                    self._pool.answered(_RETRIEVAL, self.deadline)
                    try:
                        for item, future in zip(reply, futures):
                            future.set_result(item)
                    except asyncio.InvalidStateError:
                        # A caller cancelled just now (its except clause has not run yet):
                        # the others, those before it included, are set or get set here.
                        for item, future in zip(reply, futures):
                            if not future.done():
                                future.set_result(item)
                self._batcher.finished(self)
                return
        found = self._found
        for item in reply:
            found[item.key] = item
        self._answered()

    def set_exception(self, exception: BaseException, /) -> None:
        self._failed(exception)

    def _failed(self, error: BaseException) -> None:
        chunk = self._chunks[0]
        assert chunk is not None
        if self._errors is None:
            self._errors = {}
        self._errors.update(dict.fromkeys(chunk, error))
        self._answered()

    def _release(self) -> None:
        """The last line is answered: the connection is free (or, if it broke, forgotten)."""
        connection = self._connection
        if connection is not None:  # None only if a write failed before it was set
            self._pool.release(connection)
            self._connection = None

    def _answered(self) -> None:
        chunks = self._chunks
        if len(chunks) > 1:
            del chunks[0]
            return
        self._release()
        if not (self._cancelled and self.abandoned()):
            # else nobody waits: no outcome to count either (as for a cancelled request)
            self._resolve()
        self._batcher.finished(self)

    def _resolve(self) -> None:
        pool = self._pool
        found, errors = self._found, self._errors
        if errors is None:
            pool.answered(_RETRIEVAL, self.deadline)
            for key, future in zip(self.keys, self.futures):
                if not future.done():  # else cancelled: nobody waits for this one any more
                    future.set_result(found.get(key))
            return
        first = next(iter(errors.values()))
        if isinstance(first, CommandError):
            pool.answered(_RETRIEVAL, self.deadline)
            pool.failed(_RETRIEVAL, first, replied=True)
        else:
            pool.failed(_RETRIEVAL, first)
        for key, future in zip(self.keys, self.futures):
            if future.done():
                continue
            error = errors.get(key)
            if error is None:
                future.set_result(found.get(key))
            else:
                future.set_exception(error)


def _fail(futures: list[asyncio.Future[Item | None]], error: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)
