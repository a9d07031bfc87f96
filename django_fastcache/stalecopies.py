"""The ``stale_on_delete`` store: ``delete`` keeps a stale copy that only get_or_set uses.

``delete`` marks the value stale (``md <key> I T<seconds> C<cas>``) instead of removing it.
memcached then hands the next ``mg`` of the key the win (``X W``) and everyone after it
``X Z`` until the item is replaced: get_or_set's winner recomputes while the others wait
for it, or, with ``stale_while_revalidate``, take the stale copy at once.

For every other operation the key is gone, as Django says a deleted key is: the classic
``get`` cannot see memcached's stale mark, so reads here are ``mg`` (and see ``X``), and
``add``, ``touch``, ``incr``/``decr`` and ``delete`` look before they act (``add`` and
``delete`` with the CAS they saw). A read that took a stale item's win gives it back
(``md … I C<cas>``, which keeps the item's TTL) so that get_or_set's next caller wins.
Where a node does not speak meta, each operation is the classic one (and deletes
there remove).
"""

from __future__ import annotations

import math
import time

from .client.commands import CommandSet
from .expiry import memcached_exptime
from .protocol import MetaReply, MetaStatus, MetaUnsupportedError
from .stampede import is_stub, meta_support, release
from .stores import MemcachedStore, Value

#: Attempts of an operation that keeps finding the key written between its look and its act.
_TRIES = 8


class StaleKeepingStore(MemcachedStore):
    """memcached alone, with ``delete`` keeping a stale copy for ``keep`` seconds at most
    (never past the value's own expiry)."""

    def __init__(self, keep: float, protocol: str) -> None:
        self.keep = keep
        self.protocol = protocol

    async def _speaks(self, client: CommandSet, key: bytes) -> bool:
        node = client.cluster.node_index(key)
        return await meta_support(self.protocol, client.cluster).speaks(client, node)

    async def _look(
        self, client: CommandSet, key: bytes, *, value: bool = True, ttl: bool = False
    ) -> MetaReply | None:
        """The key's item as ``mg`` sees it, None when missing or stale (a stale item's win,
        if this look took it, given back). Raises MetaUnsupportedError (noted) when the
        node no longer speaks meta."""
        try:
            reply = await client.meta_get(
                key, value=value, client_flags=value, cas=True, ttl=ttl, no_bump=not value
            )
        except MetaUnsupportedError as exc:
            node = client.cluster.node_index(key)
            meta_support(self.protocol, client.cluster).refused(node, exc)
            raise
        if reply is None:
            return None
        if reply.stale:
            if reply.win:
                await release(client, key, reply, False)
            return None
        return reply

    # -- reads ---------------------------------------------------------------------------
    async def get(self, client: CommandSet, key: bytes) -> Value | None:
        if not await self._speaks(client, key):
            return await super().get(client, key)
        try:
            reply = await self._look(client, key)
        except MetaUnsupportedError:
            return await super().get(client, key)
        if reply is None:
            return None
        assert reply.value is not None
        assert reply.client_flags is not None
        return reply.value, reply.client_flags

    async def get_many(self, client: CommandSet, keys: list[bytes]) -> dict[bytes, Value]:
        meta: list[bytes] = []
        classic: list[bytes] = []
        for key in keys:
            (meta if await self._speaks(client, key) else classic).append(key)
        found: dict[bytes, Value] = {}
        if meta:
            try:
                replies = await client.meta_get_many(meta, cas=True)
            except MetaUnsupportedError:
                # Some node stopped speaking meta: each key on its own (which notes it).
                for key in meta:
                    value = await self.get(client, key)
                    if value is not None:
                        found[key] = value
            else:
                for key, reply in replies.items():
                    if reply.stale:
                        if reply.win:
                            await release(client, key, reply, False)
                        continue
                    assert reply.value is not None
                    assert reply.client_flags is not None
                    found[key] = (reply.value, reply.client_flags)
        if classic:
            found.update(await super().get_many(client, classic))
        return found

    # -- writes that must find the key missing or present --------------------------------
    async def add(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool:
        if await super().add(client, key, data, flags, ttl):
            return True
        if not await self._speaks(client, key):
            return False
        for _attempt in range(_TRIES):
            try:
                reply = await client.meta_get(key, value=False, client_flags=False, cas=True)
            except MetaUnsupportedError:
                return False
            if reply is None:
                if await super().add(client, key, data, flags, ttl):
                    return True  # gone meanwhile (it expired)
                continue
            if not reply.stale:
                return False  # a value (or a lease's stub: the backend's add looks at those)
            # A deleted key's stale copy: the add replaces it, with the CAS just seen.
            exptime = memcached_exptime(ttl, time.time())
            stored = await client.meta_set(key, data, flags=flags, exptime=exptime, cas=reply.cas)
            if stored.status is MetaStatus.HD:
                return True
            if reply.win:
                await release(client, key, reply, False)
        return False

    async def touch(self, client: CommandSet, key: bytes, ttl: float | None) -> bool:
        if await self._speaks(client, key):
            try:
                if await self._look(client, key, value=False) is None:
                    return False
            except MetaUnsupportedError:
                pass
        # A delete landing after the look is ordered after this touch (which then found
        # the value); the touch cannot revive it, and can at most lengthen its stale life.
        return await super().touch(client, key, ttl)

    async def incr(self, client: CommandSet, key: bytes, delta: int) -> int | None:
        if await self._speaks(client, key):
            try:
                reply = await self._look(client, key)
            except MetaUnsupportedError:
                reply = None
            else:
                if reply is None or is_stub(reply.value or b"", reply.client_flags or 0):
                    return None
        # memcached's own atomic count, with no CAS (a busy counter would keep retrying).
        # A delete landing after the look is ordered after this incr: the count then
        # lands on the stale copy, which is what that delete would have kept.
        return await super().incr(client, key, delta)

    async def delete(self, client: CommandSet, key: bytes) -> bool:
        if not await self._speaks(client, key):
            return await super().delete(client, key)
        for _attempt in range(_TRIES):
            try:
                reply = await self._look(client, key, ttl=True)
            except MetaUnsupportedError:
                return await super().delete(client, key)
            if reply is None:
                return False
            if is_stub(reply.value or b"", reply.client_flags or 0):
                # A value being computed: removed as a plain delete removes it, so that
                # the winner's store fails.
                await client.meta_delete(key, cas=reply.cas)
                return False
            left = reply.ttl if reply.ttl is not None and reply.ttl >= 0 else None
            keep = math.ceil(self.keep) if left is None else min(left, math.ceil(self.keep))
            if keep <= 0:
                done = await client.meta_delete(key, cas=reply.cas)  # about to expire anyway
            else:
                done = await client.meta_delete(
                    key,
                    cas=reply.cas,
                    invalidate=True,
                    exptime=memcached_exptime(keep, time.time()),
                )
            if done.status is MetaStatus.HD:
                return True
            if done.status is MetaStatus.NF:
                return False
            # EX: written meanwhile; look again.
        return await super().delete(client, key)  # removing is always allowed

    async def delete_many(self, client: CommandSet, keys: list[bytes]) -> None:
        for key in dict.fromkeys(keys):
            await self.delete(client, key)


__all__ = ["StaleKeepingStore"]
