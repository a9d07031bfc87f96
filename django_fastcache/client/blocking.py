"""The commands over blocking sockets owned by the calling thread.

:class:`BlockingClient` shares the command code, the protocol and the cluster view with the
asyncio :class:`~django_fastcache.client.client.Client`; only the I/O differs. Its
coroutines never suspend, so :func:`django_fastcache.bridge.run_blocking` finishes them with
a single ``send(None)`` — no event loop, no thread hop. Measured on loopback this is as fast
as a C client, where ``run_until_complete`` on a private loop was about twice as slow (and
uvloop's, on the main thread, three times).

Each thread keeps one connection per node. A connection that times out, breaks or
receives bytes that do not parse is closed at once, so a late reply is never read as the
next request's answer. After ``fork()`` the child opens its own connections (the
inherited sockets are closed in the child, which leaves the parent's untouched).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from typing import Any

from ..errors import (
    CommandError,
    ConnectFailedError,
    ConnectionLostError,
    FastCacheError,
    OperationTimeoutError,
)
from ..protocol import ReplyKind, ReplyParser
from . import forksafe
from .address import Address
from .cluster import Cluster
from .commands import CommandSet, Meanwhile, Replies, Requests

_RECV_SIZE = 256 * 1024


def _set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    # A struct timeval: two native longs on Linux (and the same 16 bytes on macOS).
    whole = int(seconds)
    timeval = struct.pack("@ll", whole, max(1, int((seconds - whole) * 1_000_000)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class BlockingConnection:
    """One blocking socket to one node, with its own reply parser."""

    __slots__ = ("_fd", "_kernel_timeout", "_parser", "_poll", "_sock", "address", "timeout")

    def __init__(self, address: Address, timeout: float, connect_timeout: float,
                 max_value_size: int) -> None:  # fmt: skip
        self.address = address
        self.timeout = timeout
        try:
            if address.path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(connect_timeout)
                try:
                    sock.connect(address.path)
                except BaseException:
                    sock.close()
                    raise
            else:
                assert address.host is not None
                assert address.port is not None
                sock = socket.create_connection((address.host, address.port), connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError:
            raise OperationTimeoutError(
                f"connecting to {address} took longer than {connect_timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectFailedError(f"cannot connect to {address}: {exc}") from exc
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

    def readable(self) -> bool:
        """Whether the server sent anything (bytes, end of stream, an error) since last read.

        Between requests the server has nothing to say: bytes now answer nothing and would be
        read as the next request's reply, and end of stream means the server closed the
        connection. A zero-timeout poll costs well under a microsecond.
        """
        # Bytes already read but used by no reply count too: the server sent more than
        # it was asked for, and the stream is out of step.
        return self._parser.unread > 0 or bool(self._poll.poll(0))

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except (BlockingIOError, TimeoutError):  # SO_SNDTIMEO ran out
            raise OperationTimeoutError(f"sending to {self.address} timed out") from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc

    def receive(self, kinds: list[ReplyKind], deadline: float = 0.0) -> list[Any]:
        """The replies to requests already sent, in order (error replies included).

        The wait is bounded by ``timeout`` from when it starts, or by ``deadline`` (a
        ``time.monotonic()`` value) when one is given, e.g. shared by several nodes' reads.
        """
        parser = self._parser
        recv = self._sock.recv
        replies: list[Any] = []
        first_read = deadline == 0.0
        for kind in kinds:
            reply = parser.next_reply(kind)
            while reply is None:
                flags = 0
                if first_read:
                    # The common case, one read: the kernel timeout is the call's timeout.
                    first_read = False
                    deadline = time.monotonic() + self.timeout
                elif not self._shorten_timeout(deadline):
                    # Past the deadline: take only what has already arrived (another node
                    # may have used up the shared deadline while this reply sat here).
                    flags = socket.MSG_DONTWAIT
                try:
                    chunk = recv(_RECV_SIZE, flags)
                except (BlockingIOError, TimeoutError):  # SO_RCVTIMEO ran out
                    raise OperationTimeoutError(
                        f"no reply from {self.address} within {self.timeout}s"
                    ) from None
                except OSError as exc:
                    raise ConnectionLostError(f"connection to {self.address} lost: {exc}") from exc
                if not chunk:
                    raise ConnectionLostError(f"{self.address} closed the connection")
                parser.feed(chunk)
                reply = parser.next_reply(kind)
            replies.append(reply)
        if self._kernel_timeout != self.timeout:
            self._kernel_timeout = self.timeout
            _set_kernel_timeouts(self._sock, self.timeout)
        return replies

    def _shorten_timeout(self, deadline: float) -> bool:
        """Make the next read wait no longer than what is left until ``deadline``; False
        when nothing is left."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if remaining < self._kernel_timeout:
            self._kernel_timeout = remaining
            _set_kernel_timeouts(self._sock, remaining)
        return True

    def close(self) -> None:
        self._sock.close()


class _ThreadConnections(threading.local):
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.by_node: dict[int, BlockingConnection] = {}


class BlockingClient(CommandSet):
    """The commands over blocking sockets; drive its coroutines with ``run_blocking``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._local = _ThreadConnections()
        forksafe.register(self)

    def _connection(self, node: int) -> BlockingConnection:
        local = self._local
        connection = local.by_node.get(node)
        if connection is not None and connection.readable():
            # Unsolicited bytes or a closed connection: it cannot carry a request. Start afresh.
            self._discard(node)
            connection = None
        if connection is None:
            settings = self.cluster.settings
            connection = BlockingConnection(
                self.cluster.addresses[node],
                settings.timeout,
                settings.connect_timeout,
                settings.max_value_size,
            )
            local.by_node[node] = connection
        return connection

    def _discard(self, node: int) -> None:
        connection = self._local.by_node.pop(node, None)
        if connection is not None:
            connection.close()

    def _exchange(
        self, node: int, data: bytes, kinds: list[ReplyKind], meanwhile: Meanwhile = None
    ) -> list[Any]:
        connection = self._connection(node)
        try:
            connection.send(data)
            if meanwhile is not None:
                meanwhile()
            return connection.receive(kinds)
        except BaseException:
            # Interrupted half-way, the stream is out of step: never reuse it.
            self._discard(node)
            raise

    # -- the I/O primitives (coroutines that never suspend) ------------------------------
    async def _request(
        self, node: int, data: bytes, kind: ReplyKind, meanwhile: Meanwhile = None
    ) -> Any:
        reply = self._exchange(node, data, [kind], meanwhile)[0]
        if isinstance(reply, CommandError):
            raise reply
        return reply

    async def _send_noreply(self, node: int, data: bytes) -> None:
        connection = self._connection(node)
        try:
            connection.send(data)
        except FastCacheError:
            self._discard(node)
            raise

    async def _pipelines(self, requests: Requests) -> Replies:
        results: Replies = {}
        if len(requests) == 1:
            for node, (data, kinds) in requests.items():
                try:
                    results[node] = self._exchange(node, data, kinds)
                except FastCacheError as exc:
                    results[node] = exc
            return results
        # Several nodes: write to all of them first, then read, so they work in parallel
        # and within one shared timeout.
        deadline = time.monotonic() + self.cluster.settings.timeout
        connections = self._local.by_node
        sent: list[int] = []
        for node, (data, _kinds) in requests.items():
            try:
                self._connection(node).send(data)
                sent.append(node)
            except FastCacheError as exc:
                self._discard(node)
                results[node] = exc
        try:
            for node in sent:
                try:
                    results[node] = connections[node].receive(requests[node][1], deadline)
                except FastCacheError as exc:
                    self._discard(node)
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

    def _forget_after_fork(self) -> object:
        # Plain sockets: closing the child's copies leaves the parent's connections open.
        for connection in self._local.by_node.values():
            connection.close()
        self._local = _ThreadConnections()
        return None
