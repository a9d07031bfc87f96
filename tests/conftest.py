"""Real memcached processes for the whole run: three TCP nodes and one unix socket.

The servers are started once per test session on free loopback ports (the unix socket
under a temporary directory) and stopped at the end. Tests that need a clean server use
``memcached`` / ``memcached_cluster``, which flush before handing the servers over.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from django_fastcache.testing.servers import MemcachedServer

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
