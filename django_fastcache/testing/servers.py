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
import subprocess
import time
from collections.abc import Sequence
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


def _ask(address: tuple[str, int] | str, request: bytes, expect: bytes) -> bool:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(address)
            sock.sendall(request)
            reply = sock.recv(256)
            return expect in reply
    except OSError:
        return False


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
    """A memcached process on a free loopback port, or on a unix socket when given a path."""

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
    ) -> None:
        super().__init__()
        self.socket_path = None if socket_path is None else str(socket_path)
        self.memory_mb = memory_mb
        self.item_size_max = item_size_max
        self.extra_args = list(extra_args)

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
        return command + self.extra_args

    def _ping(self) -> bool:
        address = self.socket_path if self.socket_path is not None else (self.host, self.port)
        return _ask(address, b"version\r\n", b"VERSION")

    def flush(self) -> None:
        address = self.socket_path if self.socket_path is not None else (self.host, self.port)
        if not _ask(address, b"flush_all\r\n", b"OK"):
            raise RuntimeError(f"flush_all failed on {self.location}")


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
        if not _ask((self.host, self.port), b"FLUSHALL\r\n", b"+OK"):
            raise RuntimeError(f"FLUSHALL failed on {self.location}")
