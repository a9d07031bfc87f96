"""Real memcached processes for the whole run: three TCP nodes and one unix socket.

The servers are started once per test session on free loopback ports (the unix socket
under a temporary directory) and stopped at the end. Tests that need a clean server use
``memcached`` / ``memcached_cluster``, which flush before handing the servers over.

FastCache keeps its disk tier on by default. A test that builds a FastCache with the tier on
gives it a ``disk_directory`` of its own under pytest's tmp_path (the ``disk_directory`` and
``tier_options`` fixtures), so no test reads what another left on disk and nothing lands in
the user's ``~/.cache``. To make sure of it, the default location is pointed at a directory
of the run's own for the whole session, and a test that created anything there fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from django_fastcache import stampede
from django_fastcache.backends import fastcache
from django_fastcache.maintenance import maintenance
from django_fastcache.testing.servers import MemcachedServer
from django_fastcache.testing.stamps import drop_tables

if os.environ.get("CI") and not MemcachedServer.available():
    raise RuntimeError("CI=true but memcached is not installed: the test command installs it")


@dataclass
class MemcachedCluster:
    tcp: list[MemcachedServer]
    unix: MemcachedServer

    @property
    def servers(self) -> list[MemcachedServer]:
        return [*self.tcp, self.unix]

    @property
    def locations(self) -> list[str]:
        return [server.location for server in self.servers]

    def flush(self) -> None:
        for server in self.servers:
            if server.running:
                server.flush()


@pytest.fixture(scope="session")
def _memcached_processes() -> Iterator[MemcachedCluster]:
    if not MemcachedServer.available():
        pytest.skip("memcached is not installed (apt-get install memcached)")
    with tempfile.TemporaryDirectory(prefix="fastcache-tests-") as directory:
        tcp = [MemcachedServer().start() for _ in range(3)]
        unix = MemcachedServer(os.path.join(directory, "memcached.sock")).start()
        cluster = MemcachedCluster(tcp=tcp, unix=unix)
        try:
            yield cluster
        finally:
            for server in cluster.servers:
                server.stop()


@pytest.fixture
def memcached_cluster(_memcached_processes: MemcachedCluster) -> MemcachedCluster:
    """Three TCP memcached nodes and one on a unix socket, all flushed."""
    _memcached_processes.flush()
    return _memcached_processes


@pytest.fixture
def memcached(_memcached_processes: MemcachedCluster) -> MemcachedServer:
    """One flushed TCP memcached node."""
    server = _memcached_processes.tcp[0]
    server.flush()
    return server


# -- the disk tier -------------------------------------------------------------------------

#: Seconds a test waits, at most, for the writer behind to land what is queued
#: (``TieredStore.flush``): a bound on waiting for a condition, loose because a loaded
#: machine can take seconds over it; never a measure of speed.
LANDING_WAIT = 30.0

#: OPTIONS of a FastCache over memcached alone.
MEMCACHED_ONLY: dict[str, Any] = {"disk_tier": False}


@pytest.fixture(scope="session")
def _default_disk_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where a FastCache without ``disk_directory`` would put its disk tier during the run
    (``$XDG_CACHE_HOME``), instead of the user's ``~/.cache``."""
    home = tmp_path_factory.mktemp("xdg-cache-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def _no_default_disk_directory(_default_disk_home: Path) -> Iterator[None]:
    """Fail a test that built a FastCache with the disk tier in its default directory."""
    yield
    made = _default_disk_home / "django-fastcache"
    if made.exists():
        shutil.rmtree(made, ignore_errors=True)
        pytest.fail(
            "this test used a FastCache with the disk tier on and no disk_directory: "
            'give it OPTIONS={"disk_directory": <the disk_directory fixture>} '
            f"or {MEMCACHED_ONLY!r}",
            pytrace=False,
        )


def forget_stacks(directory: str | os.PathLike[str]) -> None:
    """Drop the process-wide clients and disk tiers of every FastCache configuration whose
    disk tier lives under ``directory``, closing what the calling thread opened, so that a
    test's stack (SQLite files, sockets) does not outlive it."""
    root = os.path.abspath(directory)
    with fastcache._shared_lock:
        doomed = [
            identity
            for identity, shared in fastcache._shared.items()
            if shared.tiered is not None
            and os.path.abspath(shared.tiered.disk.directory).startswith(root + os.sep)
        ]
        stacks = [fastcache._shared.pop(identity) for identity in doomed]
    for shared in stacks:
        assert shared.tiered is not None
        maintenance.unregister(shared.tiered)
        shared.blocking.close_thread_connections()
        shared.tiered.discard()
    drop_tables(root)  # their write stamps tables in /dev/shm


@pytest.fixture
def own_stacks() -> Iterator[None]:
    """Drop the process-wide FastCache stacks the test built, for modules whose tests start
    servers (or fake endpoints) of their own. A stack is keyed by its LOCATION, whose port
    is the kernel's pick: a later test's server on a port an earlier one used would
    otherwise be handed the earlier stack, with its node list, node health and counts
    (memcached-only stacks: the disk_directory fixture drops those with a disk tier)."""
    before = set(fastcache._shared)
    yield
    with fastcache._shared_lock:
        made = [i for i in fastcache._shared if i not in before]
        stacks = [fastcache._shared.pop(i) for i in made if fastcache._shared[i].tiered is None]
    for shared in stacks:
        if shared.client.cluster.discovery is not None:
            shared.client.cluster.discovery.close()
        shared.blocking.close_thread_connections()


def forget_meta_answers(location: str) -> None:
    """Forget what this process learnt of whether the node at ``location`` speaks the meta
    protocol, as a process that never asked it: the answer is kept process-wide by node
    address, which another test's server may have had."""
    with stampede._supports_lock:
        for identity in [i for i in stampede._supports if location in i[1]]:
            del stampede._supports[identity]


def set_tree_mode(root: str, directories: int, files: int) -> None:
    """chmod a disk tier's directory tree (a deploy's ``chmod``). A file gone between the
    listing and its chmod is passed over: SQLite removes its rollback journal when a
    transaction ends (a shard being made uses one before it turns to its write-ahead log)."""
    for path, _names, filenames in os.walk(root):
        os.chmod(path, directories)
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(os.path.join(path, name), files)


@pytest.fixture(scope="session", autouse=True)
def _no_stamps_tables_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The run's write stamps tables removed from /dev/shm at its end."""
    yield
    drop_tables(tmp_path_factory.getbasetemp())


@pytest.fixture
def disk_directory(tmp_path: Path) -> Iterator[str]:
    """A fresh directory for one test's disk tier (``OPTIONS["disk_directory"]``)."""
    directory = tmp_path / "fastcache-disk"
    yield str(directory)
    forget_stacks(directory)


@pytest.fixture(params=["memcached-only", "tiered"])
def tier_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The OPTIONS of each way FastCache can store: memcached alone, and memcached with the
    disk tier (the default) in a directory of the test's own."""
    if request.param == "memcached-only":
        return dict(MEMCACHED_ONLY)
    return {"disk_directory": request.getfixturevalue("disk_directory")}


@contextlib.contextmanager
def connects_from_this_thread() -> Iterator[list[Any]]:
    """Record every socket connect the calling thread attempts (and let each happen).

    Connects made by other threads (the maintenance thread's probes) are not recorded.
    Covers the blocking client and the stock asyncio loop (uvloop connects in C)."""
    attempts: list[Any] = []
    me = threading.get_ident()
    original = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        if threading.get_ident() == me:
            attempts.append(address)
        original(sock, address)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        yield attempts
