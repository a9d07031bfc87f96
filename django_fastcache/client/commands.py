"""Every memcached command, written once over three I/O primitives.

:class:`CommandSet` turns calls into requests (protocol encoders), routes them to nodes
(the cluster) and turns replies into results. How bytes reach a node is left to
subclasses: :class:`~django_fastcache.client.client.Client` awaits asyncio connections;
:class:`~django_fastcache.client.blocking.BlockingClient` uses blocking sockets owned by
the calling thread, and its coroutines finish without ever suspending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from .._mypyc import mypyc_attr
from ..errors import ClientError, CommandError, FastCacheError, InvalidArgumentError
from ..protocol import (
    Item,
    ReplyKind,
    Status,
    cache_memlimit_command,
    cas_command,
    decr_command,
    delete_command,
    flush_all_command,
    gat_command,
    get_command,
    incr_command,
    stats_command,
    storage_command,
    touch_command,
    validate_key,
    verbosity_command,
    version_command,
)
from ..protocol.counters import RECOUNT_TRIES
from .cluster import Cluster
from .meta import MetaCommands

#: Keys per ``get`` line when a node is asked for many keys (the lines are pipelined).
MULTI_GET_CHUNK = 100
#: The longest value :meth:`CommandSet.add_seeing` (and the blocking client's
#: ``add_seeing_now``) is meant for: a stored add reads its value back, which costs less than
#: the round trip it saves for values this short.
ADD_SEEING_MAX = 4096

#: Work to do while a request is on the wire (see :meth:`CommandSet.set`).
Meanwhile = Callable[[], object] | None
#: Per node: the bytes to write and the kind of each reply expected, in order.
Requests = dict[int, tuple[bytes, list[ReplyKind]]]
#: Per node: for each reply of its request, the keys a retrieval asked for (None for
#: other replies). A reply with an item for any other key breaks the protocol.
Expected = dict[int, list["Sequence[bytes] | None"]]
#: Per node: the replies (error replies included as CommandError values), or the error
#: that failed the node's connection.
Replies = dict[int, "list[Any] | FastCacheError"]

_STORAGE_VERBS = {
    "set": b"set",
    "add": b"add",
    "replace": b"replace",
    "append": b"append",
    "prepend": b"prepend",
}


# The asyncio client, and test doubles, are subclasses that stay interpreted.
@mypyc_attr(allow_interpreted_subclasses=True)
class CommandSet(MetaCommands):
    """The memcached commands. Keys and values are ``bytes``; see the docs for each.

    The meta commands (``mg``, ``ms``, ``md``, ``ma``, ``mn``) come from
    :class:`~django_fastcache.client.meta.MetaCommands`, over the same I/O primitives."""

    cluster: Cluster

    # -- the I/O primitives subclasses provide ------------------------------------------
    async def _request(
        self,
        node: int,
        data: bytes,
        kind: ReplyKind,
        meanwhile: Meanwhile = None,
        keys: Sequence[bytes] | None = None,
    ) -> Any:
        """One request, one reply; an error reply is raised. ``meanwhile`` is called once the
        request is written and before its reply is read; ``keys`` are a retrieval's keys."""
        raise NotImplementedError

    async def _send_noreply(self, node: int, data: bytes) -> None:
        """Requests that expect no reply."""
        raise NotImplementedError

    async def _pipelines(self, requests: Requests, expected: Expected | None = None) -> Replies:
        """Several nodes at once, each given requests pipelined in one write."""
        raise NotImplementedError

    # -- retrieval -----------------------------------------------------------------------
    async def get(self, key: bytes) -> Item | None:
        """The item (``value``, ``flags``) stored under ``key``, or None."""
        # Encoding first validates the key, before it is hashed to pick a node.
        keys = (key,)
        data = get_command(keys)
        node = self.cluster.node_index(key)
        items = await self._request(node, data, ReplyKind.RETRIEVAL, None, keys)
        return items[0] if items else None

    async def gets(self, key: bytes) -> Item | None:
        """Like :meth:`get`, with the item's CAS token in ``item.cas``."""
        keys = (key,)
        data = get_command(keys, cas=True)
        node = self.cluster.node_index(key)
        items = await self._request(node, data, ReplyKind.RETRIEVAL, None, keys)
        return items[0] if items else None

    async def gat(self, key: bytes, exptime: int) -> Item | None:
        """Get and touch: fetch ``key`` and give it the expiry ``exptime``."""
        keys = (key,)
        data = gat_command(keys, exptime)
        node = self.cluster.node_index(key)
        items = await self._request(node, data, ReplyKind.RETRIEVAL, None, keys)
        return items[0] if items else None

    async def gats(self, key: bytes, exptime: int) -> Item | None:
        """Get and touch, with the CAS token."""
        keys = (key,)
        data = gat_command(keys, exptime, cas=True)
        node = self.cluster.node_index(key)
        items = await self._request(node, data, ReplyKind.RETRIEVAL, None, keys)
        return items[0] if items else None

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, Item]:
        """Items of the keys found: one round trip per node, the nodes asked at once."""
        return await self._retrieve_many(keys, lambda chunk: get_command(chunk, checked=True))

    async def gets_many(self, keys: Iterable[bytes]) -> dict[bytes, Item]:
        return await self._retrieve_many(
            keys, lambda chunk: get_command(chunk, cas=True, checked=True)
        )

    async def gat_many(self, keys: Iterable[bytes], exptime: int) -> dict[bytes, Item]:
        return await self._retrieve_many(
            keys, lambda chunk: gat_command(chunk, exptime, checked=True)
        )

    async def gats_many(self, keys: Iterable[bytes], exptime: int) -> dict[bytes, Item]:
        return await self._retrieve_many(
            keys, lambda chunk: gat_command(chunk, exptime, cas=True, checked=True)
        )

    async def get_many_by_node(
        self, keys: Iterable[bytes]
    ) -> tuple[dict[bytes, Item], dict[int, FastCacheError]]:
        """:meth:`get_many`, each node on its own: the items found on the nodes that
        answered, and the error of each node that did not (its keys neither found nor
        missing), where ``get_many`` raises the first. For a caller that settles a failed
        node's keys elsewhere (the disk tier) without asking the other nodes again."""
        found: dict[bytes, Item] = {}
        failed: dict[int, FastCacheError] = {}
        results = await self._retrieval_results(
            keys, lambda chunk: get_command(chunk, checked=True)
        )
        for node, replies in results.items():
            error = _node_failure(replies)
            if error is not None:
                failed[node] = error
                continue
            for reply in cast("list[Any]", replies):  # (not an error: see _node_failure)
                for item in reply:
                    found[item.key] = item
        return found, failed

    async def _retrieve_many(
        self, keys: Iterable[bytes], encode: Callable[[Sequence[bytes]], bytes]
    ) -> dict[bytes, Item]:
        found: dict[bytes, Item] = {}
        for replies in _raise_first_error(await self._retrieval_results(keys, encode)).values():
            for reply in replies:
                if isinstance(reply, CommandError):
                    raise reply
                for item in reply:
                    found[item.key] = item
        return found

    async def _retrieval_results(
        self, keys: Iterable[bytes], encode: Callable[[Sequence[bytes]], bytes]
    ) -> Replies:
        """Each node's replies to the retrieval of its keys (or its error), by node."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        for key in unique:
            validate_key(key)  # before hashing (a str key must not reach the hash), once
        requests: Requests = {}
        expected: Expected = {}
        for node, node_keys in self.cluster.group(unique).items():
            chunks: list[Sequence[bytes] | None] = [
                node_keys[i : i + MULTI_GET_CHUNK]
                for i in range(0, len(node_keys), MULTI_GET_CHUNK)
            ]
            data = b"".join([encode(chunk) for chunk in chunks if chunk is not None])
            requests[node] = (data, [ReplyKind.RETRIEVAL] * len(chunks))
            expected[node] = chunks
        return await self._pipelines(requests, expected)

    # -- storage -------------------------------------------------------------------------
    async def _store(
        self,
        verb: bytes,
        key: bytes,
        value: bytes,
        flags: int,
        exptime: int,
        noreply: bool,
        meanwhile: Meanwhile = None,
    ) -> bool:
        data = storage_command(verb, key, value, flags=flags, exptime=exptime, noreply=noreply)
        node = self.cluster.node_index(key)
        if noreply:
            await self._send_noreply(node, data)
            if meanwhile is not None:
                meanwhile()
            return True
        return await self._request(node, data, ReplyKind.STORAGE, meanwhile) is Status.STORED

    async def set(
        self,
        key: bytes,
        value: bytes,
        *,
        flags: int = 0,
        exptime: int = 0,
        noreply: bool = False,
        meanwhile: Meanwhile = None,
    ) -> bool:
        """Store ``value``; True when stored. A value over the server's item limit raises
        :class:`~django_fastcache.errors.ValueTooLargeError`.

        ``meanwhile``, if given, is called after the request is sent and before the reply
        is read: work that overlaps the round trip (the disk tier's write uses it)."""
        return await self._store(b"set", key, value, flags, exptime, noreply, meanwhile)

    async def add(
        self, key: bytes, value: bytes, *, flags: int = 0, exptime: int = 0, noreply: bool = False
    ) -> bool:
        """Store only if ``key`` is absent; False when it exists."""
        return await self._store(b"add", key, value, flags, exptime, noreply)

    async def add_seeing(
        self, key: bytes, value: bytes, *, flags: int = 0, exptime: int = 0
    ) -> tuple[bool, Item | None]:
        """:meth:`add` and, in the same write, ``get`` of the key: whether the add took and,
        when it was refused, the item that held the key then (None when nothing did any
        more: it expired or went meanwhile). One round trip where an add and then a get
        take two, for the backend's ``add`` where get_or_set's leases leave stubs, which a
        refused add must tell from values. A stored add reads its value back: meant for
        values up to :data:`ADD_SEEING_MAX` bytes."""
        keys = (key,)
        data = storage_command(b"add", key, value, flags=flags, exptime=exptime)
        data += get_command(keys)
        node = self.cluster.node_index(key)
        requests: Requests = {node: (data, [ReplyKind.STORAGE, ReplyKind.RETRIEVAL])}
        replies = _raise_first_error(await self._pipelines(requests, {node: [None, keys]}))
        status, items = replies[node]
        if isinstance(status, CommandError):
            raise status
        if status is Status.STORED:
            return True, None
        if isinstance(items, CommandError):
            raise items
        return False, items[0] if items else None

    async def replace(
        self, key: bytes, value: bytes, *, flags: int = 0, exptime: int = 0, noreply: bool = False
    ) -> bool:
        """Store only if ``key`` exists; False when it does not."""
        return await self._store(b"replace", key, value, flags, exptime, noreply)

    async def append(self, key: bytes, value: bytes, *, noreply: bool = False) -> bool:
        """Append bytes to an existing value; False when ``key`` does not exist."""
        return await self._store(b"append", key, value, 0, 0, noreply)

    async def prepend(self, key: bytes, value: bytes, *, noreply: bool = False) -> bool:
        """Prepend bytes to an existing value; False when ``key`` does not exist."""
        return await self._store(b"prepend", key, value, 0, 0, noreply)

    async def cas(
        self,
        key: bytes,
        value: bytes,
        cas_token: int,
        *,
        flags: int = 0,
        exptime: int = 0,
        noreply: bool = False,
    ) -> bool:
        """Store only if the item is unchanged since ``gets`` returned ``cas_token``.

        False when another write came first (``EXISTS``) or the item is gone."""
        data = cas_command(key, value, cas_token, flags=flags, exptime=exptime, noreply=noreply)
        node = self.cluster.node_index(key)
        if noreply:
            await self._send_noreply(node, data)
            return True
        return await self._request(node, data, ReplyKind.STORAGE) is Status.STORED

    async def set_many(
        self, items: Iterable[tuple[bytes, bytes, int]], *, exptime: int = 0, verb: str = "set"
    ) -> list[bytes]:
        """Store ``(key, value, flags)`` triples, pipelined per node, the nodes at once.

        Returns the keys that were not stored (refused, too large, or their node failed)."""
        command = _STORAGE_VERBS.get(verb)
        if command is None:
            raise InvalidArgumentError(f"unknown storage verb {verb!r}")
        encoded = {
            key: storage_command(command, key, value, flags=flags, exptime=exptime)
            for key, value, flags in items
        }
        if not encoded:
            return []
        groups = self.cluster.group(encoded)
        requests: Requests = {
            node: (b"".join([encoded[k] for k in keys]), [ReplyKind.STORAGE] * len(keys))
            for node, keys in groups.items()
        }
        results = await self._pipelines(requests)
        failed: list[bytes] = []
        for node, keys in groups.items():
            replies = results[node]
            if isinstance(replies, FastCacheError):
                failed.extend(keys)
            else:
                failed.extend(k for k, r in zip(keys, replies) if r is not Status.STORED)
        return failed

    # -- deletion, touch, arithmetic ----------------------------------------------------
    async def delete(self, key: bytes, *, noreply: bool = False) -> bool:
        """Remove ``key``; True when it existed."""
        data = delete_command(key, noreply=noreply)
        node = self.cluster.node_index(key)
        if noreply:
            await self._send_noreply(node, data)
            return True
        return await self._request(node, data, ReplyKind.DELETE) is Status.DELETED

    async def delete_many(self, keys: Iterable[bytes]) -> dict[bytes, bool]:
        """Remove keys, pipelined per node; each key maps to whether it existed."""
        existed, failed = await self.delete_many_by_node(keys)
        if failed:
            raise next(iter(failed.values()))
        return existed

    async def delete_many_at(self, node: int, keys: Iterable[bytes]) -> dict[bytes, bool]:
        """:meth:`delete_many` with every key sent to ``node`` (by index), wherever this
        client would route it: for a node's outage replay, which deletes the keys journaled
        for that node by processes whose node list or placement may differ from this one's
        (a deploy adding a node routes some keys elsewhere)."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        request = b"".join([delete_command(key) for key in keys])
        results = await self._pipelines({node: (request, [ReplyKind.DELETE] * len(keys))})
        replies = _raise_first_error(results)[node]
        existed: dict[bytes, bool] = {}
        for key, reply in zip(keys, replies):
            if isinstance(reply, CommandError):
                raise reply
            existed[key] = reply is Status.DELETED
        return existed

    async def delete_many_by_node(
        self, keys: Iterable[bytes]
    ) -> tuple[dict[bytes, bool], dict[int, FastCacheError]]:
        """:meth:`delete_many`, each node on its own: whether each key of the nodes that
        answered existed, and the error of each node that did not (its keys' outcome
        unknown), where ``delete_many`` raises the first. For a caller that settles a
        failed node's keys elsewhere (the disk tier) without asking the others again."""
        encoded = {key: delete_command(key) for key in keys}
        if not encoded:
            return {}, {}
        groups = self.cluster.group(encoded)
        requests: Requests = {
            node: (
                b"".join([encoded[k] for k in node_keys]),
                [ReplyKind.DELETE] * len(node_keys),
            )
            for node, node_keys in groups.items()
        }
        results = await self._pipelines(requests)
        existed: dict[bytes, bool] = {}
        failed: dict[int, FastCacheError] = {}
        for node, node_keys in groups.items():
            replies = results[node]
            error = _node_failure(replies)
            if error is not None:
                failed[node] = error
                continue
            for key, reply in zip(node_keys, cast("list[Any]", replies)):
                existed[key] = reply is Status.DELETED
        return existed, failed

    async def touch(self, key: bytes, exptime: int, *, noreply: bool = False) -> bool:
        """Give ``key`` a new expiry; True when it exists."""
        data = touch_command(key, exptime, noreply=noreply)
        node = self.cluster.node_index(key)
        if noreply:
            await self._send_noreply(node, data)
            return True
        return await self._request(node, data, ReplyKind.TOUCH) is Status.TOUCHED

    async def incr(self, key: bytes, delta: int = 1, *, noreply: bool = False) -> int | None:
        """Add ``delta`` to a decimal value, atomically on the server, keeping its expiry.

        The new value, or None when ``key`` does not exist (and always with noreply)."""
        data = incr_command(key, delta, noreply=noreply)
        return await self._arithmetic(data, key, noreply, delta)

    async def decr(self, key: bytes, delta: int = 1, *, noreply: bool = False) -> int | None:
        """Subtract ``delta`` (memcached stops at 0); None when ``key`` does not exist."""
        data = decr_command(key, delta, noreply=noreply)
        return await self._arithmetic(data, key, noreply, -delta)

    async def _arithmetic(self, data: bytes, key: bytes, noreply: bool, delta: int) -> int | None:
        """``data`` (an incr or decr of ``key`` by ``delta``, negative for a decr) sent and
        its reply read. A counter memcached refuses by mistake is counted here
        (:meth:`~MetaCommands.recount`)."""
        node = self.cluster.node_index(key)
        if noreply:
            await self._send_noreply(node, data)
            return None
        tries = RECOUNT_TRIES
        while True:
            try:
                reply = await self._request(node, data, ReplyKind.ARITHMETIC)
                return None if reply is Status.NOT_FOUND else int(reply)
            except ClientError as refusal:
                recount = await self.recount(key, delta, refusal)
                if recount.value is not None:
                    return recount.value
                tries -= 1  # the item changed meanwhile: counted again, a few times at most
                if not tries:
                    raise refusal from None

    # -- whole-node commands ------------------------------------------------------------
    async def flush_all(
        self, delay: int = 0, *, noreply: bool = False, nodes: Iterable[int] | None = None
    ) -> None:
        """Invalidate every item on every node, or on the ``nodes`` given by index
        (after ``delay`` seconds)."""
        data = flush_all_command(delay, noreply=noreply)
        await self._broadcast(data, ReplyKind.OK, noreply, nodes)

    async def flush_all_by_node(self, nodes: Iterable[int]) -> dict[int, FastCacheError]:
        """:meth:`flush_all` of the ``nodes`` given by index, each on its own: the error
        of each node that failed (the others were flushed), where ``flush_all`` raises the
        first. For a caller that settles a failed node elsewhere without flushing the
        others again."""
        data = flush_all_command(0)
        results = await self._pipelines({node: (data, [ReplyKind.OK]) for node in set(nodes)})
        failed: dict[int, FastCacheError] = {}
        for node, replies in results.items():
            error = _node_failure(replies)
            if error is not None:
                failed[node] = error
        return failed

    async def version(self, *, nodes: Iterable[int] | None = None) -> dict[str, str]:
        """Each node's version (or the ``nodes`` given by index), by node id."""
        return await self._broadcast(version_command(), ReplyKind.VERSION, False, nodes)

    async def stats(self, *args: str) -> dict[str, dict[str, str]]:
        """Each node's ``stats`` (or ``stats <args>``), by node id."""
        return await self._broadcast(stats_command(*args), ReplyKind.STATS, False)

    async def verbosity(self, level: int, *, noreply: bool = False) -> None:
        """Set the servers' logging verbosity."""
        await self._broadcast(verbosity_command(level, noreply=noreply), ReplyKind.OK, noreply)

    async def cache_memlimit(self, megabytes: int, *, noreply: bool = False) -> None:
        """Change the servers' memory limit."""
        data = cache_memlimit_command(megabytes, noreply=noreply)
        await self._broadcast(data, ReplyKind.OK, noreply)

    async def _broadcast(
        self, data: bytes, kind: ReplyKind, noreply: bool, only: Iterable[int] | None = None
    ) -> dict[str, Any]:
        """Each node's reply, by node id (nothing with noreply)."""
        nodes = self.cluster.live_nodes() if only is None else sorted(set(only))
        if noreply:
            for node in nodes:
                await self._send_noreply(node, data)
            return {}
        results = _raise_first_error(await self._pipelines({n: (data, [kind]) for n in nodes}))
        answers: dict[str, Any] = {}
        for node in nodes:
            reply = results[node][0]
            if isinstance(reply, CommandError):
                raise reply
            answers[self.cluster.node_ids[node]] = reply
        return answers


def _node_failure(replies: list[Any] | FastCacheError) -> FastCacheError | None:
    """A node's part of a pipelined call failed: its transport's error, or the first
    reply that is an error (the ``_by_node`` forms keep the other nodes' answers)."""
    if isinstance(replies, FastCacheError):
        return replies
    return next((reply for reply in replies if isinstance(reply, CommandError)), None)


def _raise_first_error(results: Replies) -> dict[int, list[Any]]:
    for replies in results.values():
        if isinstance(replies, FastCacheError):
            raise replies
    return results  # type: ignore[return-value]
