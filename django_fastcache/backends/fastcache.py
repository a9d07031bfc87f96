"""``FastCache``: Django's cache API over the asyncio memcached client.

The backend does keys, timeouts, values and Django's semantics; the wire is the client's
(the split Django draws between ``RedisCache`` and ``RedisCacheClient``). Every operation is
written once, as a coroutine: the async API (``aget``, ``aset``...) awaits it on the
caller's loop with the asyncio client, and the sync API runs it with the blocking client
through the sync bridge, on the calling thread and without an event loop. Clients, and so
connections, are process-global and shared by every backend
instance with the same configuration; Django creates a backend per thread and per request
and calls ``close()`` after each request, which therefore has nothing to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, InvalidCacheKey
from django.core.exceptions import ImproperlyConfigured

from ..bridge import run_blocking
from ..client import Client
from ..client.address import parse_locations
from ..client.blocking import BlockingClient
from ..client.commands import CommandSet
from ..errors import (
    ClientError,
    ConfigurationError,
    NetworkError,
    NonIntegerValueError,
    ValueTooLargeError,
)
from ..serializers import SERIALIZERS, PickleSerializer, Serializer
from .options import FastCacheOptions, parse_options

T = TypeVar("T")

MEMCACHE_MAX_KEY_LENGTH = 250
#: memcached treats a relative expiry above 30 days as a Unix timestamp.
MAX_RELATIVE_EXPIRY = 60 * 60 * 24 * 30
#: memcached's expiry is a signed 32-bit number: the latest absolute time it can hold.
MAX_EXPTIME = 2**31 - 1
_UNSAFE_KEY_BYTES = re.compile(rb"[\x00-\x20\x7f]")

_clients: dict[tuple[Any, ...], tuple[Client, BlockingClient]] = {}
_clients_lock = threading.Lock()


def shared_clients(servers: list[str], options: FastCacheOptions) -> tuple[Client, BlockingClient]:
    """The process-wide (async, blocking) clients for these servers and options."""
    identity = (
        tuple(servers),
        options.operation_timeout,
        options.connect_timeout,
        options.min_connections,
        options.max_connections,
        options.idle_timeout,
        options.max_value_size,
    )
    clients = _clients.get(identity)
    if clients is None:
        with _clients_lock:
            clients = _clients.get(identity)
            if clients is None:
                client = Client(
                    servers,
                    timeout=options.operation_timeout,
                    connect_timeout=options.connect_timeout,
                    min_connections=options.min_connections,
                    max_connections=options.max_connections,
                    idle_timeout=options.idle_timeout,
                    # Replies may carry values other clients stored, up to the server's limit.
                    max_value_size=max(options.max_value_size, 1024 * 1024) + 1024,
                )
                clients = _clients[identity] = (client, BlockingClient(client.cluster))
    return clients


def make_serializer(options: FastCacheOptions) -> Serializer:
    cls = SERIALIZERS[options.serializer]
    if cls is PickleSerializer:
        return PickleSerializer(
            options.compress_min_length, options.compress_level, options.pickle_protocol
        )
    return cls(options.compress_min_length, options.compress_level)


def _key_bytes(made: str) -> bytes | None:
    """The key's UTF-8 bytes; None when it has none (lone surrogates)."""
    try:
        return made.encode()
    except UnicodeEncodeError:
        return None


def _raise_invalid_key(made: str, data: bytes | None) -> None:
    """Raise Django's ``InvalidCacheKey``, with its messages, when ``data`` is unusable."""
    if data is None:
        raise InvalidCacheKey(
            f"Cache key contains characters that will cause errors if used with memcached: {made!r}"
        )
    if len(data) > MEMCACHE_MAX_KEY_LENGTH:
        raise InvalidCacheKey(
            f"Cache key will cause errors if used with memcached: {made!r} "
            f"(longer than {MEMCACHE_MAX_KEY_LENGTH})"
        )
    if _UNSAFE_KEY_BYTES.search(data):
        raise InvalidCacheKey(
            f"Cache key contains characters that will cause errors if used with memcached: {made!r}"
        )


class FastCache(BaseCache):
    """A Django cache backend for memcached. See the configuration reference in the docs."""

    def __init__(self, server: str | list[str] | tuple[str, ...], params: dict[str, Any]) -> None:
        super().__init__(params)
        # A bad configuration is refused on first use, not here: Django's own system checks
        # build every cache alias, and raising here would stop them before FastCache's check
        # could report each problem with its id.
        self._configuration_error: str | None = None
        try:
            # Kept as given, the way Django's memcached backends keep it.
            self._servers = parse_locations(server)
        except (ConfigurationError, TypeError):
            self._servers = []
            self._configuration_error = (
                f"Bad FastCache LOCATION: a string or a list of strings, got {server!r}."
            )
        options, problems = parse_options(params.get("OPTIONS"))
        if problems:
            self._configuration_error = "Bad FastCache OPTIONS: " + " ".join(
                p.message for p in problems
            )
        self._options = options
        self._serializer = make_serializer(options)
        self._clients: tuple[Client, BlockingClient] | None = None  # no I/O in __init__

    # -- plumbing ------------------------------------------------------------------------
    def _shared_clients(self) -> tuple[Client, BlockingClient]:
        clients = self._clients
        if clients is None:
            if self._configuration_error is not None:
                raise ImproperlyConfigured(self._configuration_error)
            clients = self._clients = shared_clients(self._servers, self._options)
        return clients

    @property
    def client(self) -> Client:
        """The shared asyncio client (created on first use)."""
        return self._shared_clients()[0]

    @property
    def blocking_client(self) -> BlockingClient:
        """The shared blocking client the sync API uses."""
        return self._shared_clients()[1]

    def wire_key(self, key: Any, version: int | None = None) -> bytes:
        """The key as sent to memcached: prefixed, versioned, UTF-8, validated."""
        made = self.make_key(key, version=version)
        data: bytes | None
        try:
            data = made.encode()
        except UnicodeEncodeError:  # lone surrogates: the key has no UTF-8 form
            data = None
        if (
            data is not None
            and len(data) <= MEMCACHE_MAX_KEY_LENGTH
            and not _UNSAFE_KEY_BYTES.search(data)
        ):
            return data
        if self._options.hash_invalid_keys:
            raw = made.encode("utf-8", "surrogatepass")
            return b"fastcache:h:" + hashlib.blake2b(raw, digest_size=24).hexdigest().encode()
        _raise_invalid_key(made, data)
        raise AssertionError("unreachable: the key was found invalid")

    def validate_key(self, key: Any) -> None:
        """Raise ``InvalidCacheKey`` for a made key memcached cannot carry."""
        if not self._options.hash_invalid_keys:
            _raise_invalid_key(str(key), _key_bytes(str(key)))

    def get_backend_timeout(self, timeout: float | object | None = DEFAULT_TIMEOUT) -> int:
        """Django's timeout as memcached's exptime: 0 never expires, -1 already expired."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            return 0
        assert isinstance(timeout, (int, float))
        if timeout <= 0:
            return -1
        if timeout > MAX_RELATIVE_EXPIRY:
            # An absolute time for memcached, no later than the latest it can hold.
            return min(int(time.time()) + math.ceil(min(timeout, MAX_EXPTIME)), MAX_EXPTIME)
        return math.ceil(timeout)  # a fraction of a second still means "a while"

    def _encode(self, value: Any) -> tuple[bytes, int]:
        data, flags = self._serializer.dumps(value)
        if len(data) > self._options.max_value_size:
            raise ValueTooLargeError(
                f"value of {len(data)} bytes exceeds max_value_size "
                f"({self._options.max_value_size} bytes)"
            )
        return data, flags

    # -- each operation, once, over either client --------------------------------------------
    async def _get(
        self, client: CommandSet, key: Any, default: Any = None, version: int | None = None
    ) -> Any:
        item = await client.get(self.wire_key(key, version))
        if item is None:
            return default
        return self._serializer.loads(item.value, item.flags)

    async def _set(
        self,
        client: CommandSet,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        wire = self.wire_key(key, version)
        try:
            data, flags = self._encode(value)
            stored = await client.set(
                wire, data, flags=flags, exptime=self.get_backend_timeout(timeout)
            )
        except ValueTooLargeError:
            # The old value must not outlive a failed set (sessions rely on this).
            await client.delete(wire)
            raise
        if not stored:
            await client.delete(wire)

    async def _add(
        self,
        client: CommandSet,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        wire = self.wire_key(key, version)
        data, flags = self._encode(value)
        return await client.add(wire, data, flags=flags, exptime=self.get_backend_timeout(timeout))

    async def _touch(
        self,
        client: CommandSet,
        key: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        wire = self.wire_key(key, version)
        return await client.touch(wire, self.get_backend_timeout(timeout))

    async def _delete(self, client: CommandSet, key: Any, version: int | None = None) -> bool:
        return await client.delete(self.wire_key(key, version))

    async def _get_many(
        self, client: CommandSet, keys: Iterable[Any], version: int | None = None
    ) -> dict[Any, Any]:
        originals = {self.wire_key(key, version): key for key in keys}
        if not originals:
            return {}
        items = await client.get_many(originals)
        loads = self._serializer.loads
        return {originals[wire]: loads(item.value, item.flags) for wire, item in items.items()}

    async def _set_many(
        self,
        client: CommandSet,
        data: Mapping[Any, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        originals: dict[bytes, Any] = {}
        triples: list[tuple[bytes, bytes, int]] = []
        too_large: list[bytes] = []
        for key, value in data.items():
            wire = self.wire_key(key, version)
            originals[wire] = key
            try:
                encoded, flags = self._encode(value)
            except ValueTooLargeError:
                too_large.append(wire)
                continue
            triples.append((wire, encoded, flags))
        exptime = self.get_backend_timeout(timeout)
        failed = await client.set_many(triples, exptime=exptime) if triples else []
        failed += too_large
        if failed:
            # No old value may outlive a failed write. Keys whose node is unreachable
            # cannot be deleted now; they are reported failed all the same.
            with contextlib.suppress(NetworkError):
                await client.delete_many(failed)
        return [originals[wire] for wire in failed]

    async def _delete_many(
        self, client: CommandSet, keys: Iterable[Any], version: int | None = None
    ) -> None:
        wires = [self.wire_key(key, version) for key in keys]
        if wires:
            await client.delete_many(wires)

    async def _incr(
        self, client: CommandSet, key: Any, delta: int = 1, version: int | None = None
    ) -> int:
        wire = self.wire_key(key, version)
        try:
            if delta < 0:
                value = await client.decr(wire, -delta)
            else:
                value = await client.incr(wire, delta)
        except ClientError as exc:
            # memcached refuses to count a value that is not a decimal number (a pickled
            # object, a negative int): the same mistake locmem reports as a TypeError.
            raise NonIntegerValueError(f"the value of {wire.decode()!r} is not an integer") from exc
        if value is None:
            raise ValueError(f"Key '{wire.decode()}' not found")
        return value

    async def _decr(
        self, client: CommandSet, key: Any, delta: int = 1, version: int | None = None
    ) -> int:
        return await self._incr(client, key, -delta, version)

    async def _has_key(self, client: CommandSet, key: Any, version: int | None = None) -> bool:
        return await client.get(self.wire_key(key, version)) is not None

    async def _clear(self, client: CommandSet) -> None:
        await client.flush_all()

    # -- the sync API: the operations run by the bridge over the blocking client -------------
    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return run_blocking(self._get(self.blocking_client, key, default, version))

    def set(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        run_blocking(self._set(self.blocking_client, key, value, timeout, version))

    def add(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        return run_blocking(self._add(self.blocking_client, key, value, timeout, version))

    def touch(
        self, key: Any, timeout: float | object | None = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return run_blocking(self._touch(self.blocking_client, key, timeout, version))

    def delete(self, key: Any, version: int | None = None) -> bool:
        return run_blocking(self._delete(self.blocking_client, key, version))

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return run_blocking(self._get_many(self.blocking_client, keys, version))

    def set_many(
        self,
        data: Mapping[Any, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        return run_blocking(self._set_many(self.blocking_client, data, timeout, version))

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        run_blocking(self._delete_many(self.blocking_client, keys, version))

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return run_blocking(self._incr(self.blocking_client, key, delta, version))

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return run_blocking(self._decr(self.blocking_client, key, delta, version))

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return run_blocking(self._has_key(self.blocking_client, key, version))

    def clear(self) -> None:
        run_blocking(self._clear(self.blocking_client))

    def close(self, **kwargs: Any) -> None:
        """Nothing to do: connections are process-global and outlive a request."""

    # -- the async API: the same operations, awaited on the caller's event loop --------------
    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return await self._get(self.client, key, default, version)

    async def aset(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        await self._set(self.client, key, value, timeout, version)

    async def aadd(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        return await self._add(self.client, key, value, timeout, version)

    async def atouch(
        self, key: Any, timeout: float | object | None = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return await self._touch(self.client, key, timeout, version)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._delete(self.client, key, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return await self._get_many(self.client, keys, version)

    async def aset_many(
        self,
        data: Mapping[Any, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        return await self._set_many(self.client, data, timeout, version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        await self._delete_many(self.client, keys, version)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._incr(self.client, key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._decr(self.client, key, delta, version)

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self._has_key(self.client, key, version)

    async def aclear(self) -> None:
        await self._clear(self.client)

    async def aclose(self, **kwargs: Any) -> None:
        """Nothing to do: connections are process-global and outlive a request."""


__all__ = ["FastCache"]
