"""Django's own cache test suite, run against FastCache on a real memcached.

The tests are those of ``BaseMemcachedTests`` (and ``BaseCacheTests`` under it) in
``tests/cache/tests.py`` of the installed Django's sdist, fetched at test time (``fetch.py``).
Every deviation from Django's suite is an override in this file with its reason next to it.

The suite runs three times, once per way FastCache can store:

* ``FastCacheTests``: memcached alone (``disk_tier`` off);
* ``TieredFastCacheTests``: memcached with the disk tier behind it (the default), in a
  fresh directory;
* ``DiskOnlyFastCacheTests``: the disk tier with memcached unreachable (LOCATION is a
  loopback port nothing listens on): the node is marked out on first use and every
  operation is answered by the disk tier alone.

Only the classes defined here are collected: the suite module is reached through the module
object ``suite``, so none of its TestCase classes (LocMem, FileBased, DB, Redis, PyLibMC...)
is bound to a name in this module.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from django import test as django_test
from django.core import signals
from django.core.cache import cache
from django.db import close_old_connections

from django_fastcache.testing.servers import free_port
from tests.conftest import LANDING_WAIT, MEMCACHED_ONLY, connects_from_this_thread
from tests.django_suite.fetch import SuiteUnavailable, load_cache_tests, running_in_ci

if TYPE_CHECKING:
    from django_fastcache.testing.servers import MemcachedServer

try:
    suite = load_cache_tests()
except SuiteUnavailable as exc:
    message = f"Django's cache test suite is unavailable: {exc}"
    if running_in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)

# Not a TestCase (nor named Test*): binding it here makes pytest collect nothing extra.
BaseMemcachedTests: Any = suite.BaseMemcachedTests

# memcached's default item size limit (-I 1m); the test servers run with the default.
MEMCACHED_ITEM_SIZE_MAX = 1024 * 1024


class MemcachedSuiteMixin:
    """What the ``django_cache_suite`` fixture reads from, and sets on, a test class."""

    backend: ClassVar[str]
    backend_options: ClassVar[dict[str, Any] | None] = None
    # Set by the fixture for the duration of the class.
    base_params: ClassVar[dict[str, Any]]
    memcached_server: ClassVar[MemcachedServer]

    @classmethod
    def location(cls, server: MemcachedServer) -> str:
        return server.location

    @classmethod
    def options(cls, directory: Path) -> dict[str, Any] | None:
        """The OPTIONS; ``directory`` is a fresh temporary directory of the class's own."""
        return cls.backend_options


@pytest.mark.usefixtures("django_cache_suite")
class FastCacheTests(
    MemcachedSuiteMixin,
    BaseMemcachedTests,  # type: ignore[misc]  # Django's test suite is untyped
    django_test.TestCase,
):
    backend = "django_fastcache.backends.FastCache"
    # memcached alone, said explicitly: the disk tier is on by default, and has classes of
    # its own below.
    backend_options = MEMCACHED_ONLY

    # Connection pools are process-global and outlive the per-request backend instances:
    # close() at the end of a request must not disconnect.
    should_disconnect_on_close = False

    def test_close(self) -> None:
        # Override: Django's version patches ``cache._class.disconnect_all``, the client class
        # of pylibmc/pymemcache, which FastCache does not have. The contract it checks is
        # whether request_finished (which calls close()) drops the connections; here that is
        # observed on the server: after request_finished, does a get open a new connection?
        cache.set("close-probe", "value")
        assert cache.get("close-probe") == "value"  # the connection is established
        before = int(memcached_stats(self.memcached_server)["total_connections"])
        signals.request_finished.disconnect(close_old_connections)
        try:
            signals.request_finished.send(self.__class__)
        finally:
            signals.request_finished.connect(close_old_connections)
        assert cache.get("close-probe") == "value"
        after = int(memcached_stats(self.memcached_server)["total_connections"])
        opened = after - before - 1  # the second stats connection is one of them
        assert (opened > 0) is self.should_disconnect_on_close, f"{opened} new connections"

    def test_set_many_returns_failing_keys(self) -> None:
        # Override: Django's version mocks ``cache._class.set_multi``, a pylibmc/pymemcache
        # API that FastCache does not have. Same contract, with a real failure: a value over
        # memcached's item size limit (random bytes, so that compression cannot shrink it)
        # is refused by the server and its key is returned; the other key is stored. The old
        # value of the failing key is gone, as after a failed set() (see
        # test_memcached_deletes_key_on_failed_set). Note: Django's own memcached backends
        # do not pass this: pylibmc raises TooBig, pymemcache raises MemcacheServerError.
        cache.set("too-large", "old value")
        too_large = os.urandom(MEMCACHED_ITEM_SIZE_MAX + 1)
        failing_keys = cache.set_many({"key": "value", "too-large": too_large})
        assert failing_keys == ["too-large"]
        assert cache.get("key") == "value"
        assert cache.get("too-large") is None


class TieredFastCacheTests(FastCacheTests):
    """memcached with the disk tier behind it, the default configuration: every option at
    its default but ``disk_directory``, a fresh directory of the class's own."""

    backend_options = None

    @classmethod
    def options(cls, directory: Path) -> dict[str, Any] | None:
        return {"disk_directory": str(directory / "disk")}

    def test_set_many_returns_failing_keys(self) -> None:
        super().test_set_many_returns_failing_keys()
        # And in the disk tier too, the failing key's old value is gone.
        tiered = cache._shared().tiered
        assert tiered is not None
        assert tiered.flush(LANDING_WAIT)  # the disk copies are written behind
        assert tiered.disk.get(cache.wire_key("too-large")) is None
        assert tiered.disk.get(cache.wire_key("key")) is not None


class DiskOnlyFastCacheTests(TieredFastCacheTests):
    """The disk tier alone: LOCATION is a loopback port where nothing listens. The first
    operation fails to connect, marks the node out, and from then on every operation is
    the disk tier's; the background probe keeps failing and never runs on a request.
    Every test of Django's suite applies and passes as it is; test_close is overridden
    (below) because there is no memcached to observe, and test_set_many_returns_failing_keys
    (FastCacheTests' version, checking the disk tier as TieredFastCacheTests does) holds
    as it is: its value is over max_value_size, refused before any I/O."""

    @classmethod
    def location(cls, server: MemcachedServer) -> str:
        return f"127.0.0.1:{free_port()}"

    def setUp(self) -> None:
        super().setUp()
        # Every test here runs with the node out (after the first, it already is).
        cache.get("mark-the-node-out")
        stats = cache.tier_stats()
        assert stats is not None
        assert [node["state"] for node in stats["nodes"].values()] == ["out"]

    def test_close(self) -> None:
        # Override: there is no memcached to hold connections, so Django's question (does
        # request_finished drop them?) has nothing to observe. What must hold instead: after
        # request_finished the disk tier still answers, and a request with the node out
        # makes no connection attempt at all (probing is the maintenance thread's job).
        cache.set("close-probe", "value")
        with connects_from_this_thread() as attempts:
            signals.request_finished.disconnect(close_old_connections)
            try:
                signals.request_finished.send(self.__class__)
            finally:
                signals.request_finished.connect(close_old_connections)
            assert cache.get("close-probe") == "value"
            cache.set("close-probe", "other")
            assert cache.get("close-probe") == "other"
        assert attempts == []


def memcached_stats(server: MemcachedServer) -> dict[str, str]:
    """The server's ``stats``, read over a connection of its own."""
    family = socket.AF_UNIX if server.socket_path is not None else socket.AF_INET
    address: str | tuple[str, int] = (
        server.socket_path if server.socket_path is not None else (server.host, server.port)
    )
    reply = b""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(address)
        sock.sendall(b"stats\r\n")
        while not reply.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"{server.location} closed the stats connection")
            reply += chunk
    stats: dict[str, str] = {}
    for line in reply.decode("ascii").splitlines():
        fields = line.split(" ", 2)
        if len(fields) == 3 and fields[0] == "STAT":
            stats[fields[1]] = fields[2]
    return stats
