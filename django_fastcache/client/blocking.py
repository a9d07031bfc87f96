"""The commands over blocking sockets owned by the calling thread.

:class:`BlockingClient` shares the command code, the protocol and the cluster view with the
asyncio :class:`~django_fastcache.client.client.Client`; only the I/O differs. Its
coroutines never suspend, so :func:`django_fastcache.bridge.run_blocking` finishes them with
a single ``send(None)`` — no event loop, no thread hop. Measured on loopback this is as fast
as a C client, where ``run_until_complete`` on a private loop was about twice as slow (and
uvloop's, on the main thread, three times).

Each thread keeps one connection per node. A connection that times out, breaks or
receives bytes that do not parse is closed at once, so a late reply is never read as the
next request's answer. Before a request, a connection idle for a while is polled for bytes
nobody asked for and for the server's end of stream; one used a moment ago (calls back to
back) is not, and a retrieval that then finds the connection closed goes again on a new one
(see ``BlockingConnection.out_of_step``). After ``fork()`` the child opens its own connections (the
inherited sockets are closed in the child, which leaves the parent's untouched).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from .._mypyc import i64, mypyc_attr
from ..bridge import run_blocking
from ..errors import (
    ClientError,
    CommandError,
    ConnectFailedError,
    ConnectionLostError,
    ConnectTimeoutError,
    FastCacheError,
    OperationTimeoutError,
    TLSError,
    UnknownCommandError,
)
from ..protocol import (
    Item,
    MetaReply,
    ReplyKind,
    ReplyParser,
    Status,
    decr_command,
    delete_command,
    incr_command,
    meta_arithmetic_command,
    storage_command,
    touch_command,
)
from ..protocol.keys import MAX_KEY_LENGTH, validate_key
from ..protocol.parser import MISS, whole_meta_reply, whole_one_value, whole_status
from . import forksafe
from .address import Address
from .cluster import ClientSettings, Cluster
from .commands import CommandSet, Expected, Meanwhile, Replies, Requests
from .events import NodeHealth
from .failures import REFUSAL_LINE, connect_error, refusal_error, refused
from .meta import counted, meta_unsent, only_reply
from .metrics import ClientMetrics, Latencies, MetricsSnapshot, new_calls
from .security import ENDED_UNANSWERED, check_auth_reply, tls_error, tls_session_error
from .thread_connections import ThreadConnections

# Larger replies take several reads; most take one.
_RECV_SIZE: Final = 64 * 1024
# A connection's replies are read this much at a time while they are short: a bytes object
# of at most 512 bytes (33 of them its header) comes from Python's small-object allocator,
# where a 64 KiB one costs a malloc, a realloc and a free (about 700 instructions, measured
# with callgrind). A read that fills it switches the connection to _RECV_SIZE for the next
# _LARGE_READS reads that bring less than this; so a larger reply costs one extra read
# only when it follows a long run of short ones.
_SHORT_READ: Final = 512 - 33
_LARGE_READS: Final = 64
# os.read's size argument, boxed once: an int above 256 is otherwise boxed anew per call.
_SHORT_READ_ARG: Final[object] = _SHORT_READ
_RECV_SIZE_ARG: Final[object] = _RECV_SIZE
# Reads allowed past a call's deadline, of bytes that had already arrived: enough for a
# full socket receive buffer, never an endless stream.
_LATE_READS: Final = 128

_UINT64_MAX: Final = 2**64 - 1

# A connection whose previous request began less than this many seconds ago is used without
# the zero-timeout poll for bytes nobody asked for (see BlockingConnection.out_of_step).
POLL_AFTER_IDLE: Final = 0.002

# SO_LINGER on, for 0 seconds: close() resets the connection.
_ABORT_LINGER: Final = struct.pack("ii", 1, 0)

_RETRIEVAL: Final = ReplyKind.RETRIEVAL
_STORAGE: Final = ReplyKind.STORAGE
_DELETE: Final = ReplyKind.DELETE
_TOUCH: Final = ReplyKind.TOUCH
_ARITHMETIC: Final = ReplyKind.ARITHMETIC
_META: Final = ReplyKind.META


# A static of the compiled module: no lookup of the module attribute per call.
_monotonic: Final = time.monotonic

_write: Final = os.write
# Typed to take the size already boxed (_SHORT_READ_ARG, _RECV_SIZE_ARG).
_read_fd: Final = cast("Callable[[int, object], bytes]", os.read)

# Builds an Item without the Python-level __new__ of a NamedTuple.
_new_item: Final = tuple.__new__
# A static of the compiled module, where the imported name is a globals dict look-up.
_Item: Final = Item


def _plain_key(key: bytes) -> bool:
    """Whether ``key`` is a valid key (:func:`validate_key` in short, for valid keys): a
    bytes object of 1 to 250 bytes, none of them a space, a control byte or DEL. Compiled,
    a loop over the key costs a few instructions a byte, where the regular expression
    search of :func:`validate_key` costs a Python call and the regex engine's set-up."""
    if type(key) is not bytes:
        return False
    end: i64 = len(key)
    if end == 0 or end > MAX_KEY_LENGTH:
        return False
    index: i64 = 0
    while index < end:
        byte: i64 = key[index]
        if byte <= 32 or byte == 127:
            return False
        index += 1
    return True


def _set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    # A struct timeval: two native longs on Linux (and the same 16 bytes on macOS).
    whole = int(seconds)
    timeval = struct.pack("@ll", whole, max(1, int((seconds - whole) * 1_000_000)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class BlockingConnection:
    """One blocking socket to one node, with its own reply parser.

    Every exchange is bounded by ``timeout`` in total, however the bytes trickle: the
    kernel enforces it on each system call (``SO_RCVTIMEO``/``SO_SNDTIMEO``), shortened to
    what is left of the call's deadline whenever a call needs more than one.
    """

    __slots__ = (
        "_buffer",
        "_fd",
        "_kernel_timeout",
        "_large_reads",
        "_parser",
        "_poll",
        "_sock",
        "_view",
        "address",
        "calls",
        "latencies",
        "poll_after_idle",
        "report_reply",
        "timeout",
        "unpolled",
        "used",
    )

    def __init__(self, address: Address, sock: socket.socket, timeout: float,
                 max_value_size: int) -> None:  # fmt: skip
        """Over ``sock``, connected (see :func:`connect`)."""
        self.address = address
        self.timeout = timeout
        # A blocking socket whose timeouts the kernel enforces (SO_RCVTIMEO/SO_SNDTIMEO):
        # one recv() or send() system call each, where Python's own socket timeouts add a
        # poll() before every call.
        sock.settimeout(None)
        self._sock = sock
        self._kernel_timeout = timeout
        _set_kernel_timeouts(sock, timeout)
        self._fd = sock.fileno()
        self._parser = ReplyParser(max_value_size=max_value_size)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        # Late reads and TLS reads go into this reused buffer. (Plain reads take os.read's
        # bytes: see _SHORT_READ; 64 KiB ones stay under glibc's mmap threshold, and are
        # shrunk in place; strace -c shows no mmap per call.)
        self._buffer = bytearray(_RECV_SIZE)
        self._view = memoryview(self._buffer)
        # Reads of _RECV_SIZE still to come (see _SHORT_READ); none: short reads.
        self._large_reads = 0
        # Requests made on this connection, by reply kind (its thread's alone: no lock),
        # their latencies when measured, and whether its next reply says the node is back.
        self.calls = new_calls()
        self.latencies: Latencies | None = None
        self.report_reply = False
        #: When the latest request on it began (its deadline: the clock plus ``timeout``),
        #: and whether it went out without a poll (see :meth:`out_of_step`).
        self.used = 0.0
        self.unpolled = False
        self.poll_after_idle = POLL_AFTER_IDLE

    def readable(self) -> bool:
        """Whether the server sent anything (bytes, end of stream, an error) since last read.

        Between requests the server has nothing to say: bytes now answer nothing and would be
        read as the next request's reply, and end of stream means the server closed the
        connection. A zero-timeout poll costs well under a microsecond.
        """
        # Bytes already read but used by no reply count too: the server sent more than
        # it was asked for, and the stream is out of step.
        return self._parser.unread > 0 or bool(self._poll.poll(0))

    def out_of_step(self, deadline: float) -> bool:
        """:meth:`readable`, for a request about to go out with ``deadline``; without the
        poll (a system call) when the previous request began less than ``poll_after_idle``
        seconds before this one, as calls back to back do.

        Skipping it is safe because nothing else can be on the stream: a connection is
        closed (by a reset) as soon as a call on it fails or times out, so no late reply
        can arrive on it; bytes sent beyond a reply arrive with it, and are left unread by
        the parser (checked here, for free); and an end of stream (the server closed the
        connection) fails the request's first read, before any byte of a reply, which a
        retrieval takes as the cue to go again on a new connection (:attr:`unpolled`). Only
        bytes a server sends of its own accord in the moment after a reply, which memcached
        never does, could pass unseen."""
        previous = self.used
        self.used = deadline
        self.unpolled = deadline - previous < self.poll_after_idle
        if self.unpolled:
            return self._parser.unread > 0
        return self.readable()

    def send(self, data: bytes, deadline: float) -> None:
        """Write ``data`` whole before ``deadline`` (a ``time.monotonic()`` value)."""
        try:
            # os.write on the descriptor: the same system call's work as socket.send, for
            # fewer instructions (no argument parsing by format, no timeout machinery).
            sent = _write(self._fd, data)
            # A request fits the socket's send buffer at once, unless the server stopped
            # reading: then every further write waits only for what is left of the call.
            while sent < len(data):
                if not self._limit_kernel_timeout(deadline):
                    raise TimeoutError
                sent += _write(self._fd, memoryview(data)[sent:])
        except (BlockingIOError, TimeoutError):  # SO_SNDTIMEO ran out
            raise OperationTimeoutError(
                f"sending to {self.address} took longer than {self.timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc

    def receive(
        self,
        kinds: list[ReplyKind],
        deadline: float,
        expected: list[Sequence[bytes] | None] | None = None,
        own_deadline: bool = True,
    ) -> list[Any]:
        """The replies to requests already sent, in order (error replies included), all
        read before ``deadline`` (a ``time.monotonic()`` value). ``expected`` holds, per
        reply, the keys a retrieval asked for. ``own_deadline``: the deadline was set for
        this exchange alone, just before its request, so the first wait may take the whole
        timeout (as :meth:`receive_one` does); False when other nodes shared it."""
        parser = self._parser
        replies: list[Any] = []
        late_reads = 0
        first_wait = own_deadline and self._kernel_timeout == self.timeout
        for index, kind in enumerate(kinds):
            keys = None if expected is None else expected[index]
            # Nothing unread: there is no reply to look at before reading.
            reply = parser.next_reply(kind, keys) if parser.unread else None
            while reply is None:
                if first_wait:
                    first_wait = False
                    self._read()
                elif self._limit_kernel_timeout(deadline):
                    self._read()
                else:
                    # Past the deadline (another node's reply may have used it up while this
                    # one sat here): take only what has already arrived, a bounded amount.
                    late_reads += 1
                    if late_reads > _LATE_READS:
                        raise self._timed_out()
                    self._read(socket.MSG_DONTWAIT)
                reply = parser.next_reply(kind, keys)
            replies.append(reply)
            if reply.__class__ is UnknownCommandError:
                refused = refusal_error(reply, self.address)
                if refused is not None:
                    raise refused  # the caller discards the connection
        self._restore_kernel_timeout()
        return replies

    def receive_one(
        self, kind: ReplyKind, deadline: float, keys: Sequence[bytes] | None = None
    ) -> Any:
        """The reply to the one request just sent: :meth:`receive` for the common case,
        where the first read brings the whole reply."""
        if self._kernel_timeout != self.timeout and not self._limit_kernel_timeout(deadline):
            raise self._timed_out()
        # The first wait may use the whole timeout: only the send came before it.
        parser = self._parser
        if parser.idle:
            received = self._received()
            if kind is _META:
                # One meta command's reply and its MN, brought whole: read in one step.
                if keys is None:
                    meta = whole_meta_reply(received, parser.max_value_size, parser.max_line_length)
                    if meta is not None:
                        if self._kernel_timeout != self.timeout:
                            self._restore_kernel_timeout()
                        return [meta]
            else:
                # A one-line reply the first read brought whole: read in one step.
                found = whole_status(received, kind)
                if found is not None:
                    if self._kernel_timeout != self.timeout:
                        self._restore_kernel_timeout()
                    return found
            self._feed_start(received)
        else:
            self._read()
        reply = parser.next_reply(kind, keys)
        while reply is None:
            if not self._limit_kernel_timeout(deadline):
                raise self._timed_out()
            self._read()
            reply = parser.next_reply(kind, keys)
        if self._kernel_timeout != self.timeout:
            self._restore_kernel_timeout()
        return reply

    def receive_value(
        self, key: bytes, deadline: float
    ) -> tuple[bytes, int] | tuple[()] | CommandError:
        """The reply to the ``get <key>`` just sent: ``(value, flags)``, :data:`MISS`, or an
        error reply. :meth:`receive_one`, for the flat path's commonest call: a reply that
        the first read brings whole is read in one step (:func:`whole_one_value`)."""
        if self._kernel_timeout != self.timeout and not self._limit_kernel_timeout(deadline):
            raise self._timed_out()
        received = self._received()
        parser = self._parser
        if parser.idle:
            found = whole_one_value(received, key, parser.max_value_size)
            if found is not None:
                if self._kernel_timeout != self.timeout:
                    self._restore_kernel_timeout()
                return found
            self._feed_start(received)
        else:
            parser.feed(received)
        reply = parser.next_value(key)
        while reply is None:
            if not self._limit_kernel_timeout(deadline):
                raise self._timed_out()
            self._read()
            reply = parser.next_value(key)
        if self._kernel_timeout != self.timeout:
            self._restore_kernel_timeout()
        return reply

    def receive_status_and_value(
        self, key: bytes, deadline: float, own: bytes, own_size: int
    ) -> tuple[Status | CommandError, tuple[bytes, int] | tuple[()] | CommandError]:
        """The replies to a storage command and a ``get <key>`` sent together, in order
        (error replies included): both are always read, so the stream stays in step. When
        the first read brings both whole, as it does for short values, they are read in
        one step (:func:`whole_one_value` after the status line). ``own`` is the header
        line (``VALUE <key> <flags> <bytes>``) and ``own_size`` the length of the value
        the command stored: a stored value read back as such is checked for its framing
        only, and its value is not kept (:data:`MISS` in its place)."""
        if self._kernel_timeout != self.timeout and not self._limit_kernel_timeout(deadline):
            raise self._timed_out()
        parser = self._parser
        if parser.idle:
            received = self._received()
            status: Status | None = None
            if received.startswith(b"NOT_STORED\r\n"):
                status, rest = Status.NOT_STORED, received[12:]
            elif received.startswith(b"STORED\r\n"):
                # Its own value back, whole: the header as sent, the value's length, END.
                if (
                    len(received) == 15 + len(own) + own_size
                    and received.startswith(own, 8)
                    and received.endswith(b"\r\nEND\r\n")
                ):
                    if self._kernel_timeout != self.timeout:
                        self._restore_kernel_timeout()
                    return Status.STORED, MISS
                status, rest = Status.STORED, received[8:]
            if status is not None:
                found = whole_one_value(rest, key, parser.max_value_size)
                if found is not None:
                    if self._kernel_timeout != self.timeout:
                        self._restore_kernel_timeout()
                    return status, found
            self._feed_start(received)
        else:
            self._read()
        stored = parser.next_reply(_STORAGE)
        while stored is None:
            if not self._limit_kernel_timeout(deadline):
                raise self._timed_out()
            self._read()
            stored = parser.next_reply(_STORAGE)
        value = parser.next_value(key)
        while value is None:
            if not self._limit_kernel_timeout(deadline):
                raise self._timed_out()
            self._read()
            value = parser.next_value(key)
        if self._kernel_timeout != self.timeout:
            self._restore_kernel_timeout()
        return cast("Status | CommandError", stored), value

    def _feed_start(self, received: bytes) -> None:
        """Feed the first bytes of a reply to the parser. memcached's connection-limit line
        (it sends it on a new connection, then closes it) is the node's refusal, whatever
        was asked: a meta command's reader would take its ``ERROR`` for a server that does
        not speak meta, and a reply of two would wait for the second until the close."""
        if received.startswith(REFUSAL_LINE):
            raise refused(self.address)
        self._parser.feed(received)

    def _read(self, flags: int = 0) -> None:
        """One read into the parser, waiting as long as the kernel timeout says."""
        if not flags:
            if self._parser.idle:
                self._feed_start(self._received())
            else:
                self._parser.feed(self._received())
            return
        # Two statements: compiled by mypyc, ``self._view[: self._recv(flags)]`` fed an
        # empty slice (the suite catches it in the compiled run).
        count = self._recv(flags)
        self._parser.feed(self._view[:count])

    def _received(self) -> bytes:
        """One read, waiting as long as the kernel timeout says: the bytes that came
        (never none). os.read on the descriptor: a bytes object at once, for fewer
        instructions than recv_into and a copy out of the receive buffer."""
        large = self._large_reads
        try:
            data = _read_fd(self._fd, _RECV_SIZE_ARG if large else _SHORT_READ_ARG)
        except (BlockingIOError, TimeoutError):  # SO_RCVTIMEO ran out
            raise self._timed_out() from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc
        count = len(data)
        if not count:
            raise ConnectionLostError(f"{self.address} closed the connection")
        if count >= _SHORT_READ:
            # Perhaps cut short: read the rest of this reply, and the next ones, larger.
            self._large_reads = _LARGE_READS
        elif large:
            self._large_reads = large - 1
        return data

    def _recv(self, flags: int) -> int:
        """One read into the receive buffer: how many bytes came (never 0)."""
        try:
            count = self._sock.recv_into(self._view, 0, flags)
        except (BlockingIOError, TimeoutError):  # SO_RCVTIMEO ran out
            raise self._timed_out() from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc
        if not count:
            raise ConnectionLostError(f"{self.address} closed the connection")
        return count

    def _limit_kernel_timeout(self, deadline: float) -> bool:
        """Make the next system call wait no longer than what is left until ``deadline``;
        False when nothing is left."""
        remaining = deadline - _monotonic()
        if remaining <= 0:
            return False
        if remaining < self._kernel_timeout:
            self._kernel_timeout = remaining
            _set_kernel_timeouts(self._sock, remaining)
        return True

    def bound(self, deadline: float) -> None:
        """Make this connection's next system calls wait no longer than what is left until
        ``deadline`` (:meth:`receive_one` and :meth:`receive_value` restore the timeout):
        for a request sent again, whose first read must not wait a whole ``timeout``."""
        if not self._limit_kernel_timeout(deadline):
            raise self._timed_out()

    def _timed_out(self) -> OperationTimeoutError:
        return OperationTimeoutError(f"no reply from {self.address} within {self.timeout}s")

    def _restore_kernel_timeout(self) -> None:
        if self._kernel_timeout != self.timeout:
            self._kernel_timeout = self.timeout
            _set_kernel_timeouts(self._sock, self.timeout)

    def close(self, abort: bool = False) -> None:
        """Close the socket; with ``abort``, by a reset (``SO_LINGER`` 0), which throws
        away whatever of a failed request is still unsent, so that it cannot reach the
        server later (after an outage's replay, say)."""
        if abort:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_LINGER)
        self._sock.close()


class TLSConnection(BlockingConnection):
    """A :class:`BlockingConnection` over TLS.

    An SSL socket cannot use the kernel's timeouts: a read that runs out of
    ``SO_RCVTIMEO`` is retried by the TLS layer for ever. So it keeps Python's own socket
    timeout (a poll before each system call), and it takes no ``recv`` flags. Bytes the TLS
    layer has decrypted but not handed over count as unread.

    Under TLS 1.3 a server that refuses the client's certificate (or the lack of one)
    says so only after the handshake, with an alert and a close; a request of the client's
    still unread there turns the close into a reset, which may reach the client before the
    alert (Python 3.11's TLS layer reads a reset as the end of the stream). So a
    connection that ends or is reset before its first answer reports that refusal too, as
    on the async client (:class:`~.connection.Connection`)."""

    __slots__ = ("_answered", "_tls")

    def __init__(self, address: Address, sock: ssl.SSLSocket, timeout: float,
                 max_value_size: int) -> None:  # fmt: skip
        super().__init__(address, sock, timeout, max_value_size)
        self._tls = sock
        #: Whether the server answered anything on this connection yet.
        self._answered = False
        sock.settimeout(timeout)

    def readable(self) -> bool:
        return self._parser.unread > 0 or self._tls.pending() > 0 or bool(self._poll.poll(0))

    def out_of_step(self, deadline: float) -> bool:
        # Always polled: over TLS an end of stream can read as a TLS error, not one a
        # retrieval would be sent again after (and every TLS read polls anyway).
        self.used = deadline
        self.unpolled = False
        return self.readable()

    def send(self, data: bytes, deadline: float) -> None:
        try:
            self._send_tls(data, deadline)
        except ConnectionLostError as exc:
            # __context__ too: compiled by mypyc, ``raise ... from`` left only the context.
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ssl.SSLError) or (
                isinstance(cause, ConnectionError) and not self._answered
            ):
                raise self._tls_failed(cause) from cause
            raise

    def _send_tls(self, data: bytes, deadline: float) -> None:
        # BlockingConnection.send through the TLS layer, never past it to the descriptor.
        try:
            sent = self._tls.send(data)
            while sent < len(data):
                if not self._limit_kernel_timeout(deadline):
                    raise TimeoutError
                sent += self._tls.send(memoryview(data)[sent:])
        except (BlockingIOError, TimeoutError):
            raise OperationTimeoutError(
                f"sending to {self.address} took longer than {self.timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc

    def _received(self) -> bytes:
        count = self._recv(0)
        return bytes(self._view[:count])

    def _tls_failed(self, exc: ssl.SSLError | OSError | str) -> TLSError:
        # Under TLS 1.3 a server that refuses the client's certificate says so only after
        # the handshake, on the first exchange.
        return tls_session_error(self.address, exc)

    def _recv(self, flags: int) -> int:
        sock = self._tls
        try:
            if not flags:
                count = sock.recv_into(self._view)
            elif sock.pending() or self._poll.poll(0):
                # A late read: only what has arrived, and a record cut short is not waited for.
                sock.settimeout(0)
                try:
                    count = sock.recv_into(self._view)
                finally:
                    sock.settimeout(self._kernel_timeout)
            else:
                raise self._timed_out()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, TimeoutError):
            raise self._timed_out() from None
        except ssl.SSLError as exc:
            raise self._tls_failed(exc) from exc
        except OSError as exc:
            if isinstance(exc, ConnectionError) and not self._answered:
                raise self._tls_failed(exc) from exc
            raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc
        if not count:
            if not self._answered:
                raise self._tls_failed(ENDED_UNANSWERED)
            raise ConnectionLostError(f"{self.address} closed the connection")
        self._answered = True
        return count

    def _limit_kernel_timeout(self, deadline: float) -> bool:
        remaining = deadline - _monotonic()
        if remaining <= 0:
            return False
        if remaining < self._kernel_timeout:
            self._kernel_timeout = remaining
            self._tls.settimeout(remaining)
        return True

    def _restore_kernel_timeout(self) -> None:
        if self._kernel_timeout != self.timeout:
            self._kernel_timeout = self.timeout
            self._tls.settimeout(self.timeout)


def _open_socket(address: Address, connect_timeout: float) -> socket.socket:
    """A socket connected to ``address``, in blocking mode no longer than connect_timeout."""
    try:
        sock = address.open_blocking(connect_timeout)
        if address.path is None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except TimeoutError:
        raise ConnectTimeoutError(
            f"connecting to {address} took longer than {connect_timeout}s"
        ) from None
    except OSError as exc:
        # Out of descriptors is this process's trouble, not the node's.
        raise connect_error(address, exc) from exc
    return sock


def connect(address: Address, settings: ClientSettings, connect_timeout: float
            ) -> BlockingConnection:  # fmt: skip
    """A connection to ``address`` ready for requests: TLS and authentication done as
    ``settings.security`` asks, all within ``connect_timeout``."""
    deadline = _monotonic() + connect_timeout
    sock = _open_socket(address, connect_timeout)
    security = settings.security
    if security is None:
        return BlockingConnection(address, sock, settings.timeout, settings.max_value_size)
    connection: BlockingConnection
    if security.uses_tls(address):
        assert security.context is not None
        hostname = security.hostname_for(address)
        try:
            sock.settimeout(max(0.001, deadline - _monotonic()))
            tls = security.context.wrap_socket(sock, server_hostname=hostname)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, ssl.SSLError):
                raise tls_error(address, hostname, exc) from exc
            if isinstance(exc, TimeoutError):
                raise ConnectTimeoutError(
                    f"the TLS handshake with {address} took longer than {connect_timeout}s"
                ) from None
            if isinstance(exc, OSError):
                # Still connecting: nothing of the caller's was sent.
                raise ConnectFailedError(f"TLS handshake with {address}: {exc}") from exc
            raise
        connection = TLSConnection(address, tls, settings.timeout, settings.max_value_size)
    else:
        connection = BlockingConnection(address, sock, settings.timeout, settings.max_value_size)
    username = security.username
    if username is not None:
        try:
            if not connection._limit_kernel_timeout(deadline):
                raise ConnectTimeoutError(f"connecting to {address} used up connect_timeout")
            connection.send(security.auth_request(), deadline)
            reply = connection.receive_one(_STORAGE, deadline)
            connection._restore_kernel_timeout()
            refused = refusal_error(reply, address)
            if refused is not None:
                raise refused
            check_auth_reply(reply, address, username)
        except OperationTimeoutError as exc:
            connection.close(abort=True)
            if isinstance(exc, ConnectTimeoutError):
                raise
            # Still connecting: no request of the caller's was sent.
            raise ConnectTimeoutError(
                f"authenticating with {address} took longer than {connect_timeout}s"
            ) from None
        except ConnectionLostError as exc:
            connection.close(abort=True)
            raise ConnectFailedError(f"authenticating with {address}: {exc}") from exc
        except BaseException:
            connection.close(abort=True)
            raise
    return connection


def count_line(key: bytes, delta: int) -> bytes:
    """The ``ma`` line of the disk tier's increment of a valid ``key`` by ``delta``
    (negative: a decrement), asking for the new value, the CAS and the TTL left (``v c
    t``). A delta memcached cannot count by is refused as
    :meth:`~MetaCommands.meta_arithmetic` refuses it (:class:`InvalidArgumentError`)."""
    if type(delta) is int and -_UINT64_MAX <= delta <= _UINT64_MAX:
        if delta < 0:
            return b"ma %s MD D%d v c t\r\n" % (key, -delta)
        return b"ma %s D%d v c t\r\n" % (key, delta)
    # Refused there: not an int (a bool neither, as the tier-less client refuses it), or
    # beyond 2**64 - 1 either way.
    if type(delta) is int and delta < 0:
        return meta_arithmetic_command(key, mode="decr", delta=-delta)
    return meta_arithmetic_command(key, delta=delta)


# Compiled, it may still be subclassed from Python (tests, wrappers).
@mypyc_attr(allow_interpreted_subclasses=True)
class BlockingClient(CommandSet):
    """The commands over blocking sockets; drive its coroutines with ``run_blocking``."""

    def __init__(self, cluster: Cluster, health: NodeHealth | None = None) -> None:
        self.cluster = cluster
        self._timeout = cluster.settings.timeout
        # Whether meta commands may be sent (ClientSettings.meta), read by meta_at.
        self._meta = cluster.settings.meta
        #: Node health, shared with the asyncio client of the same cluster when given.
        self.health = NodeHealth() if health is None else health
        #: Counters per node and operation (see :meth:`metrics`); latencies only when
        #: ``timed`` (two clock reads per call).
        self.counters = ClientMetrics("blocking", cluster, latency=False)
        self.timed = False
        self._local = ThreadConnections()
        # Its threading.local, read on every request (see ThreadConnections).
        self._tls = self._local.tls
        # The connections, not the client, are what a forked child must drop (and the
        # compiled client cannot be weakly referenced on Python 3.12 and later).
        forksafe.register(self._local)
        if cluster.dynamic:  # autodiscovery: close connections to nodes that leave
            cluster.add_listener(None, self._local.drop_nodes)

    def _connection(self, node: int, deadline: float, flat: bool = False) -> BlockingConnection:
        """The calling thread's connection to ``node``, in step for a request. ``flat``: for
        one request whose failure the caller handles as :meth:`_again` does, so a connection
        used a moment ago is trusted without a poll (:meth:`BlockingConnection.out_of_step`)."""
        try:
            by_node: dict[int, BlockingConnection] = self._tls.by_node
        except AttributeError:  # the thread's first request
            by_node = self._local.new_thread()
        connection = by_node.get(node)
        if connection is not None and (
            connection.out_of_step(deadline) if flat else connection.readable()
        ):
            # Unsolicited bytes or a closed connection: it cannot carry a request. Start afresh.
            self._discard(node)
            connection = None
        if connection is None:
            settings = self.cluster.settings
            connection = connect(
                self.cluster.addresses[node],
                settings,
                # Connecting counts against the call's timeout too.
                max(0.001, min(settings.connect_timeout, deadline - _monotonic())),
            )
            by_node[node] = connection
            connection.used = deadline
            self._count(node, connection)
            # The connect used part of the call's timeout: the first read waits only for
            # what is left (the reply restores the connection's own timeout).
            connection.bound(deadline)
        return connection

    def _discard(self, node: int) -> None:
        connection = self._local.by_node.pop(node, None)
        if connection is not None:
            connection.close(abort=True)
            self.counters.detach(connection.calls)

    def _exchange(
        self,
        node: int,
        data: bytes,
        kinds: list[ReplyKind],
        expected: list[Sequence[bytes] | None] | None,
    ) -> list[Any]:
        deadline = _monotonic() + self._timeout
        try:
            connection = self._connection(node, deadline)
        except BaseException as exc:
            self._failed(node, kinds[0], exc, True)
            raise
        connection.calls[kinds[0]] += 1
        try:
            connection.send(data, deadline)
            replies = connection.receive(kinds, deadline, expected)
        except BaseException as exc:
            # Interrupted half-way, the stream is out of step: never reuse it.
            self._discard(node)
            self._failed(node, kinds[0], exc)
            raise
        self._replied(node, connection, kinds[0], deadline)
        return replies

    def request(
        self,
        node: int,
        data: bytes,
        kind: ReplyKind,
        meanwhile: Meanwhile = None,
        keys: Sequence[bytes] | None = None,
    ) -> Any:
        """One request, one reply, on the calling thread; an error reply is raised."""
        deadline = _monotonic() + self._timeout
        connection = self._ready(node, kind, deadline)
        try:
            connection.send(data, deadline)
            if meanwhile is not None:
                meanwhile()
            reply = connection.receive_one(kind, deadline, keys)
        except BaseException as exc:
            if not self._again(node, connection, kind, exc):
                raise
            # The server had closed the connection: once more, on a new one.
            connection = self._ready(node, kind, deadline)
            try:
                connection.bound(deadline)
                connection.send(data, deadline)
                reply = connection.receive_one(kind, deadline, keys)
            except BaseException as exc:
                self._broken(node, kind, exc)
                raise
        if self.timed or connection.report_reply:
            self._replied(node, connection, kind, deadline)
        if isinstance(reply, CommandError):
            raise self._error_reply(node, kind, reply)
        return reply

    def _ready(self, node: int, kind: int, deadline: float) -> BlockingConnection:
        """The calling thread's connection to ``node`` for one request (of the flat path,
        whose failures go through :meth:`_again`), counting a call of ``kind``."""
        try:
            connection = self._connection(node, deadline, True)
        except BaseException as exc:
            self._failed(node, kind, exc, True)
            raise
        # Read into a typed local: compiled, ``calls[kind] += 1`` is a generic in-place add.
        calls = connection.calls
        count: int = calls[kind]
        calls[kind] = count + 1
        return connection

    def _again(
        self, node: int, connection: BlockingConnection, kind: int, error: BaseException
    ) -> bool:
        """After ``error`` on a request of ``kind`` over ``connection``: whether to send it
        again, on a new connection; when not, the failure is counted (:meth:`_broken`).

        Again only for a retrieval, which is safe to repeat, that went out without a poll
        (:meth:`BlockingConnection.out_of_step`) and found the connection closed before any
        byte of its reply: the end of stream the poll would have seen. Not a failure of the
        node: the connection is dropped, its call uncounted, the node's health untouched."""
        if (
            kind == _RETRIEVAL
            and connection.unpolled
            and isinstance(error, ConnectionLostError)
            and connection._parser.idle
        ):
            connection.calls[kind] -= 1
            self._discard(node)
            return True
        self._broken(node, kind, error)
        return False

    def _broken(self, node: int, kind: int, error: BaseException) -> None:
        # Interrupted half-way, the stream is out of step: never reuse it.
        self._discard(node)
        self._failed(node, kind, error)

    def _error_reply(self, node: int, kind: int, reply: CommandError) -> FastCacheError:
        """What to raise for an error reply, counted (and the connection dropped when
        memcached refused it)."""
        refused = refusal_error(reply, self.cluster.addresses[node])
        if refused is not None:
            # memcached's connection limit: it closes this connection right after.
            self._discard(node)
            self._failed(node, kind, refused)
            return refused
        self.counters.failed(self.cluster.node_ids[node], kind, reply)
        return reply

    # -- metrics and node health: connections being made, failures, the odd reply -----------
    def _count(self, node: int, connection: BlockingConnection) -> None:
        """Count a new connection's calls, for as long as its thread lives."""
        node_id = self.cluster.node_ids[node]
        if self.timed:
            connection.latencies = Latencies()
        # A connection opened while its node is unhealthy reports its first reply.
        connection.report_reply = node_id in self.health.unhealthy
        self.counters.attach(
            node_id, connection.calls, connection.latencies, threading.current_thread().is_alive
        )

    def _failed(self, node: int, kind: int, error: BaseException, connecting: bool = False) -> None:
        node_id = self.cluster.node_ids[node]
        self.counters.failed(node_id, kind, error, connecting)
        self.health.failed(node_id, error)

    def _replied(
        self, node: int, connection: BlockingConnection, kind: int, deadline: float
    ) -> None:
        latencies = connection.latencies
        if latencies is not None:
            latencies.observe(kind, _monotonic() - (deadline - self._timeout))
        if connection.report_reply:
            connection.report_reply = False
            self.health.answered(self.cluster.node_ids[node])

    def metrics(self) -> MetricsSnapshot:
        """Per node: calls, errors and timeouts per operation (and latencies when ``timed``),
        and the number of threads holding a connection. See docs/metrics.md."""
        self.counters.latency = self.timed
        return self.counters.snapshot(self.health.healthy)

    # -- the single-key commands as plain calls: the sync API's flat path ----------------
    # The same requests and results as CommandSet's coroutines of the same names, minus
    # the coroutine layers, which cost about a tenth of a call on this path.
    def get_now(self, key: bytes) -> Item | None:
        """:meth:`~CommandSet.get`, as a plain call."""
        if not _plain_key(key):
            validate_key(key)  # raises InvalidKeyError, saying what is wrong
        found = self.value_now(key, True)
        # tuple.__new__: the NamedTuple's own __new__ is a Python function, a frame per call.
        return None if found is None else _new_item(_Item, (key, found[0], found[1], None))

    def value_now(self, key: bytes, checked: bool = False) -> tuple[bytes, int] | None:
        """:meth:`get_now`'s ``(value, flags)``, or None for a miss: no Item built, and
        with ``checked`` the key is known valid (:func:`validate_key`), as the backend's
        keys are. The backend's get, the commonest call of all."""
        if not checked:
            validate_key(key)
        return self.value_at(self.cluster.node_index(key), key, _monotonic())

    def value_at(self, node: int, key: bytes, now: float) -> tuple[bytes, int] | None:
        """:meth:`value_now` of a valid ``key`` for a caller that knows its ``node`` and
        read the clock (``time.monotonic()``) just before: the disk tier, which reads both
        for checks of its own first, pays for them once."""
        deadline = now + self._timeout
        connection = self._ready(node, _RETRIEVAL, deadline)
        try:
            # Compiled, one bytes object built at once (two with +).
            connection.send(b"get %s\r\n" % key, deadline)
            reply = connection.receive_value(key, deadline)
        except BaseException as exc:
            if not self._again(node, connection, _RETRIEVAL, exc):
                raise
            # The server had closed the connection: once more, on a new one.
            connection = self._ready(node, _RETRIEVAL, deadline)
            try:
                connection.bound(deadline)
                connection.send(b"get %s\r\n" % key, deadline)
                reply = connection.receive_value(key, deadline)
            except BaseException as exc:
                self._broken(node, _RETRIEVAL, exc)
                raise
        if self.timed or connection.report_reply:
            self._replied(node, connection, _RETRIEVAL, deadline)
        if reply.__class__ is tuple:  # the common case, told apart without isinstance()
            return reply if reply else None
        if isinstance(reply, CommandError):
            raise self._error_reply(node, _RETRIEVAL, reply)
        return reply if reply else None

    def store_now(
        self,
        verb: bytes,
        key: bytes,
        value: bytes,
        flags: int,
        exptime: int,
        checked: bool = False,
    ) -> bool:
        """:meth:`~CommandSet.set` (``verb`` b"set"), ``add`` or ``replace``, as a plain call.

        ``checked``: every argument is known valid, as the backend's are (a valid key,
        verb and exptime, flags below 2**32, ``value`` bytes): the request is put together
        without checking them again."""
        if checked:
            data = b"%s %s %d %d %d\r\n%s\r\n" % (verb, key, flags, exptime, len(value), value)
        else:
            data = storage_command(verb, key, value, flags=flags, exptime=exptime)
        return self.request(self.cluster.node_index(key), data, _STORAGE) is Status.STORED

    def add_seeing_now(
        self, key: bytes, value: bytes, flags: int, exptime: int
    ) -> tuple[bool, tuple[bytes, int] | None]:
        """:meth:`store_now` of ``add`` and, in the same request, ``get`` of the key: whether
        the add took and, when it was refused, what held the key then (``(value, flags)``,
        or None when nothing did any more: it expired or went meanwhile). Every argument is
        valid, as the backend's are.

        For the backend's ``add`` where get_or_set's leases leave stubs, which a refused add
        must tell from values: one round trip where an add and then a get take two. A stored
        add reads its own value back, so the backend sends this only for short values
        (:data:`~.commands.ADD_SEEING_MAX`). The get is counted as part of the add's call."""
        node = self.cluster.node_index(key)
        size = len(value)
        data = b"add %s %d %d %d\r\n%s\r\nget %s\r\n" % (key, flags, exptime, size, value, key)
        own = b"VALUE %s %d %d\r\n" % (key, flags, size)
        deadline = _monotonic() + self._timeout
        connection = self._ready(node, _STORAGE, deadline)
        try:
            connection.send(data, deadline)
            status, held = connection.receive_status_and_value(key, deadline, own, size)
        except BaseException as exc:
            self._broken(node, _STORAGE, exc)
            raise
        if self.timed or connection.report_reply:
            self._replied(node, connection, _STORAGE, deadline)
        if isinstance(status, CommandError):
            raise self._error_reply(node, _STORAGE, status)
        if status is Status.STORED:
            return True, None
        if isinstance(held, CommandError):
            raise self._error_reply(node, _STORAGE, held)  # (the get is part of the add's call)
        return False, held if held else None

    def delete_now(self, key: bytes, checked: bool = False) -> bool:
        """:meth:`~CommandSet.delete`, as a plain call (``checked``: the key is valid)."""
        data = b"delete %s\r\n" % key if checked else delete_command(key)
        return self.request(self.cluster.node_index(key), data, _DELETE) is Status.DELETED

    def touch_now(self, key: bytes, exptime: int) -> bool:
        """:meth:`~CommandSet.touch`, as a plain call."""
        data = touch_command(key, exptime)
        return self.request(self.cluster.node_index(key), data, _TOUCH) is Status.TOUCHED

    def incr_now(self, key: bytes, delta: int, checked: bool = False) -> int | None:
        """:meth:`~CommandSet.incr` (``delta`` >= 0) or ``decr`` (``delta`` < 0), as a
        plain call: the new value, or None when ``key`` does not exist. ``checked``: the
        key is valid (``delta`` is still checked: it comes from the caller)."""
        if checked and type(delta) is int and -_UINT64_MAX <= delta <= _UINT64_MAX:
            if delta < 0:
                data = b"decr %s %d\r\n" % (key, -delta)
            else:
                data = b"incr %s %d\r\n" % (key, delta)
        elif type(delta) is not int:
            data = incr_command(key, delta)  # refused: not an int (a bool neither)
        else:
            data = decr_command(key, -delta) if delta < 0 else incr_command(key, delta)
        try:
            reply = self.request(self.cluster.node_index(key), data, _ARITHMETIC)
        except ClientError:
            # Perhaps a counter memcached refuses by mistake: sent again, and counted here
            # if refused again (the rare path, as a coroutine).
            return run_blocking(self._arithmetic(data, key, False, delta))
        return None if reply is Status.NOT_FOUND else int(reply)

    def meta_at(self, node: int, data: bytes) -> MetaReply:
        """The reply to one meta command (``data``: its whole line, of a valid key and
        flags that draw exactly one reply) sent to ``node``, as a plain call: the disk
        tier's flat paths, which build their few commands at once. An error reply is
        raised (``ERROR``: :class:`MetaUnsupportedError`; unsent, where this client sends
        no meta command: ``ClientSettings.meta``)."""
        if not self._meta:
            raise meta_unsent()
        return only_reply(self.request(node, data + b"mn\r\n", _META))

    def count_at(self, node: int, key: bytes, delta: int) -> tuple[int, int | None] | None:
        """:meth:`~MetaCommands.meta_arithmetic` of a valid ``key`` on ``node``, as a plain
        call: ``(new value, seconds left or -1)``, or None when the key is missing (NF).
        ``delta`` is an int, negative to subtract. The disk tier's increment, which needs
        the TTL for its disk copy (:func:`count_line`, :func:`counted`)."""
        line = count_line(key, delta)
        try:
            return counted(self.meta_at(node, line))
        except ClientError:
            # Perhaps a counter memcached refuses by mistake: as incr_now.
            return run_blocking(self.count_line_at(node, key, delta, line))

    # -- the I/O primitives (coroutines that never suspend) ------------------------------
    async def _request(
        self,
        node: int,
        data: bytes,
        kind: ReplyKind,
        meanwhile: Meanwhile = None,
        keys: Sequence[bytes] | None = None,
    ) -> Any:
        return self.request(node, data, kind, meanwhile, keys)

    async def _send_noreply(self, node: int, data: bytes) -> None:
        deadline = _monotonic() + self._timeout
        connection = self._connection(node, deadline)
        try:
            connection.send(data, deadline)
        except FastCacheError:
            self._discard(node)
            raise
        # No reply to restore the timeout a new connection's connect (or a long send)
        # shortened: the next request's first read must have all of its own.
        connection._restore_kernel_timeout()

    async def _pipelines(self, requests: Requests, expected: Expected | None = None) -> Replies:
        results: Replies = {}
        if len(requests) == 1:
            for node, (data, kinds) in requests.items():
                try:
                    keys = None if expected is None else expected.get(node)
                    results[node] = self._exchange(node, data, kinds, keys)
                except FastCacheError as exc:
                    results[node] = exc
            return results
        # Several nodes: write to all of them first, then read, so they work in parallel
        # and within one shared timeout.
        deadline = _monotonic() + self._timeout
        connections = self._local.by_node
        sent: list[int] = []
        for node, (data, kinds) in requests.items():
            try:
                connection = self._connection(node, deadline)
                connection.calls[kinds[0]] += 1
                connection.send(data, deadline)
                sent.append(node)
            except FastCacheError as exc:
                self._discard(node)
                self._failed(node, kinds[0], exc)
                results[node] = exc
        try:
            for node in sent:
                try:
                    keys = None if expected is None else expected.get(node)
                    kinds = requests[node][1]
                    connection = connections[node]
                    results[node] = connection.receive(kinds, deadline, keys, False)
                    self._replied(node, connection, kinds[0], deadline)
                except FastCacheError as exc:
                    self._discard(node)
                    self._failed(node, requests[node][1][0], exc)
                    results[node] = exc
        except BaseException:
            for node in sent:
                if node not in results:
                    self._discard(node)
            raise
        return results

    # -- lifecycle -----------------------------------------------------------------------
    def close_thread_connections(self) -> None:
        """Close the calling thread's connections."""
        for node in list(self._local.by_node):
            self._discard(node)
