"""A small fake memcached that can be scripted to misbehave, for fault tests.

A real memcached never sends garbage, never stops half-way through a reply and never answers
a request it was not sent. :class:`FakeMemcached` does, on request: it listens on a free port
of 127.0.0.1, speaks enough of the text protocol to answer get/gets/gat/gats, the storage
commands, delete, touch, incr/decr, version, stats, flush_all and verbosity from an
in-memory dict, and answers each request according to the next scripted :class:`Action`
(the ``default`` one once the script has run out).

Each client connection is served by its own thread, so the fake works the same for asyncio
and for blocking clients. Everything the fake saw is counted (connections accepted, closed by
the client, requests and bytes received) so tests can check what reached the wire; waits go
through :meth:`FakeMemcached.wait_for`, which polls a condition until a deadline.
"""

from __future__ import annotations

import enum
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .loopback import LoopbackServer

__all__ = ["Action", "FakeMemcached", "Request"]

_STORAGE_VERBS = frozenset((b"set", b"add", b"replace", b"append", b"prepend", b"cas"))
_RETRIEVAL_VERBS = frozenset((b"get", b"gets", b"gat", b"gats"))
_MAX_LINE = 64 * 1024


class Action(enum.Enum):
    """What the fake does with one request."""

    #: Answer correctly (nothing for a noreply request).
    REPLY = "reply"
    #: Answer with bytes that are not a memcached reply (:attr:`FakeMemcached.garbage`).
    GARBAGE = "garbage"
    #: Send the first half of the correct answer, then close the connection.
    TRUNCATE = "truncate"
    #: Keep the correct answer back and send it, late, on its own connection as soon as any
    #: later request reaches the server (before that request is answered).
    HOLD = "hold"
    #: Never answer; keep the connection open.
    IGNORE = "ignore"
    #: Answer correctly after :attr:`FakeMemcached.slow_delay` seconds.
    SLOW = "slow"
    #: Close the connection without answering (requests pipelined behind are dropped too).
    CLOSE = "close"
    #: Answer correctly, then send :attr:`FakeMemcached.extra`, a reply to nothing, in the
    #: same write.
    EXTRA = "extra"


@dataclass
class _Peer:
    sock: socket.socket
    number: int
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    closed_by_server: bool = False

    def send(self, data: bytes) -> bool:
        with self.write_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                return False
        return True

    def close(self) -> None:
        self.closed_by_server = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


@dataclass(frozen=True)
class Request:
    """One request as the fake received it."""

    connection: int  # the number of the connection it came on, from 1
    line: bytes  # the command line, without CRLF
    data: bytes | None  # the data block of a storage command, without CRLF


class FakeMemcached(LoopbackServer):
    """A scripted, misbehaving memcached on a free loopback port. Use it as a context manager."""

    def __init__(
        self,
        *,
        values: Mapping[bytes, bytes] | None = None,
        default: Action = Action.REPLY,
        close_on_connect: bool = False,
        slow_delay: float = 0.2,
        garbage: bytes = b"HELLO THERE\r\n",
        extra: bytes = b"END\r\n",
    ) -> None:
        #: The items the fake serves: key to value (flags are always 0).
        self.values: dict[bytes, bytes] = dict(values or {})
        self.default = default
        #: Accept connections and close them at once, before reading anything.
        self.close_on_connect = close_on_connect
        self.slow_delay = slow_delay
        self.garbage = garbage
        self.extra = extra
        super().__init__()
        self._script: deque[Action] = deque()
        self._held: list[tuple[_Peer, bytes]] = []
        self._peers: list[_Peer] = []
        self._requests: list[Request] = []
        self._accepted = 0
        self._closed_by_client: list[int] = []
        self._bytes_received = 0
        self._cas = 0

    thread_name = "fake-memcached"

    def _close_connections(self) -> None:
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            peer.close()

    # -- scripting and observation ---------------------------------------------------------
    def script(self, *actions: Action) -> None:
        """Queue actions for the next requests, in the order the requests arrive."""
        with self._lock:
            self._script.extend(actions)

    def send_unsolicited(self, data: bytes) -> int:
        """Write ``data`` on every open connection; returns how many took it."""
        with self._lock:
            peers = [peer for peer in self._peers if not peer.closed_by_server]
        return sum(peer.send(data) for peer in peers)

    @property
    def scripted(self) -> int:
        """Actions queued by :meth:`script` that no request has taken yet. Requests on
        different connections take them in the order the server threads read them, so a
        test that scripts one connection's request and then opens another waits for this
        to drop before sending there."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    @property
    def accepted(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return self._accepted

    @property
    def closed_by_client(self) -> list[int]:
        """The numbers of the connections the client closed (end of stream or a reset seen)."""
        with self._lock:
            return sorted(self._closed_by_client)

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return self._bytes_received

    def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Poll ``condition`` until it holds or ``timeout`` seconds pass; return its last value."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline:
                return condition()
            time.sleep(0.005)
        return True

    # -- serving ---------------------------------------------------------------------------
    def _connected(self, sock: socket.socket) -> None:
        with self._lock:
            self._accepted += 1
            peer = _Peer(sock, self._accepted)
            self._peers.append(peer)
        if self.close_on_connect:
            peer.close()
            return
        self._spawn(self._serve, peer, name=f"fake-memcached-{peer.number}")

    def _serve(self, peer: _Peer) -> None:
        buffer = bytearray()
        while not self.stopping.is_set():
            try:
                chunk = peer.sock.recv(256 * 1024)
            except OSError:
                chunk = b""
            if not chunk:
                if not peer.closed_by_server:
                    with self._lock:
                        self._closed_by_client.append(peer.number)
                    peer.closed_by_server = True
                    peer.sock.close()
                return
            with self._lock:
                self._bytes_received += len(chunk)
            buffer += chunk
            while True:
                request = self._take_request(peer, buffer)
                if request is None:
                    break
                if not self._handle(peer, request):
                    return
            if len(buffer) > _MAX_LINE and b"\r\n" not in buffer:
                peer.close()
                return

    def _take_request(self, peer: _Peer, buffer: bytearray) -> Request | None:
        end = buffer.find(b"\r\n")
        if end < 0:
            return None
        line = bytes(buffer[:end])
        words = line.split()
        data: bytes | None = None
        consumed = end + 2
        if words and words[0] in _STORAGE_VERBS and len(words) >= 5 and words[4].isdigit():
            length = int(words[4])
            if len(buffer) < consumed + length + 2:
                return None
            data = bytes(buffer[consumed : consumed + length])
            consumed += length + 2
        del buffer[:consumed]
        request = Request(peer.number, line, data)
        with self._lock:
            self._requests.append(request)
        return request

    def _handle(self, peer: _Peer, request: Request) -> bool:
        """Answer one request as scripted; False when the connection was closed."""
        with self._lock:
            held, self._held = self._held, []
            action = self._script.popleft() if self._script else self.default
        for late_peer, late_reply in held:
            late_peer.send(late_reply)
        reply = self._answer(request)
        if action is Action.REPLY:
            return not reply or peer.send(reply)
        if action is Action.GARBAGE:
            return peer.send(self.garbage)
        if action is Action.TRUNCATE:
            full = reply or b"VALUE truncated 0 10\r\n0123456789\r\nEND\r\n"
            peer.send(full[: max(1, len(full) // 2)])
            peer.close()
            return False
        if action is Action.HOLD:
            with self._lock:
                self._held.append((peer, reply))
            return True
        if action is Action.IGNORE:
            return True
        if action is Action.SLOW:
            if self.stopping.wait(self.slow_delay):
                return False
            return not reply or peer.send(reply)
        if action is Action.CLOSE:
            peer.close()
            return False
        if action is Action.EXTRA:
            return peer.send(reply + self.extra)
        raise AssertionError(f"unknown action {action!r}")

    # -- a tiny memcached --------------------------------------------------------------------
    def _answer(self, request: Request) -> bytes:
        words = request.line.split()
        if not words:
            return b"ERROR\r\n"
        verb, args = words[0], words[1:]
        noreply = bool(args) and args[-1] == b"noreply"
        if noreply:
            args = args[:-1]
        with self._lock:
            reply = self._execute(verb, args, request.data)
        return b"" if noreply else reply

    def _execute(self, verb: bytes, args: list[bytes], data: bytes | None) -> bytes:
        values = self.values
        if verb in _RETRIEVAL_VERBS:
            keys = args[1:] if verb in (b"gat", b"gats") else args
            with_cas = verb in (b"gets", b"gats")
            parts = []
            for key in keys:
                value = values.get(key)
                if value is None:
                    continue
                cas = b" %d" % self._cas if with_cas else b""
                parts.append(b"VALUE %s 0 %d%s\r\n%s\r\n" % (key, len(value), cas, value))
            return b"".join(parts) + b"END\r\n"
        if verb in _STORAGE_VERBS and data is not None and args:
            key = args[0]
            exists = key in values
            if (verb == b"add" and exists) or (verb == b"replace" and not exists):
                return b"NOT_STORED\r\n"
            if verb in (b"append", b"prepend", b"cas") and not exists:
                return b"NOT_STORED\r\n" if verb != b"cas" else b"NOT_FOUND\r\n"
            if verb == b"append":
                data = values[key] + data
            elif verb == b"prepend":
                data = data + values[key]
            values[key] = data
            self._cas += 1
            return b"STORED\r\n"
        if verb == b"delete" and args:
            return b"DELETED\r\n" if values.pop(args[0], None) is not None else b"NOT_FOUND\r\n"
        if verb == b"touch" and args:
            return b"TOUCHED\r\n" if args[0] in values else b"NOT_FOUND\r\n"
        if verb in (b"incr", b"decr") and len(args) == 2:
            current = values.get(args[0])
            if current is None:
                return b"NOT_FOUND\r\n"
            delta = int(args[1]) if verb == b"incr" else -int(args[1])
            number = max(0, int(current) + delta) % 2**64
            values[args[0]] = b"%d" % number
            return b"%d\r\n" % number
        if verb == b"version":
            return b"VERSION fake-1.0\r\n"
        if verb == b"stats":
            return b"STAT fake 1\r\nEND\r\n"
        if verb in (b"flush_all", b"verbosity"):
            if verb == b"flush_all":
                values.clear()
            return b"OK\r\n"
        return b"ERROR\r\n"
