"""One memcached connection: an ``asyncio.Protocol`` with a FIFO of pending requests.

Requests are written as soon as they are made and their replies are matched in order
(memcached answers in the order it was asked), so several requests may be in flight on one
connection (pipelining). Whatever goes wrong on the transport fails *every* pending request
at once and marks the connection closed; the pool then drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from ..errors import (
    CommandError,
    ConnectionLostError,
    FastCacheError,
    OperationTimeoutError,
    ProtocolError,
)
from ..protocol import ReplyKind, ReplyParser
from .failures import REFUSAL_LINE, refusal_error, refused
from .security import ENDED_UNANSWERED, tls_session_error


class Receiver(Protocol):
    """What a pending reply is handed to: an ``asyncio.Future``, or any object with the same
    three methods (autobatching's batches take their replies without a future)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class WriteReply(asyncio.Future[Any]):
    """The reply of a request that may change what memcached holds (any kind but a
    retrieval's). Cancelling the caller that awaits it does not cancel it: asyncio then
    delivers the cancellation once the reply is in, or once the request failed (by its
    deadline at the latest). memcached keeps the order of one connection's requests only,
    so a write whose caller stopped waiting could land after a later write of the same
    key, sent on another connection, and memcached would keep the older value for good."""

    def cancel(self, msg: Any | None = None) -> bool:
        return False


class Connection(asyncio.Protocol):
    """A pipelined memcached connection. Create it through :func:`open_connection`."""

    __slots__ = (
        "_closed_error",
        "_deadlines",
        "_loop",
        "_outgoing",
        "_parser",
        "_pending",
        "_tls_unanswered",
        "_transport",
        "_watchdog",
        "address",
        "last_used",
        "on_drained",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, max_value_size: int, address: object = "memcached"
    ) -> None:
        self._loop = loop
        self.address = address
        self._parser = ReplyParser(max_value_size=max_value_size)
        # Each pending reply: its future, its kind, and a retrieval's keys (else None).
        self._pending: deque[tuple[Receiver, ReplyKind, Sequence[bytes] | None]] = deque()
        # The deadline of each pending reply, oldest first (kept beside _pending).
        self._deadlines: deque[float] = deque()
        # At most one timer per connection, armed for the oldest pending deadline and
        # re-armed when it fires early: no timer is created or cancelled per request.
        self._watchdog: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        # A TLS connection that has not received a byte yet: a reset now is the server
        # refusing the session (under TLS 1.3 a client certificate is judged after the
        # handshake, and the alert may be lost to the reset).
        self._tls_unanswered = False
        self._closed_error: BaseException | None = None
        self.last_used = time.monotonic()
        # Requests made with request_soon in this turn of the loop, written together.
        self._outgoing: list[bytes] = []
        #: Called once nothing is pending any more (every reply read, or the connection
        #: failed): how a connection shared by pipelined requests goes back to its pool.
        self.on_drained: Callable[[Connection], None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._tls_unanswered = transport.get_extra_info("ssl_object") is not None

    def data_received(self, data: bytes) -> None:
        self._tls_unanswered = False
        parser = self._parser
        pending = self._pending
        if not pending:
            if data.startswith(REFUSAL_LINE):
                # memcached's connection limit: it says so at once, then closes.
                self.abort(refused(self.address))
            else:
                self.abort(ProtocolError(f"unsolicited data from the server: {data[:60]!r}"))
            return
        if parser.idle and data.startswith(REFUSAL_LINE):
            # The same, with requests already sent: a meta command's reader would take the
            # ERROR for a server that does not speak meta.
            self.abort(refused(self.address))
            return
        parser.feed(data)
        while pending:
            future, kind, keys = pending[0]
            try:
                reply = parser.next_reply(kind, keys)
            except ProtocolError as exc:
                self.abort(exc)
                return
            if reply is None:
                return
            if isinstance(reply, CommandError) and refusal_error(reply, self.address):
                self.abort(refused(self.address))
                return
            pending.popleft()
            self._deadlines.popleft()
            if not future.done():
                future.set_result(reply)
        if parser.unread:
            # Everything asked for is answered, yet bytes remain: the server sent more than
            # it was asked for, and they must never be read as the next request's reply.
            self.abort(ProtocolError("the server sent bytes nobody asked for"))
        elif self.on_drained is not None:
            self.on_drained(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed_error is None:
            if isinstance(exc, ssl.SSLError) or (
                self._tls_unanswered and isinstance(exc, ConnectionError)
            ):
                self._closed_error = tls_session_error(self.address, exc)
            elif self._tls_unanswered and exc is None:
                self._closed_error = tls_session_error(self.address, ENDED_UNANSWERED)
            else:
                self._closed_error = ConnectionLostError(
                    "the server closed the connection" if exc is None else f"connection lost: {exc}"
                )
        self._fail_pending(self._closed_error)
        self._transport = None

    # -- requests --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed_error is not None or self._transport is None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def request(
        self,
        data: bytes,
        kind: ReplyKind,
        deadline: float,
        keys: Sequence[bytes] | None = None,
    ) -> asyncio.Future[Any]:
        """Write one request; the future resolves to its parsed reply. ``keys``: those a
        retrieval asked for (an item for any other key breaks the protocol).

        If the reply has not come by ``deadline`` (the loop's clock), the connection is
        aborted and every pending request fails with :class:`OperationTimeoutError`."""
        if self._closed_error is not None or self._transport is None:
            raise self._closed_error or ConnectionLostError("connection is closed")
        future = self._reply_future(kind)
        self._pending.append((future, kind, keys))
        self._deadlines.append(deadline)
        self._arm(deadline)
        self._transport.write(data)
        return future

    def request_many(
        self,
        data: bytes,
        kinds: list[ReplyKind],
        deadline: float,
        expected: list[Sequence[bytes] | None] | None = None,
    ) -> list[asyncio.Future[Any]]:
        """Write several requests in one write; one future per reply, in order.
        ``expected``: per reply, the keys a retrieval asked for."""
        if self._closed_error is not None or self._transport is None:
            raise self._closed_error or ConnectionLostError("connection is closed")
        create = self._reply_future
        futures = [create(kind) for kind in kinds]
        keys = expected if expected is not None else [None] * len(kinds)
        self._pending.extend(zip(futures, kinds, keys))
        self._deadlines.extend([deadline] * len(kinds))
        self._arm(deadline)
        self._transport.write(data)
        return futures

    def _reply_future(self, kind: ReplyKind) -> asyncio.Future[Any]:
        if kind is _RETRIEVAL:  # nothing changes: the caller may stop waiting at once
            return self._loop.create_future()
        return WriteReply(loop=self._loop)

    def request_soon(
        self,
        data: bytes,
        kind: ReplyKind,
        deadline: float,
        keys: Sequence[bytes] | None = None,
    ) -> asyncio.Future[Any]:
        """Like :meth:`request`, but on a connection with requests in flight the bytes are
        written at the end of this turn of the loop, together with every other request
        made on it meanwhile: the requests of many callers pipelined in one write. On an
        idle connection they go at once (a lone caller waits for no extra turn)."""
        if self._closed_error is not None or self._transport is None:
            raise self._closed_error or ConnectionLostError("connection is closed")
        future = self._reply_future(kind)
        pending = self._pending
        idle = not pending
        pending.append((future, kind, keys))
        self._deadlines.append(deadline)
        self._arm(deadline)
        if idle:
            self._transport.write(data)
            return future
        outgoing = self._outgoing
        if not outgoing:
            self._loop.call_soon(self._write_outgoing)
        outgoing.append(data)
        return future

    def _write_outgoing(self) -> None:
        outgoing = self._outgoing
        data = outgoing[0] if len(outgoing) == 1 else b"".join(outgoing)
        outgoing.clear()
        if self._transport is not None:  # else failed meanwhile: its requests were failed
            self._transport.write(data)

    def request_into(
        self,
        receivers: Sequence[Receiver],
        data: bytes,
        kinds: Sequence[ReplyKind],
        deadline: float,
        expected: Sequence[Sequence[bytes] | None],
    ) -> None:
        """Write several requests in one write; each reply goes to its receiver, in order.
        ``expected``: per reply, the keys a retrieval asked for."""
        if self._closed_error is not None or self._transport is None:
            raise self._closed_error or ConnectionLostError("connection is closed")
        self._pending.extend(zip(receivers, kinds, expected))
        self._deadlines.extend([deadline] * len(kinds))
        self._arm(deadline)
        self._transport.write(data)

    def request_one(
        self,
        receiver: Receiver,
        data: bytes,
        kind: ReplyKind,
        deadline: float,
        keys: Sequence[bytes] | None,
    ) -> None:
        """:meth:`request_into` for one request (an autobatched get's commonest case)."""
        transport = self._transport
        if self._closed_error is not None or transport is None:
            raise self._closed_error or ConnectionLostError("connection is closed")
        self._pending.append((receiver, kind, keys))
        self._deadlines.append(deadline)
        self._arm(deadline)
        transport.write(data)

    def _arm(self, deadline: float) -> None:
        """Make the watchdog fire by ``deadline``. The timer outlives the replies it was
        armed for, so a request with a shorter timeout than an earlier one (the client's
        ``timeout`` lowered meanwhile) moves it earlier; later deadlines leave it be."""
        watchdog = self._watchdog
        if watchdog is None:
            self._watchdog = self._loop.call_at(deadline, self._check_deadlines)
        elif deadline < watchdog.when():
            watchdog.cancel()
            self._watchdog = self._loop.call_at(deadline, self._check_deadlines)

    def _check_deadlines(self) -> None:
        self._watchdog = None
        deadlines = self._deadlines
        if not deadlines or self._closed_error is not None:
            return
        # Oldest first, so in order but for a request pipelined with a shorter timeout.
        earliest = min(deadlines)
        if earliest <= self._loop.time():
            self.abort(OperationTimeoutError(f"no reply from {self.address} in time"))
        else:
            self._watchdog = self._loop.call_at(earliest, self._check_deadlines)

    def send_noreply(self, data: bytes) -> None:
        """Write requests that carry ``noreply``: nothing is queued for them."""
        if self._closed_error is not None or self._transport is None:
            raise self._closed_error or ConnectionLostError("connection is closed")
        self._transport.write(data)

    def abort(self, error: FastCacheError) -> None:
        """Drop the connection now and fail whatever is still waiting with ``error``."""
        if self._closed_error is None:
            self._closed_error = error
        transport, self._transport = self._transport, None
        if transport is not None:
            _reset_on_close(transport)
            transport.abort()
        self._fail_pending(self._closed_error)

    def end_after_loop_closed(self) -> None:
        """End an idle connection whose event loop has closed. uvloop closed its transport
        with the loop; asyncio's own cannot be closed without its loop (its abort() ends
        in scheduling the close on it), so its socket is shut down, which ends the
        connection on memcached's side at once, and closed here, as that scheduled close
        would have: left to the garbage collector, it would warn (``ResourceWarning``,
        shown under ``python -X dev`` and by test runners) and hold the descriptor
        until a collection."""
        if self._closed_error is None:
            self._closed_error = ConnectionLostError("its event loop closed")
        transport, self._transport = self._transport, None
        if transport is None or transport.is_closing():
            return
        try:
            transport.abort()
        except RuntimeError:  # the loop is closed (or closing, in another thread)
            sock = transport.get_extra_info("socket")
            # (uvloop's stand-in socket refuses shutdown() with a TypeError.)
            with contextlib.suppress(OSError, TypeError, AttributeError):
                sock.shutdown(socket.SHUT_RDWR)
            _close_socket_of(transport)

    def close(self) -> None:
        """Close quietly (an idle connection being let go)."""
        if self._closed_error is None:
            self._closed_error = ConnectionLostError("connection closed by the client")
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        self._fail_pending(self._closed_error)

    def _fail_pending(self, error: BaseException) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._deadlines.clear()
        pending = self._pending
        while pending:
            future, _kind, _keys = pending.popleft()
            if not future.done():
                future.set_exception(error)
        if self.on_drained is not None:
            self.on_drained(self)


# SO_LINGER on, for 0 seconds: close() resets the connection.
_ABORT_LINGER = struct.pack("ii", 1, 0)


_RETRIEVAL = ReplyKind.RETRIEVAL


def _close_socket_of(transport: asyncio.BaseTransport) -> None:
    """Close the socket of an asyncio selector transport whose loop has closed, and
    detach it, as the transport's own close on its loop would have (which cannot run
    now). Only asyncio's own transports keep it (``_sock``): others are left alone."""
    attributes: dict[str, Any] = getattr(transport, "__dict__", {})
    sock = attributes.get("_sock")
    if isinstance(sock, socket.socket):
        attributes["_sock"] = None  # what the transport checks before warning of a leak
        sock.close()


def _reset_on_close(transport: asyncio.BaseTransport) -> None:
    """Have the transport's close reset the connection: the kernel then discards whatever
    of a failed request is still unsent, so that it cannot reach the server later (after
    an outage's replay, say). A plain close would still deliver it, once a partition
    heals."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_LINGER)
