"""A TCP proxy that adds latency, for fault tests: a slow memcached node.

:class:`DelayProxy` listens on a free port of 127.0.0.1 and forwards every connection to an
upstream server (a real memcached), holding each chunk of bytes for :attr:`DelayProxy.delay`
seconds before passing it on, in both directions. The delay can be changed while the proxy
runs; it applies to bytes received from then on. Nothing is dropped or reordered: a slow
node still answers, only late. Each connection is served by threads of its own, so the proxy
works the same for asyncio and for blocking clients.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import time

from .loopback import LoopbackServer

__all__ = ["DelayProxy"]

_CHUNK = 256 * 1024


class _Pipe:
    """One direction of one connection: read, hold for the delay, write."""

    def __init__(
        self, proxy: DelayProxy, source: socket.socket, sink: socket.socket, replies: bool
    ) -> None:
        self.proxy = proxy
        #: Whether this pipe carries the server's replies (else the client's requests).
        self.replies = replies
        self.source = source
        self.sink = sink
        # (when it may be sent, the bytes); None ends the stream.
        self.pending: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        #: The source reset the connection (an abortive close).
        self.reset = False

    def read(self) -> None:
        try:
            while True:
                try:
                    chunk = self.source.recv(_CHUNK)
                except ConnectionResetError:
                    self.reset = True
                    chunk = b""
                except OSError:
                    chunk = b""
                if not chunk:
                    return
                self.proxy._held(len(chunk))
                delay = self.proxy.delay
                if self.replies and self.proxy.requests_only:
                    delay = 0.0
                self.pending.put((time.monotonic() + delay, chunk))
        finally:
            self.pending.put(None)

    def write(self) -> None:
        try:
            while True:
                item = self.pending.get()
                if item is None:
                    break
                due, chunk = item
                wait = due - time.monotonic()
                if wait > 0 and self.proxy.stopping.wait(wait):
                    break
                if self.reset and self.proxy.partition:
                    self.proxy._held(-len(chunk))  # still "unsent" at the reset: discarded
                    continue
                try:
                    self.sink.sendall(chunk)
                finally:
                    self.proxy._held(-len(chunk))
        except OSError:
            pass
        finally:
            # The other side learns the stream ended, as it would without the proxy.
            with contextlib.suppress(OSError):
                self.sink.shutdown(socket.SHUT_WR)


class DelayProxy(LoopbackServer):
    """Forward connections to ``upstream`` (``"host:port"``), ``delay`` seconds late."""

    def __init__(self, upstream: str, delay: float = 0.0, *, partition: bool = False) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        #: Seconds every chunk is held, each way. May be changed at any time.
        self.delay = delay
        #: Model a partition rather than a slow path: held bytes are still in their
        #: sender's send queue, so a sender that resets its connection (an abortive
        #: close) discards them, while after a graceful close they are still delivered,
        #: late, as TCP would retransmit them once the partition heals.
        self.partition = partition
        #: Hold only the client's requests; the server's replies pass at once.
        self.requests_only = False
        super().__init__()
        self._sockets: list[socket.socket] = []
        self._pending = 0
        #: Connections accepted so far.
        self.connections = 0

    thread_name = "delay-proxy"

    def pending_bytes(self) -> int:
        """Bytes received and not yet passed on (held for the delay), both ways."""
        with self._lock:
            return self._pending

    def _held(self, count: int) -> None:
        with self._lock:
            self._pending += count

    def _close_connections(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _connected(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()  # upstream down: the client sees the connection refused late
            return
        server.settimeout(None)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self.connections += 1
            self._sockets += [client, server]
        for pipe in (_Pipe(self, client, server, False), _Pipe(self, server, client, True)):
            self._spawn(pipe.read)
            self._spawn(pipe.write)
