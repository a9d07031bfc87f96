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
import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["DelayProxy"]

_CHUNK = 256 * 1024


class _Pipe:
    """One direction of one connection: read, hold for the delay, write."""

    def __init__(self, proxy: DelayProxy, source: socket.socket, sink: socket.socket) -> None:
        self.proxy = proxy
        self.source = source
        self.sink = sink
        # (when it may be sent, the bytes); None ends the stream.
        self.pending: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

    def read(self) -> None:
        try:
            while True:
                try:
                    chunk = self.source.recv(_CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    return
                self.proxy._held(len(chunk))
                self.pending.put((time.monotonic() + self.proxy.delay, chunk))
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


class DelayProxy:
    """Forward connections to ``upstream`` (``"host:port"``), ``delay`` seconds late."""

    def __init__(self, upstream: str, delay: float = 0.0) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        #: Seconds every chunk is held, each way. May be changed at any time.
        self.delay = delay
        self.host = "127.0.0.1"
        self.port = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._pending = 0
        #: Connections accepted so far.
        self.connections = 0

    @property
    def location(self) -> str:
        return f"{self.host}:{self.port}"

    def pending_bytes(self) -> int:
        """Bytes received and not yet passed on (held for the delay), both ways."""
        with self._lock:
            return self._pending

    def _held(self, count: int) -> None:
        with self._lock:
            self._pending += count

    def start(self) -> DelayProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(64)
        listener.settimeout(0.05)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in threads:
            thread.join(5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="delay-proxy", daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self.stopping.is_set():
            try:
                client, _address = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # upstream down: the client sees the connection refused late
                continue
            for sock in (client, server):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._sockets += [client, server]
            for pipe in (_Pipe(self, client, server), _Pipe(self, server, client)):
                self._spawn(pipe.read)
                self._spawn(pipe.write)
