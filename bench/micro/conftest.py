"""Servers and caches for the per-operation micro benchmarks.

memcached and redis are started once for the session on free loopback ports; each cache
is built from a ``CACHES``-style entry the way Django builds one. A backend whose server,
client library or code is missing is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings

from django_fastcache.bench.runner import build_cache
from django_fastcache.testing.servers import MemcachedServer, RedisServer

BACKENDS = (
    "locmem",
    "pylibmc",
    "pymemcache",
    "redis",
    "diskcache",
    "fastcache",
    "fastcache-tiered",
)
LIBRARIES = {"pylibmc": "pylibmc", "pymemcache": "pymemcache", "redis": "django_redis"}

if not settings.configured:
    settings.configure(INSTALLED_APPS=[], USE_TZ=True)
    django.setup()


class Servers:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.memcached: MemcachedServer | None = None
        self.redis: RedisServer | None = None

    def need_memcached(self) -> MemcachedServer:
        if self.memcached is None:
            if not MemcachedServer.available():
                pytest.skip("memcached is not installed (apt-get install memcached)")
            self.memcached = MemcachedServer().start()
        return self.memcached

    def need_redis(self) -> RedisServer:
        if self.redis is None:
            if not RedisServer.available():
                pytest.skip("redis-server is not installed (apt-get install redis-server)")
            self.redis = RedisServer(self.root / "redis").start()
        return self.redis

    def stop(self) -> None:
        for server in (self.memcached, self.redis):
            if server is not None:
                server.stop()


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    with tempfile.TemporaryDirectory(prefix="fastcache-micro-") as root:
        running = Servers(Path(root))
        try:
            yield running
        finally:
            running.stop()


def _config(name: str, servers: Servers, directory: Path) -> dict[str, Any]:
    if name == "locmem":
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "micro"}
    if name == "diskcache":
        return {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(directory)}
    if name == "redis":
        redis = servers.need_redis()
        redis.flush()
        return {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{redis.host}:{redis.port}/1",
        }
    memcached = servers.need_memcached()
    memcached.flush()
    if name == "pylibmc":
        return {
            "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
            "LOCATION": memcached.pylibmc_location,
        }
    if name == "pymemcache":
        return {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": memcached.pylibmc_location,
        }
    if name == "fastcache":  # memcached alone, as cachebench's fastcache row
        return {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": memcached.location,
            "OPTIONS": {"disk_tier": False},
        }
    if name == "fastcache-tiered":  # the default: with the disk tier, in a fresh directory
        return {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": memcached.location,
            "OPTIONS": {"disk_directory": str(directory.parent / "fastcache-disk")},
        }
    raise ValueError(name)


@pytest.fixture(params=BACKENDS)
def cache(request: pytest.FixtureRequest, servers: Servers, tmp_path: Path) -> Iterator[Any]:
    """A cache of each backend, empty, closed after the benchmark."""
    name = request.param
    library = LIBRARIES.get(name)
    if library is not None and importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed")
    config = _config(name, servers, tmp_path / "diskcache")
    try:
        instance = build_cache(config)
    except Exception as exc:  # a backend that cannot be built is reported, not fatal
        pytest.skip(f"{name} cannot be built: {type(exc).__name__}: {exc}")
    try:
        yield instance
    finally:
        with contextlib.suppress(Exception):
            instance.clear()
        instance.close()
