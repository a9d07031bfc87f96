"""The RelStorage cache module: ``cache-module-name django_fastcache.relstorage``.

RelStorage imports the module its ``cache-module-name`` option names and builds
``module.Client(servers)`` for every storage instance and every ZODB connection, then calls
``get``, ``get_multi``, ``set``, ``set_multi``, ``delete``, ``flush_all`` and
``disconnect_all`` with ``str`` keys and ``bytes`` values. It catches nothing the module
raises, so this module never raises: a failure is logged on the
``django_fastcache.relstorage`` logger and answered like a miss (None), and ZODB reads from
its database instead.

Nothing here needs Django or its settings. Clients built for the same servers and settings
share one :class:`~django_fastcache.client.blocking.BlockingClient` (one connection per
node and thread), so building one is a dictionary look-up and does no I/O. A node that fails
(refused, closed, timed out, unparsable reply) is skipped by the whole process for
``retry_after`` seconds: a hung memcached costs one timeout, not one per object read.

Optional settings come from a :class:`Client` subclass's attributes or, when the attribute
is left at None, from environment variables (``FASTCACHE_RELSTORAGE_TIMEOUT`` ...; see
:data:`ENVIRONMENT`), which suits zope.conf, where only a module name can be given.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .bridge import run_blocking
from .client.blocking import BlockingClient
from .client.cluster import ClientSettings, Cluster
from .client.commands import MULTI_GET_CHUNK, Expected, Replies, Requests
from .errors import CommandError, FastCacheError
from .protocol import (
    Item,
    ReplyKind,
    Status,
    flush_all_command,
    get_command,
    key_problem,
    storage_command,
)

__all__ = ["ENVIRONMENT", "Client", "RelStorageSettings"]

log = logging.getLogger("django_fastcache.relstorage")
_T = TypeVar("_T")

# The flags pylibmc (and python-memcached) give values, read from what they store: plain
# bytes 0, zlib-compressed 8 (``relstorage.pylibmc_wrapper`` compresses values over 1000
# bytes), integers 4 (pylibmc) or 2 (python-memcached). Any other flag is a miss.
FLAG_BYTES = 0
FLAG_INTEGER = 2
FLAG_LONG = 4
FLAG_ZLIB = 8

#: The environment variables read when a :class:`Client` attribute is None, by attribute.
ENVIRONMENT = {
    "timeout": "FASTCACHE_RELSTORAGE_TIMEOUT",
    "connect_timeout": "FASTCACHE_RELSTORAGE_CONNECT_TIMEOUT",
    "retry_after": "FASTCACHE_RELSTORAGE_RETRY_AFTER",
    "compress_min_length": "FASTCACHE_RELSTORAGE_COMPRESS_MIN_LENGTH",
    "max_value_size": "FASTCACHE_RELSTORAGE_MAX_VALUE_SIZE",
}

_DEFAULTS: dict[str, float] = {
    "timeout": 0.5,
    "connect_timeout": 0.5,
    "retry_after": 2.0,
    "compress_min_length": 0,
    "max_value_size": 64 * 1024 * 1024,
}

# Spellings python-memcached accepts in front of an address.
_INET_PREFIX = re.compile(r"^inet6?:", re.IGNORECASE)
_HASHED_PREFIX = b"fastcache-relstorage-sha1:"


@dataclass(frozen=True)
class RelStorageSettings:
    """The settings in force for a :class:`Client` (resolved from attributes and environment)."""

    timeout: float
    connect_timeout: float
    #: Seconds a failed node is skipped (its keys are misses) before it is tried again.
    retry_after: float
    #: Values at least this long are stored zlib-compressed (flags 8, as pylibmc does); 0: never.
    compress_min_length: int
    #: Largest value a reply may declare before it is treated as a broken stream.
    max_value_size: int


class _Shared:
    """The per-process state of one server list under one set of settings."""

    def __init__(self, client: BlockingClient, settings: RelStorageSettings) -> None:
        self.client = client
        self.settings = settings
        self.cluster = client.cluster
        # Node index -> time.monotonic() until which the node is skipped. Values are
        # system-wide, so a forked child inherits a correct view.
        self.down_until: dict[int, float] = {}
        # Nodes that failed and have not answered since: one warning per outage, not one
        # per retry.
        self.failing: set[int] = set()

    def usable(self, node: int) -> bool:
        until = self.down_until.get(node)
        if until is None:
            return True
        if time.monotonic() >= until:
            self.down_until.pop(node, None)
            return True
        return False

    def failed(self, node: int, error: BaseException) -> None:
        self.down_until[node] = time.monotonic() + self.settings.retry_after
        if node not in self.failing:
            self.failing.add(node)
            log.warning(
                "memcached node %s failed (%s); its keys are misses, retried every %ss",
                self.cluster.node_ids[node],
                error,
                self.settings.retry_after,
            )

    def answered(self, node: int) -> None:
        """Called after a reply from a node while some node is failing."""
        if node in self.failing:
            self.failing.discard(node)
            log.warning("memcached node %s answers again", self.cluster.node_ids[node])


# One entry per (servers, settings): dict operations are atomic under the GIL, so no lock
# (a lock held by another thread at fork() would stay locked in the child). Two threads
# racing to build the same entry build two, and one wins: harmless.
_shared: dict[tuple[tuple[str, ...], RelStorageSettings], _Shared] = {}
# Problems already logged: RelStorage builds a Client per connection, and each would
# otherwise log the same configuration problem again.
_reported: set[str] = set()


def _report_once(level: int, message: str, *args: object) -> None:
    text = message % args
    if text not in _reported:
        _reported.add(text)
        log.log(level, "%s", text)


class Client:
    """The client RelStorage builds as ``Client(servers)``; every method answers, none raises.

    Settings: subclass and set any of the attributes below, or leave them at None to read
    the matching environment variable (:data:`ENVIRONMENT`), or its default.
    """

    #: Seconds one call may take in total (default 0.5).
    timeout: ClassVar[float | None] = None
    #: Seconds to open a connection, within ``timeout`` (default 0.5).
    connect_timeout: ClassVar[float | None] = None
    #: Seconds a failed node is skipped (default 2).
    retry_after: ClassVar[float | None] = None
    #: Compress values at least this many bytes long with zlib (default 0: never).
    compress_min_length: ClassVar[int | None] = None
    #: Largest value accepted in a reply (default 64 MiB).
    max_value_size: ClassVar[int | None] = None

    def __init__(self, servers: Iterable[str] | str) -> None:
        self._shared: _Shared | None = None
        try:
            names = _server_names(servers)
            settings = self._settings()
            key = (names, settings)
            shared = _shared.get(key)
            if shared is None:
                shared = _shared.setdefault(key, _build(names, settings))
            self._shared = shared
        except Exception as exc:
            _report_once(logging.ERROR, "memcached cache disabled for servers %r: %s", servers, exc)

    @classmethod
    def _settings(cls) -> RelStorageSettings:
        values: dict[str, Any] = {}
        for name, default in _DEFAULTS.items():
            value = getattr(cls, name)
            if value is None:
                value = _from_environment(ENVIRONMENT[name], default)
            values[name] = value
        return RelStorageSettings(
            timeout=float(values["timeout"]),
            connect_timeout=float(values["connect_timeout"]),
            retry_after=float(values["retry_after"]),
            compress_min_length=int(values["compress_min_length"]),
            max_value_size=int(values["max_value_size"]),
        )

    @property
    def settings(self) -> RelStorageSettings | None:
        """The settings in force, or None when the configuration was unusable."""
        return None if self._shared is None else self._shared.settings

    # -- retrieval -----------------------------------------------------------------------
    def get(self, key: str) -> bytes | int | None:
        """The value stored under ``key``, or None (miss, unknown flags or failure)."""
        shared = self._shared
        if shared is None:
            return None
        try:
            return self._get_one(shared, _wire_key(key), key)
        except Exception:
            log.exception("get %r failed", key)
            return None

    @staticmethod
    def _get_one(shared: _Shared, wire: bytes, key: str) -> bytes | int | None:
        node = shared.cluster.node_index(wire)
        if not shared.usable(node):
            return None
        try:
            item = shared.client.get_now(wire)
        except CommandError as exc:
            log.debug("get %r refused: %s", key, exc)
            return None
        except FastCacheError as exc:
            shared.failed(node, exc)
            return None
        if shared.failing:
            shared.answered(node)
        return None if item is None else _decode(item)

    def get_multi(self, keys: Iterable[str]) -> dict[str, bytes | int] | None:
        """The values found, keyed by the ``str`` keys given; None on failure."""
        shared = self._shared
        if shared is None:
            return None
        try:
            by_wire: dict[bytes, str] = {}
            for key in keys:
                by_wire[_wire_key(key)] = key
            if not by_wire:
                return {}
            if len(by_wire) == 1:
                # RelStorage 4.x asks for one key per call: the flat single-key path.
                ((wire, key),) = by_wire.items()
                value = self._get_one(shared, wire, key)
                return {} if value is None else {key: value}
            requests: Requests = {}
            expected: Expected = {}
            for node, node_keys in shared.cluster.group(by_wire).items():
                if not shared.usable(node):
                    continue
                chunks = [
                    node_keys[i : i + MULTI_GET_CHUNK]
                    for i in range(0, len(node_keys), MULTI_GET_CHUNK)
                ]
                data = b"".join([get_command(chunk, checked=True) for chunk in chunks])
                requests[node] = (data, [ReplyKind.RETRIEVAL] * len(chunks))
                expected[node] = list(chunks)
            found: dict[str, bytes | int] = {}
            for replies in _answered(shared, requests, expected).values():
                for reply in replies:
                    if isinstance(reply, CommandError):
                        log.debug("get_multi refused: %s", reply)
                        continue
                    for item in reply:
                        value = _decode(item)
                        if value is not None:
                            found[by_wire[item.key]] = value
            return found
        except Exception:
            log.exception("get_multi failed")
            return None

    # -- storage -------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str | int) -> bool | None:
        """Store ``value``; True when stored, False when refused (too large), None on failure."""
        return self._store(b"set", key, value)

    def add(self, key: str, value: bytes | str | int) -> bool | None:
        """Store only if ``key`` is absent (older RelStorage releases use it)."""
        return self._store(b"add", key, value)

    def _store(self, verb: bytes, key: str, value: bytes | str | int) -> bool | None:
        shared = self._shared
        if shared is None:
            return None
        try:
            wire = _wire_key(key)
            data, flags = _encode(value, shared.settings.compress_min_length)
            node = shared.cluster.node_index(wire)
            if not shared.usable(node):
                return None
            try:
                stored = shared.client.store_now(verb, wire, data, flags, 0)
            except CommandError as exc:
                # Too large, most often; the connection stays in step.
                log.debug("%s %r refused: %s", verb.decode(), key, exc)
                return False
            except FastCacheError as exc:
                shared.failed(node, exc)
                return None
            if shared.failing:
                shared.answered(node)
            return stored
        except Exception:
            log.exception("%s %r failed", verb.decode(), key)
            return None

    def set_multi(self, mapping: Mapping[str, bytes | str | int]) -> list[str] | None:
        """Store every pair, pipelined per node, the nodes at once; the keys not stored."""
        shared = self._shared
        if shared is None:
            return None
        try:
            minimum = shared.settings.compress_min_length
            encoded: dict[bytes, bytes] = {}
            by_wire: dict[bytes, str] = {}
            for key, value in mapping.items():
                wire = _wire_key(key)
                data, flags = _encode(value, minimum)
                encoded[wire] = storage_command(b"set", wire, data, flags=flags)
                by_wire[wire] = key
            if not encoded:
                return []
            groups = shared.cluster.group(encoded)
            requests: Requests = {}
            failed: list[str] = []
            for node, node_keys in groups.items():
                if shared.usable(node):
                    data = b"".join([encoded[k] for k in node_keys])
                    requests[node] = (data, [ReplyKind.STORAGE] * len(node_keys))
                else:
                    failed.extend(by_wire[k] for k in node_keys)
            answered = _answered(shared, requests, None)
            for node in requests:
                node_keys = groups[node]
                replies = answered.get(node)
                if replies is None:
                    failed.extend(by_wire[k] for k in node_keys)
                    continue
                for wire, reply in zip(node_keys, replies):
                    if reply is not Status.STORED:
                        failed.append(by_wire[wire])
            return failed
        except Exception:
            log.exception("set_multi failed")
            return None

    def delete(self, key: str) -> bool | None:
        """Remove ``key``; True when it existed, None on failure."""
        return self._one_key("delete", key, lambda client, wire: client.delete_now(wire), False)

    def incr(self, key: str, delta: int = 1) -> int | None:
        """Add ``delta`` on the server; the new value, or None (older RelStorage releases)."""
        return self._one_key("incr", key, lambda client, wire: client.incr_now(wire, delta), None)

    def _one_key(
        self,
        name: str,
        key: str,
        call: Callable[[BlockingClient, bytes], _T],
        refused: _T | None,
    ) -> _T | None:
        """``call`` on the node of ``key``: ``refused`` when the server refuses it, None
        when the node is skipped or fails (counted against it), never an exception."""
        shared = self._shared
        if shared is None:
            return None
        try:
            wire = _wire_key(key)
            node = shared.cluster.node_index(wire)
            if not shared.usable(node):
                return None
            try:
                return call(shared.client, wire)
            except CommandError as exc:
                log.debug("%s %r refused: %s", name, key, exc)
                return refused
            except FastCacheError as exc:
                shared.failed(node, exc)
                return None
        except Exception:
            log.exception("%s %r failed", name, key)
            return None

    # -- whole servers -------------------------------------------------------------------
    def flush_all(self) -> None:
        """Invalidate every item on every reachable node: the whole server, not a prefix."""
        shared = self._shared
        if shared is None:
            return
        try:
            command = flush_all_command()
            requests: Requests = {
                node: (command, [ReplyKind.OK])
                for node in range(len(shared.cluster))
                if shared.usable(node)
            }
            _answered(shared, requests, None)
        except Exception:
            log.exception("flush_all failed")

    def disconnect_all(self) -> None:
        """Close the calling thread's connections (the next call opens new ones)."""
        shared = self._shared
        if shared is None:
            return
        try:
            shared.client.close_thread_connections()
        except Exception:
            log.exception("disconnect_all failed")


def _build(names: tuple[str, ...], settings: RelStorageSettings) -> _Shared:
    cluster = Cluster(
        [_adapt_address(name) for name in names],
        ClientSettings(
            timeout=settings.timeout,
            connect_timeout=min(settings.connect_timeout, settings.timeout),
            max_value_size=settings.max_value_size,
        ),
    )
    if settings.retry_after < 0 or settings.compress_min_length < 0:
        raise ValueError("retry_after and compress_min_length must not be negative")
    return _Shared(BlockingClient(cluster), settings)


def _answered(shared: _Shared, requests: Requests, expected: Expected | None) -> dict[int, Any]:
    """Each node's replies; a node whose connection failed is marked and left out."""
    if not requests:
        return {}
    # The blocking client's pipelines answer per node, so one failed node costs only its keys.
    results: Replies = run_blocking(shared.client._pipelines(requests, expected))
    answered: dict[int, Any] = {}
    for node, replies in results.items():
        if isinstance(replies, FastCacheError):
            shared.failed(node, replies)
        else:
            answered[node] = replies
            if shared.failing:
                shared.answered(node)
    return answered


def _server_names(servers: Iterable[str] | str) -> tuple[str, ...]:
    # RelStorage splits cache-servers on whitespace; a str given directly is split too.
    if isinstance(servers, str):
        pieces: Iterable[str] = re.split(r"[\s,;]+", servers)
    else:
        pieces = servers
    names = tuple(_text(piece).strip() for piece in pieces)
    names = tuple(name for name in names if name)
    if not names:
        raise ValueError("no memcached servers given (cache-servers)")
    return names


def _text(piece: object) -> str:
    if not isinstance(piece, str):
        raise TypeError(f"a server must be a string, got {piece!r}")
    return piece


def _adapt_address(name: str) -> str:
    """Our address forms plus python-memcached's ``inet:``/``inet6:`` prefixes."""
    return _INET_PREFIX.sub("", name)


def _wire_key(key: str | bytes) -> bytes:
    """The key as sent: its UTF-8 bytes, or a digest when memcached cannot carry them."""
    wire = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if key_problem(wire) is None:
        return wire
    return _HASHED_PREFIX + hashlib.sha1(wire).hexdigest().encode("ascii")


def _encode(value: bytes | str | int, compress_min_length: int) -> tuple[bytes, int]:
    if isinstance(value, bool):
        raise TypeError("booleans are not stored")
    if isinstance(value, int):
        return b"%d" % value, FLAG_LONG
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if compress_min_length and len(data) >= compress_min_length:
        compressed = zlib.compress(data)
        # Kept only when it saves space, as pylibmc does.
        if len(compressed) < len(data):
            return compressed, FLAG_ZLIB
    return data, FLAG_BYTES


def _decode(item: Item) -> bytes | int | None:
    flags = item.flags
    if flags == FLAG_BYTES:
        return item.value
    if flags == FLAG_ZLIB:
        try:
            return zlib.decompress(item.value)
        except zlib.error as exc:
            log.debug("value of %r does not decompress: %s", item.key, exc)
            return None
    if flags in (FLAG_LONG, FLAG_INTEGER):
        try:
            return int(item.value)
        except ValueError:
            return None
    log.debug("value of %r has unknown flags %d: a miss", item.key, flags)
    return None


def _from_environment(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        _report_once(logging.WARNING, "%s=%r is not a number; using %s", name, text, default)
        return default
    if value < 0 or value != value:
        _report_once(logging.WARNING, "%s=%r must not be negative; using %s", name, text, default)
        return default
    return value
