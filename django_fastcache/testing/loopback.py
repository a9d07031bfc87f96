"""A threaded TCP server on a free loopback port: the base of the test doubles.

Subclasses say what to do with each accepted connection (:meth:`_connected`) and how to
close the connections they keep (:meth:`_close_connections`); starting, the accept loop,
thread bookkeeping and stopping are here. :class:`ThreadPerConnectionServer` does both for
the usual case, a thread per connection. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

Server = TypeVar("Server", bound="LoopbackServer")


class LoopbackServer:
    #: Names the server's threads (for debugging a hung test).
    thread_name = "loopback-server"

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None

    @property
    def location(self) -> str:
        return f"{self.host}:{self.port}"

    # -- what subclasses provide -----------------------------------------------------------
    def _connected(self, sock: socket.socket) -> None:
        """Take over a newly accepted connection (blocking, TCP_NODELAY already set)."""
        raise NotImplementedError

    def _close_connections(self) -> None:
        """Close every connection kept, so that their threads end."""
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------
    def start(self: Server) -> Server:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(64)
        listener.settimeout(0.05)  # the accept loop looks at ``stopping`` this often
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._spawn(self._accept_loop, name=f"{self.thread_name}-accept")
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._close_connections()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self: Server) -> Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, target: Callable[..., None], *args: object, name: str = "") -> None:
        thread = threading.Thread(
            target=target, args=args, name=name or self.thread_name, daemon=True
        )
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self.stopping.is_set():
            try:
                sock, _address = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connected(sock)


class ThreadPerConnectionServer(LoopbackServer):
    """Serves each connection in a thread of its own (:meth:`_serve`); stopping closes
    every connection's socket, which ends those threads."""

    def __init__(self) -> None:
        super().__init__()
        self._sockets: list[socket.socket] = []

    def _serve(self, sock: socket.socket) -> None:
        """Serve one connection (its thread's whole life)."""
        raise NotImplementedError

    def _adopt(self, plain: socket.socket, wrapped: socket.socket) -> None:
        """``wrapped`` (a TLS socket made of ``plain``) now owns the connection's
        descriptor: stopping must close that one."""
        with self._lock:
            self._sockets = [wrapped if sock is plain else sock for sock in self._sockets]

    def _connected(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
        self._spawn(self._serve, sock)

    def _close_connections(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
