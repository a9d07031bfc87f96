"""The benchmark's rows: which backend, configured how, on which embedded server.

A row is a name and a Django ``CACHES`` entry. By default the entry points at servers the
harness starts itself (:class:`EmbeddedServers`); a project overrides a row, or adds one,
with ``CACHEBENCH_BACKENDS`` in its settings or with a ``CACHES`` alias named like the row.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from django_fastcache.testing.servers import MemcachedServer, RedisServer, free_port

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
FILEBASED = "django.core.cache.backends.filebased.FileBasedCache"
PYLIBMC = "django.core.cache.backends.memcached.PyLibMCCache"
PYMEMCACHE = "django.core.cache.backends.memcached.PyMemcacheCache"
DJANGO_REDIS = "django_redis.cache.RedisCache"
DISKCACHE = "diskcache.DjangoCache"
FASTCACHE = "django_fastcache.backends.FastCache"

# The method's nine rows in its order, then the unix-socket pair (sockets against TCP).
ROW_NAMES: tuple[str, ...] = (
    "locmem",
    "filebased",
    "memcached",
    "pymemcache",
    "redis",
    "diskcache",
    "fastcache",
    "fastcache-tiered",
    "fastcache-outage",
    "memcached-unix",
    "fastcache-unix",
)
# The rows of DiskCache's published table.
PUBLISHED_ROWS: frozenset[str] = frozenset(
    ("locmem", "filebased", "memcached", "redis", "diskcache")
)

# The server each default row needs.
MEMCACHED_TCP = "memcached"
MEMCACHED_UNIX = "memcached-unix"
REDIS = "redis"
_NEEDS: dict[str, str] = {
    "memcached": MEMCACHED_TCP,
    "pymemcache": MEMCACHED_TCP,
    "redis": REDIS,
    "fastcache": MEMCACHED_TCP,
    "fastcache-tiered": MEMCACHED_TCP,
    "memcached-unix": MEMCACHED_UNIX,
    "fastcache-unix": MEMCACHED_UNIX,
}

# The client library each default row imports, and how to get it.
_LIBRARIES: dict[str, tuple[str, str]] = {
    "memcached": ("pylibmc", "pip install pylibmc"),
    "memcached-unix": ("pylibmc", "pip install pylibmc"),
    "pymemcache": ("pymemcache", "pip install pymemcache"),
    "redis": ("django_redis", "pip install django-redis"),
    "diskcache": ("diskcache", "pip install diskcache"),
}

# The original caps only these two rows at 1,000 keys.
_CAPPED = {"MAX_ENTRIES": 1000, "CULL_FREQUENCY": 10}


@dataclass
class Row:
    """One backend to measure and how to empty its storage before the pre-fill."""

    name: str
    config: dict[str, Any]
    source: str = "embedded"  # or "settings"
    flush: list[MemcachedServer | RedisServer] = field(default_factory=list)
    remove: list[Path] = field(default_factory=list)
    note: str = ""

    @property
    def backend(self) -> str:
        return str(self.config.get("BACKEND", ""))

    @property
    def process_local(self) -> bool:
        """Every worker process has its own copy (locmem): nothing shared to pre-fill."""
        return self.backend == LOCMEM

    @property
    def clear_in_prefill(self) -> bool:
        """A project's own cache is emptied by ``cache.clear()``: we did not start its server."""
        return self.source == "settings"

    def empty_storage(self) -> None:
        for directory in self.remove:
            shutil.rmtree(directory, ignore_errors=True)
        for server in self.flush:
            server.flush()


class EmbeddedServers:
    """memcached (TCP and a unix socket) and redis, started on demand, stopped at exit.

    Everything lives under one temporary directory: the unix socket, redis' working
    directory and every row's cache directory. A server whose binary is missing is
    recorded in :attr:`missing` with the line that says how to install it.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cachebench-"))
        self.servers: dict[str, MemcachedServer | RedisServer] = {}
        self.missing: dict[str, str] = {}
        self.failed: dict[str, str] = {}

    def get(self, kind: str) -> MemcachedServer | RedisServer | None:
        """The running server of this kind, started on first use; None if it cannot run."""
        if kind in self.servers:
            return self.servers[kind]
        if kind in self.missing or kind in self.failed:
            return None
        server: MemcachedServer | RedisServer
        if kind == MEMCACHED_TCP:
            server = MemcachedServer()
        elif kind == MEMCACHED_UNIX:
            server = MemcachedServer(self.root / "memcached.sock")
        elif kind == REDIS:
            server = RedisServer(self.root / "redis")
        else:
            raise ValueError(f"unknown server kind {kind!r}")
        if not server.available():
            self.missing[kind] = (
                f"{server.binary} is not installed ({server.install_hint}); "
                "or configure the row in CACHEBENCH_BACKENDS"
            )
            return None
        try:
            server.start()
        except RuntimeError as exc:
            self.failed[kind] = str(exc)
            return None
        self.servers[kind] = server
        return server

    def why_not(self, kind: str) -> str:
        return self.missing.get(kind) or self.failed.get(kind) or f"{kind} is not running"

    def directory(self, name: str) -> Path:
        return self.root / "dirs" / name

    def stop(self) -> None:
        for server in self.servers.values():
            with contextlib.suppress(Exception):
                server.stop()
        self.servers.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EmbeddedServers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RowUnavailable(Exception):
    """The row cannot run here; the message is the one line the user sees."""


#: FastCache without its disk tier: the memcached path alone.
_MEMCACHED_ONLY = {"disk_tier": False}


def default_row(name: str, servers: EmbeddedServers) -> Row:
    """The embedded configuration of a default row; starts the server it needs."""
    library = _LIBRARIES.get(name)
    if library is not None and importlib.util.find_spec(library[0]) is None:
        raise RowUnavailable(f"{library[0]} is not installed ({library[1]})")
    server = None
    kind = _NEEDS.get(name)
    if kind is not None:
        server = servers.get(kind)
        if server is None:
            raise RowUnavailable(servers.why_not(kind))
    directory = servers.directory(name)

    if name == "locmem":
        return Row(name, {"BACKEND": LOCMEM, "LOCATION": "cachebench", "OPTIONS": dict(_CAPPED)})
    if name == "filebased":
        config = {"BACKEND": FILEBASED, "LOCATION": str(directory), "OPTIONS": dict(_CAPPED)}
        return Row(name, config, remove=[directory])
    if name == "diskcache":
        return Row(name, {"BACKEND": DISKCACHE, "LOCATION": str(directory)}, remove=[directory])
    if name == "fastcache-outage":
        # Nothing listens on this port: the first call finds the node out, and from then on
        # every call is answered by the disk tier.
        config = {
            "BACKEND": FASTCACHE,
            "LOCATION": f"127.0.0.1:{free_port()}",
            "OPTIONS": {"disk_directory": str(directory)},
        }
        return Row(name, config, remove=[directory], note="memcached unreachable")
    assert server is not None
    if name == "redis":
        # Its own database, as in the original.
        location = f"redis://{server.host}:{server.port}/1"
        return Row(name, {"BACKEND": DJANGO_REDIS, "LOCATION": location}, flush=[server])
    assert isinstance(server, MemcachedServer)
    if name in ("memcached", "memcached-unix"):
        config = {"BACKEND": PYLIBMC, "LOCATION": server.pylibmc_location}
        return Row(name, config, flush=[server])
    if name == "pymemcache":
        config = {"BACKEND": PYMEMCACHE, "LOCATION": server.pylibmc_location}
        return Row(name, config, flush=[server])
    if name in ("fastcache", "fastcache-unix"):
        config = {"BACKEND": FASTCACHE, "LOCATION": server.location, "OPTIONS": _MEMCACHED_ONLY}
        return Row(name, config, flush=[server])
    if name == "fastcache-tiered":
        config = {
            "BACKEND": FASTCACHE,
            "LOCATION": server.location,
            "OPTIONS": {"disk_directory": str(directory)},
        }
        return Row(name, config, flush=[server], remove=[directory])
    raise ValueError(f"unknown row {name!r}")


def settings_rows(
    caches: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any] | None
) -> dict[str, Row]:
    """The rows a project configures itself, by name.

    ``CACHEBENCH_BACKENDS`` maps a row name to a ``CACHES`` alias (a string) or to a
    ``CACHES``-style dict; names that are not default rows become extra rows. Without an
    entry there, a ``CACHES`` alias with a default row's name is used for that row.
    """
    rows: dict[str, Row] = {}
    for name in ROW_NAMES:
        if name in caches:
            rows[name] = Row(name, dict(caches[name]), source="settings", note=f"CACHES[{name!r}]")
    for name, value in (overrides or {}).items():
        if isinstance(value, str):
            if value not in caches:
                raise ValueError(
                    f"CACHEBENCH_BACKENDS[{name!r}] names the CACHES alias {value!r}, "
                    "which is not defined"
                )
            rows[name] = Row(
                name, dict(caches[value]), source="settings", note=f"CACHES[{value!r}]"
            )
        elif isinstance(value, Mapping) and "BACKEND" in value:
            rows[name] = Row(name, dict(value), source="settings", note="CACHEBENCH_BACKENDS")
        else:
            raise ValueError(
                f"CACHEBENCH_BACKENDS[{name!r}] must be a CACHES alias or a dict with BACKEND"
            )
    return rows


def row_names(extra: Sequence[str] = ()) -> list[str]:
    """Every row name a run can select: the defaults, then a project's extra rows."""
    return [*ROW_NAMES, *(name for name in extra if name not in ROW_NAMES)]
