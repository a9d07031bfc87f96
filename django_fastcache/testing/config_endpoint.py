"""A fake cluster configuration endpoint (ElastiCache's, Memorystore's) for autodiscovery tests.

It answers ``config get cluster`` with the node list it is given, which a test changes
between refreshes with :meth:`FakeConfigEndpoint.set_nodes` (the version goes up by one
each time, as the real services do). Replies are written ``chunk`` bytes at a time (one by
default), each piece a separate ``send`` with TCP_NODELAY, so the client's reads see them
split at every possible point. ``fail`` makes it misbehave instead: ``"error"`` answers
``ERROR``, ``"close"`` drops the connection unanswered, ``"garbage"`` answers bytes that are
not a config reply. With ``tls`` (a server-side ``SSLContext``) it speaks TLS.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Sequence

from .loopback import ThreadPerConnectionServer

__all__ = ["FakeConfigEndpoint", "config_reply"]


def config_reply(version: int, nodes: Sequence[tuple[str, str, int]]) -> bytes:
    """The reply to ``config get cluster`` for ``nodes`` (hostname, ip, port)."""
    listed = " ".join(f"{host}|{ip}|{port}" for host, ip, port in nodes)
    payload = f"{version}\n{listed}\n".encode()
    return b"CONFIG cluster 0 %d\r\n%s\r\nEND\r\n" % (len(payload), payload)


class FakeConfigEndpoint(ThreadPerConnectionServer):
    thread_name = "fake-config-endpoint"

    def __init__(
        self,
        nodes: Sequence[tuple[str, str, int]] = (),
        chunk: int = 1,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__()
        #: A server-side context: the endpoint then speaks TLS.
        self.tls = tls
        self.version = 1
        self.nodes: list[tuple[str, str, int]] = list(nodes)
        self.chunk = chunk
        #: None, or how to misbehave: "error", "close" or "garbage".
        self.fail: str | None = None
        #: ``config get cluster`` requests received.
        self.requests = 0

    def set_nodes(self, nodes: Sequence[tuple[str, str, int]]) -> None:
        """A new node list, under the next configuration version."""
        with self._lock:
            self.nodes = list(nodes)
            self.version += 1

    def wait_for(self, condition: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _serve(self, sock: socket.socket) -> None:
        buffer = b""
        if self.tls is not None:
            plain = sock
            try:
                sock = self.tls.wrap_socket(plain, server_side=True)
            except (OSError, ssl.SSLError):
                plain.close()
                return
            self._adopt(plain, sock)
        try:
            while not self.stopping.is_set():
                data = sock.recv(4096)
                if not data:
                    return
                buffer += data
                while b"\r\n" in buffer:
                    line, buffer = buffer.split(b"\r\n", 1)
                    if not self._answer(sock, line):
                        return
        except OSError:
            return

    def _answer(self, sock: socket.socket, line: bytes) -> bool:
        if line != b"config get cluster":
            sock.sendall(b"ERROR\r\n")
            return True
        with self._lock:
            self.requests += 1
            reply = config_reply(self.version, self.nodes)
            fail = self.fail
        if fail == "close":
            sock.close()
            return False
        if fail == "error":
            reply = b"ERROR\r\n"
        elif fail == "garbage":
            reply = b"VALUE nonsense 0 1\r\nx\r\nEND\r\n"
        for start in range(0, len(reply), self.chunk):
            sock.sendall(reply[start : start + self.chunk])
        return True
