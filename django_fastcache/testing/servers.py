"""Real memcached and redis processes on loopback, for tests and the benchmark.

Each server is started on a free TCP port of 127.0.0.1 (or on a unix socket) and is ready
when :meth:`start` returns: readiness is checked by connecting and asking ``version`` /
``PING``, never by sleeping. Servers are stopped (and reaped) by :meth:`stop` or by leaving
the ``with`` block.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

START_TIMEOUT = 10.0


class ServerNotAvailable(RuntimeError):
    """The server binary is not installed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ask(
    address: tuple[str, int] | str,
    request: bytes,
    expect: bytes,
    tls: ssl.SSLContext | None = None,
    login: bytes = b"",
) -> bool:
    """Whether ``request`` gets a reply containing ``expect``; ``login``: an authentication
    request sent first (its ``STORED`` reply is read before ``request`` goes out)."""
    return _problem(address, request, expect, tls, login) is None


def _problem(
    address: tuple[str, int] | str,
    request: bytes,
    expect: bytes,
    tls: ssl.SSLContext | None = None,
    login: bytes = b"",
) -> str | None:
    """What kept ``request`` from getting a reply containing ``expect``, or None: asked as
    :func:`_ask` asks, for an error that says why (a timeout, a refusal, another reply)."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as plain:
            plain.settimeout(1.0)
            plain.connect(address)
            sock = plain if tls is None else tls.wrap_socket(plain)
            if login:
                sock.sendall(login)
                line = _read_line(sock)
                if not line.startswith(b"STORED"):
                    return f"login refused: {line!r}"
            sock.sendall(request)
            reply = sock.recv(256)
            return None if expect in reply else f"the reply was {reply!r}"
    except OSError as exc:
        return repr(exc)


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        line += chunk
    return line


@dataclass(frozen=True)
class ServerTLS:
    """TLS for a test memcached (``-Z``): its certificate and key, and, to require client
    certificates (``ssl_verify_mode=2``), the CA that must have signed them."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    #: A client certificate and key the server accepts, for its own readiness checks.
    client_cert: str | None = None
    client_key: str | None = None


class _ServerProcess:
    binary = ""
    install_hint = ""
    #: How stop() ends the process: a server that keeps nothing can be killed outright.
    stop_signal = signal.SIGTERM

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.socket_path: str | None = None

    @classmethod
    def available(cls) -> bool:
        return shutil.which(cls.binary) is not None

    # -- what subclasses provide ------------------------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ping(self) -> bool:
        raise NotImplementedError

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> _ServerProcess:
        if not self.available():
            raise ServerNotAvailable(f"{self.binary} is not installed: {self.install_hint}")
        for _attempt in range(5):
            if self.socket_path is None:
                self.port = free_port()
            self.process = subprocess.Popen(
                self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break  # exited: most likely the port was taken in the meantime
                if self._ping():
                    return self
                time.sleep(0.01)
            self._reap()
        raise RuntimeError(f"{self.binary} did not start: {' '.join(self._command())}")

    def _reap(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)  # a stopped process ignores TERM
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def stop(self) -> None:
        self._reap()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            if self.process.stderr is not None:
                self.process.stderr.close()
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and data but answers nothing.

        Returns once every thread of the process has stopped: the signal is delivered
        asynchronously, and a request sent at once could otherwise still be answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.process.pid}/task")
        if not tasks.is_dir():  # no procfs to ask: nothing more can be known
            return
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            states = []
            for stat in tasks.glob("*/stat"):
                with contextlib.suppress(OSError, IndexError):
                    # The state is the first field after the parenthesised command name.
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            if states and all(state in ("T", "t") for state in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.binary} did not stop: thread states {states}")
            time.sleep(0.001)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self) -> _ServerProcess:
        """Stop and start again on the same address (the data is gone)."""
        keep_port = self.port
        self._reap()
        self.process = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.port = keep_port
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._ping():
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.binary} did not restart on port {keep_port}")
            time.sleep(0.01)
        raise RuntimeError(f"{self.binary} did not restart on port {keep_port}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> _ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class MemcachedServer(_ServerProcess):
    """A memcached process on a free loopback port, or on a unix socket when given a path.

    ``tls``: listen with TLS (TCP only: memcached speaks TLS on TCP listeners, not on unix
    sockets). ``users``: require ASCII authentication (``-Y``) with these usernames and
    passwords; the auth file is written to a private directory removed by :meth:`stop`.
    """

    binary = "memcached"
    install_hint = "apt-get install memcached"
    stop_signal = signal.SIGKILL  # it keeps nothing; SIGTERM waits for its clock tick

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        memory_mb: int = 64,
        item_size_max: str | None = None,
        extra_args: Sequence[str] = (),
        tls: ServerTLS | None = None,
        users: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.socket_path = None if socket_path is None else str(socket_path)
        self.memory_mb = memory_mb
        self.item_size_max = item_size_max
        self.extra_args = list(extra_args)
        self.tls = tls
        self.users = dict(users or {})
        self._auth_directory: tempfile.TemporaryDirectory[str] | None = None
        self._auth_file: str | None = None

    @classmethod
    def supports_tls(cls) -> bool:
        """Whether the installed memcached was built with TLS (its ``-Z`` option)."""
        if not cls.available():
            return False
        try:
            usage = subprocess.run(
                [cls.binary, "-h"], capture_output=True, text=True, timeout=START_TIMEOUT
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return False
        return "--enable-ssl" in usage

    @property
    def location(self) -> str:
        """The address as FastCache's LOCATION takes it."""
        if self.socket_path is not None:
            return f"unix:{self.socket_path}"
        return f"{self.host}:{self.port}"

    @property
    def pylibmc_location(self) -> str:
        """The address as Django's memcached backends take it."""
        if self.socket_path is not None:
            return self.socket_path
        return f"{self.host}:{self.port}"

    def _command(self) -> list[str]:
        command = [self.binary, "-m", str(self.memory_mb), "-U", "0", "-t", "2"]
        if os.geteuid() == 0:
            command += ["-u", "root"]
        if self.socket_path is not None:
            command += ["-s", self.socket_path, "-a", "0700"]
        else:
            command += ["-l", self.host, "-p", str(self.port)]
        if self.item_size_max:
            command += ["-I", self.item_size_max]
        if self.tls is not None:
            tls_options = [f"ssl_chain_cert={self.tls.cert_file}", f"ssl_key={self.tls.key_file}"]
            if self.tls.client_ca_file is not None:
                tls_options += ["ssl_verify_mode=2", f"ssl_ca_cert={self.tls.client_ca_file}"]
            command += ["-Z", "-o", ",".join(tls_options)]
        if self.users:
            command += ["-Y", self._write_auth_file()]
        return command + self.extra_args

    def _write_auth_file(self) -> str:
        if self._auth_file is None:
            self._auth_directory = tempfile.TemporaryDirectory(prefix="fastcache-auth-")
            self._auth_file = os.path.join(self._auth_directory.name, "authfile")
            with open(self._auth_file, "w", encoding="utf-8") as file:
                file.writelines(f"{user}:{password}\n" for user, password in self.users.items())
        return self._auth_file

    def _client_tls(self) -> ssl.SSLContext | None:
        """What the readiness checks connect with: TLS without verification (they only
        ask whether the server answers), with the client certificate when required."""
        if self.tls is None or self.socket_path is not None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if self.tls.client_cert is not None:
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        return context

    def _login(self) -> bytes:
        if not self.users:
            return b""
        user, password = next(iter(self.users.items()))
        value = f"{user} {password}".encode()
        return b"set auth 0 -1 %d\r\n%s\r\n" % (len(value), value)

    def _ask_server(self, request: bytes, expect: bytes) -> bool:
        return self._server_problem(request, expect) is None

    def _server_problem(self, request: bytes, expect: bytes) -> str | None:
        address = self.socket_path if self.socket_path is not None else (self.host, self.port)
        return _problem(address, request, expect, self._client_tls(), self._login())

    def _ping(self) -> bool:
        return self._ask_server(b"version\r\n", b"VERSION")

    def flush(self) -> None:
        problem = self._server_problem(b"flush_all\r\n", b"OK")
        if problem is not None:
            raise RuntimeError(f"flush_all failed on {self.location}: {problem}")

    def stop(self) -> None:
        super().stop()
        if self._auth_directory is not None:
            self._auth_directory.cleanup()
            self._auth_directory = None
            self._auth_file = None


class RedisServer(_ServerProcess):
    """A redis-server on a free loopback port that keeps nothing on disk."""

    binary = "redis-server"
    install_hint = "apt-get install redis-server"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__()
        self.directory = Path(directory)

    @property
    def location(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _command(self) -> list[str]:
        self.directory.mkdir(parents=True, exist_ok=True)
        return [
            self.binary,
            "--bind", self.host,
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
        ]  # fmt: skip

    def _ping(self) -> bool:
        return _ask((self.host, self.port), b"PING\r\n", b"+PONG")

    def flush(self) -> None:
        problem = _problem((self.host, self.port), b"FLUSHALL\r\n", b"+OK")
        if problem is not None:
            raise RuntimeError(f"FLUSHALL failed on {self.location}: {problem}")
