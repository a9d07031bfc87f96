"""What the backend stores through: memcached alone, or memcached with the disk tier.

Both stores take the client to use per call (the asyncio client on the async API, the
blocking one on the sync API) and speak in wire keys, encoded values ``(data, flags)`` and
lifetimes in seconds (``ttl``: None never expires, 0 or less is already gone).
"""

from __future__ import annotations

import time
from typing import Protocol

from .client.commands import CommandSet
from .expiry import memcached_exptime
from .tiered import TieredStore

Value = tuple[bytes, int]


class Store(Protocol):
    async def get(self, client: CommandSet, key: bytes) -> Value | None: ...

    async def get_many(self, client: CommandSet, keys: list[bytes]) -> dict[bytes, Value]: ...

    async def set(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool: ...

    async def add(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool: ...

    async def set_many(
        self, client: CommandSet, triples: list[tuple[bytes, bytes, int]], ttl: float | None
    ) -> list[bytes]: ...

    async def touch(self, client: CommandSet, key: bytes, ttl: float | None) -> bool: ...

    async def delete(self, client: CommandSet, key: bytes) -> bool: ...

    async def delete_many(self, client: CommandSet, keys: list[bytes]) -> None: ...

    async def incr(self, client: CommandSet, key: bytes, delta: int) -> int | None: ...

    async def clear(self, client: CommandSet) -> None: ...


class MemcachedStore:
    """memcached alone: each operation is the one command."""

    async def get(self, client: CommandSet, key: bytes) -> Value | None:
        item = await client.get(key)
        return None if item is None else (item.value, item.flags)

    async def get_many(self, client: CommandSet, keys: list[bytes]) -> dict[bytes, Value]:
        items = await client.get_many(keys)
        return {key: (item.value, item.flags) for key, item in items.items()}

    async def set(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool:
        exptime = memcached_exptime(ttl, time.time())
        return await client.set(key, data, flags=flags, exptime=exptime)

    async def add(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool:
        exptime = memcached_exptime(ttl, time.time())
        return await client.add(key, data, flags=flags, exptime=exptime)

    async def set_many(
        self, client: CommandSet, triples: list[tuple[bytes, bytes, int]], ttl: float | None
    ) -> list[bytes]:
        return await client.set_many(triples, exptime=memcached_exptime(ttl, time.time()))

    async def touch(self, client: CommandSet, key: bytes, ttl: float | None) -> bool:
        return await client.touch(key, memcached_exptime(ttl, time.time()))

    async def delete(self, client: CommandSet, key: bytes) -> bool:
        return await client.delete(key)

    async def delete_many(self, client: CommandSet, keys: list[bytes]) -> None:
        await client.delete_many(keys)

    async def incr(self, client: CommandSet, key: bytes, delta: int) -> int | None:
        if type(delta) is int and delta < 0:
            return await client.decr(key, -delta)
        return await client.incr(key, delta)  # (not an int: refused there)

    async def clear(self, client: CommandSet) -> None:
        await client.flush_all()


__all__ = ["MemcachedStore", "Store", "TieredStore", "Value"]
