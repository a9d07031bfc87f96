"""Django's own cache test suite, run against FastCache on a real memcached.

The tests are those of ``BaseMemcachedTests`` (and ``BaseCacheTests`` under it) in
``tests/cache/tests.py`` of the installed Django's sdist, fetched at test time (``fetch.py``).
Every deviation from Django's suite is an override in this file with its reason next to it.

Only the classes defined here are collected: the suite module is reached through the module
object ``suite``, so none of its TestCase classes (LocMem, FileBased, DB, Redis, PyLibMC...)
is bound to a name in this module.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from django import test as django_test
from django.core import signals
from django.core.cache import cache
from django.db import close_old_connections

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


@pytest.mark.usefixtures("django_cache_suite")
class FastCacheTests(
    MemcachedSuiteMixin,
    BaseMemcachedTests,  # type: ignore[misc]  # Django's test suite is untyped
    django_test.TestCase,
):
    backend = "django_fastcache.backends.FastCache"
    backend_options = None  # defaults: every option at its documented default

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
