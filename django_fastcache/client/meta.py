"""memcached's meta commands as client methods, over the same I/O primitives as the rest.

:class:`MetaCommands` is a mixin: it uses only ``cluster``, ``_request`` and
``_pipelines``, which :class:`~django_fastcache.client.commands.CommandSet` declares and
both clients implement, so the asyncio Client and the BlockingClient get the same methods.

Every request ends with ``mn`` and is read as one ``ReplyKind.META`` reply: the meta
replies up to ``MN``. That is what lets :meth:`MetaCommands.meta_get_many` use quiet mode,
where a miss sends nothing and only ``MN`` tells that every key is answered.

The meta protocol needs memcached 1.6 or later (the syntax used here is stable since
1.6.10); :meth:`MetaCommands.speaks_meta` tells whether a node does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import (
    ClientError,
    CommandError,
    FastCacheError,
    InvalidArgumentError,
    InvalidKeyError,
    ProtocolError,
)
from ..protocol import (
    MetaReply,
    MetaResult,
    MetaStatus,
    MetaUnsupportedError,
    ReplyKind,
    meta_arithmetic_command,
    meta_delete_command,
    meta_get_command,
    meta_get_many_command,
    meta_noop_command,
    meta_set_command,
)
from ..protocol.counters import (
    RECOUNT_TRIES,
    Recount,
    give_back_command,
    recount_read_command,
    recount_store,
    recounted,
)

if TYPE_CHECKING:
    from .cluster import Cluster
    from .commands import Expected, Meanwhile, Replies, Requests

_META = ReplyKind.META
_NF = MetaStatus.NF
_VA = MetaStatus.VA
_NOOP = meta_noop_command()


class MetaCount(NamedTuple):
    """The outcome of :meth:`MetaCommands.meta_arithmetic`.

    ``status`` is HD when the counter changed (``value`` is then its new value), NF when
    the key does not exist (and no ``vivify``), NS when it could not be created, EX when
    ``cas`` did not match."""

    status: MetaStatus
    value: int | None
    cas: int | None
    ttl: int | None


class MetaCommands:
    """The meta commands. Keys and values are ``bytes``; with ``base64_key=True`` a key may
    be any bytes up to 186 long (it travels base64-encoded)."""

    if TYPE_CHECKING:
        # Provided by CommandSet's subclasses; declared here for the type checker only, so
        # the mixin's place among the bases never hides the real ones.
        cluster: Cluster

        async def _request(
            self,
            node: int,
            data: bytes,
            kind: ReplyKind,
            meanwhile: Meanwhile = None,
            keys: Sequence[bytes] | None = None,
        ) -> Any: ...

        async def _pipelines(
            self, requests: Requests, expected: Expected | None = None
        ) -> Replies: ...

    async def meta_get(
        self,
        key: bytes,
        *,
        value: bool = True,
        cas: bool = False,
        client_flags: bool = True,
        ttl: bool = False,
        touch: int | None = None,
        vivify: int | None = None,
        recache: int | None = None,
        hit: bool = False,
        last_access: bool = False,
        no_bump: bool = False,
        base64_key: bool = False,
    ) -> MetaReply | None:
        """``mg``: the item (``value``, ``client_flags`` and what else was asked), or None on
        a miss.

        ``vivify=<ttl>`` turns a miss into a lease: memcached creates an empty item and the
        one caller that created it gets ``reply.win``; the others get an empty value with
        ``reply.won_elsewhere`` until the winner stores the real one (``meta_set`` with
        ``cas=reply.cas``, so that a delete in between makes the store fail). ``recache``
        also hands out the win when the TTL left is below it; a stale item (see
        ``meta_delete(invalidate=True)``) comes with ``reply.stale`` and a win for one
        caller. ``touch`` sets a new TTL; ``hit`` and ``last_access`` report how the item
        was used before this request.
        """
        data = meta_get_command(
            key,
            value=value,
            cas=cas,
            client_flags=client_flags,
            ttl=ttl,
            hit=hit,
            last_access=last_access,
            no_bump=no_bump,
            touch=touch,
            vivify=vivify,
            recache=recache,
            base64_key=base64_key,
        )
        reply = await self._meta_one(key, data)
        return None if reply.status is MetaStatus.EN else reply

    async def meta_set(
        self,
        key: bytes,
        value: bytes,
        *,
        flags: int = 0,
        exptime: int | None = None,
        mode: str = "set",
        cas: int | None = None,
        invalidate: bool = False,
        vivify: int | None = None,
        return_cas: bool = False,
        base64_key: bool = False,
    ) -> MetaReply:
        """``ms``: store ``value``; ``reply.status`` is HD when stored.

        ``mode``: set, add, replace, append or prepend (NS when refused). ``cas``: store
        only if the item's CAS is still this one (EX when it changed, NF when the item is
        gone): a lease winner passes the CAS its ``meta_get`` returned. ``invalidate``
        with ``cas`` accepts an older CAS too, storing the item as stale. ``exptime`` None
        keeps the value without expiry. ``return_cas`` puts the new CAS in ``reply.cas``.
        A value over the server's item limit raises ValueTooLargeError.
        """
        data = meta_set_command(
            key,
            value,
            client_flags=flags,
            ttl=exptime,
            mode=mode,
            compare_cas=cas,
            invalidate=invalidate,
            vivify=vivify,
            return_cas=return_cas,
            base64_key=base64_key,
        )
        return await self._meta_one(key, data)

    async def meta_delete(
        self,
        key: bytes,
        *,
        cas: int | None = None,
        invalidate: bool = False,
        exptime: int | None = None,
        base64_key: bool = False,
    ) -> MetaReply:
        """``md``: remove ``key``; ``reply.status`` is HD when it existed, NF when not, EX
        when ``cas`` did not match.

        ``invalidate=True`` keeps the item but marks it stale and gives it a new CAS:
        readers get the old value with ``reply.stale``, one of them with ``reply.win``,
        and a store carrying the old CAS fails. ``exptime`` bounds how long the stale item
        lives (with ``invalidate`` only).
        """
        data = meta_delete_command(
            key, compare_cas=cas, invalidate=invalidate, ttl=exptime, base64_key=base64_key
        )
        return await self._meta_one(key, data)

    async def meta_arithmetic(
        self,
        key: bytes,
        delta: int = 1,
        *,
        decrement: bool = False,
        initial: int | None = None,
        vivify: int | None = None,
        exptime: int | None = None,
        cas: int | None = None,
        base64_key: bool = False,
    ) -> MetaCount:
        """``ma``: add ``delta`` to a decimal counter (subtract with ``decrement``; memcached
        stops at 0), atomically; the item keeps its TTL unless ``exptime`` is given.

        ``vivify=<ttl>`` creates a missing counter at ``initial`` (default 0), returned
        as is. ``cas`` counts only if the CAS matches. The result carries the new value,
        the new CAS and the TTL left.
        """
        if type(decrement) is not bool:
            raise InvalidArgumentError(f"decrement must be a bool, got {type(decrement).__name__}")
        data = meta_arithmetic_command(
            key,
            mode="decr" if decrement else "incr",
            delta=delta,
            initial=initial,
            vivify=vivify,
            ttl=exptime,
            compare_cas=cas,
            cas=True,
            return_ttl=True,
            base64_key=base64_key,
        )
        tries = RECOUNT_TRIES
        while True:
            try:
                reply = await self._meta_one(key, data)
                break
            except ClientError as refusal:
                # With a cas, a vivify or an exptime of the caller's own, memcached's
                # refusal stands.
                if cas is not None or vivify is not None or exptime is not None:
                    raise
                signed = -delta if decrement else delta
                recount = await self.recount(key, signed, refusal, None, base64_key)
                if recount.value is not None:
                    return MetaCount(MetaStatus.HD, recount.value, recount.cas, recount.ttl)
                tries -= 1  # the item changed meanwhile: counted again, a few times at most
                if not tries:
                    raise refusal from None
        number = None
        if reply.value is not None:
            if not reply.value.isdigit():
                raise ProtocolError(f"ma returned a value that is not a number: {reply.value!r}")
            number = int(reply.value)
        status = MetaStatus.HD if reply.status is MetaStatus.VA else reply.status
        return MetaCount(status, number, reply.cas, reply.ttl)

    async def recount(
        self,
        key: bytes,
        delta: int,
        refusal: ClientError,
        node: int | None = None,
        base64_key: bool = False,
    ) -> Recount:
        """The count by ``delta`` (negative: a decrement) of a counter memcached refused
        (``refusal``) by mistake, made here (see :mod:`~django_fastcache.protocol.counters`)
        on ``node`` (by default the key's): ``value`` None when the item changed or went
        meanwhile, nothing stored: the caller sends its count again. ``refusal`` is raised
        when it stands: the value is no such counter, or this client sends no meta
        command."""
        if not self.cluster.settings.meta:
            raise refusal
        if node is None:
            node = self.cluster.node_index(key)
        try:
            read = await self.meta_line(node, recount_read_command(key, base64_key))
        except MetaUnsupportedError:
            raise refusal from None
        if read.status is MetaStatus.EN:
            return Recount(None)  # deleted since: its count now finds it missing
        give_back = give_back_command(key, read, base64_key)
        if give_back is not None:  # a stale item's win, taken by the read: handed back
            with contextlib.suppress(CommandError):
                await self.meta_line(node, give_back)
        store = recount_store(key, read, delta, time.time(), base64_key)
        if store is None:
            raise refusal
        command, value, ttl = store
        return recounted(await self.meta_line(node, command), value, ttl)

    async def count_line_at(
        self, node: int, key: bytes, delta: int, line: bytes
    ) -> tuple[int, int | None] | None:
        """The disk tier's increment: ``line`` (the ``ma`` of ``key`` by ``delta`` that
        :func:`~django_fastcache.client.blocking.count_line` makes) sent to ``node``: ``(new
        value, seconds left or -1)``, or None when the key is missing. A counter memcached
        refuses by mistake is counted here (:meth:`recount`). The blocking client's
        ``count_at`` is its plain-call twin."""
        tries = RECOUNT_TRIES
        while True:
            try:
                return counted(await self.meta_line(node, line))
            except ClientError as refusal:
                recount = await self.recount(key, delta, refusal, node)
                if recount.value is not None:
                    return recount.value, recount.ttl
                tries -= 1  # the item changed meanwhile: counted again, a few times at most
                if not tries:
                    raise refusal from None

    async def meta_get_many(
        self, keys: Iterable[bytes], *, cas: bool = False, base64_key: bool = False
    ) -> dict[bytes, MetaReply]:
        """The items of the keys found, by key: per node one write of quiet ``mg`` lines
        (``mg <key> v f k q``) closed by ``mn``, the nodes asked at once. Misses cost no
        reply bytes at all."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        for key in unique:
            if type(key) is not bytes:  # before hashing; the encoder checks the rest
                raise InvalidKeyError(f"keys must be bytes, got {type(key).__name__}")
        groups = self.cluster.group(unique)
        # Every node's request is encoded (and every key checked) before any is sent.
        requests: Requests = {
            node: (meta_get_many_command(node_keys, cas=cas, base64_key=base64_key), [_META])
            for node, node_keys in groups.items()
        }
        # The reply parser checks each reply's key against these as it reads: a reply for
        # a key not asked (or twice) breaks the stream, and the connection is discarded
        # before anyone can read another request's answer from it.
        expected: Expected = {node: [node_keys] for node, node_keys in groups.items()}
        found: dict[bytes, MetaReply] = {}
        for replies in (await self._meta_pipelines(requests, expected)).values():
            for reply in replies:
                assert reply.key is not None  # checked by the parser
                if reply.status is not MetaStatus.EN:  # EN comes only with a key in b mode
                    found[reply.key] = reply
        return found

    async def meta_noop(self, *, nodes: Iterable[int] | None = None) -> None:
        """``mn`` to every node (or the ``nodes`` given by index): returns once each has
        answered everything sent before it on the connection used."""
        await self._meta_pipelines({node: (_NOOP, [_META]) for node in self._nodes(nodes)})

    async def speaks_meta(self, *, nodes: Iterable[int] | None = None) -> dict[str, bool]:
        """Whether each node (or the ``nodes`` given by index) speaks the meta protocol, by
        node id: ``mn`` is answered ``MN`` by memcached 1.6+ and ``ERROR`` by older servers
        (whose connection is then dropped). Other failures are raised. A client that
        sends no meta command (``ClientSettings.meta`` False) answers False unasked."""
        chosen = self._nodes(nodes)
        if not self.cluster.settings.meta:
            return dict.fromkeys((self.cluster.node_ids[node] for node in chosen), False)
        results = await self._pipelines({node: (_NOOP, [_META]) for node in chosen})
        answers: dict[str, bool] = {}
        for node in chosen:
            outcome = results[node]
            if isinstance(outcome, MetaUnsupportedError):
                answers[self.cluster.node_ids[node]] = False
            elif isinstance(outcome, FastCacheError):
                raise outcome
            else:
                answers[self.cluster.node_ids[node]] = True
        return answers

    # -- shared steps --------------------------------------------------------------------
    async def meta_line(self, node: int, data: bytes) -> MetaReply:
        """The reply to one meta command sent to ``node``, ``data`` its whole line, of a
        valid key and with flags that draw exactly one reply: for a caller that builds its
        few commands at once (the disk tier), sparing the general encoders' checks. An
        error reply is raised (``ERROR``: :class:`MetaUnsupportedError`). The blocking
        client's ``meta_at`` is its plain-call twin."""
        if not self.cluster.settings.meta:
            raise meta_unsent()
        return only_reply(await self._request(node, data + _NOOP, _META))

    async def _meta_one(self, key: bytes, data: bytes) -> MetaReply:
        """The one reply to a single meta command; an error reply is raised."""
        if not self.cluster.settings.meta:
            raise meta_unsent()
        replies = await self._request(self.cluster.node_index(key), data + _NOOP, _META)
        return only_reply(replies)

    async def _meta_pipelines(
        self, requests: Requests, expected: Expected | None = None
    ) -> dict[int, list[MetaReply]]:
        """Each node's meta replies; the first failed node's error, or error reply, raised."""
        if not self.cluster.settings.meta:
            raise meta_unsent()
        results = await self._pipelines(requests, expected)
        replies: dict[int, list[MetaReply]] = {}
        for node, outcome in results.items():
            if isinstance(outcome, FastCacheError):
                raise outcome
            [batch] = outcome
            replies[node] = [_checked(reply) for reply in batch]
        return replies

    def _nodes(self, nodes: Iterable[int] | None) -> list[int]:
        return list(self.cluster.live_nodes()) if nodes is None else sorted(set(nodes))


def counted(reply: MetaReply) -> tuple[int, int | None] | None:
    """What the reply to the disk tier's ``ma`` (``v c t``: see
    :func:`~django_fastcache.client.blocking.count_line`) says: ``(new value, seconds left
    or -1)``, or None when the key is missing (NF). Any other reply is a
    :class:`ProtocolError` (the node's fault)."""
    if reply.status is _NF:
        return None
    value = reply.value
    if reply.status is not _VA or value is None or not value.isdigit():
        raise ProtocolError(f"ma returned {reply.status.name} without a number: {value!r}")
    return int(value), reply.ttl


def meta_unsent() -> MetaUnsupportedError:
    """The error of a meta command a client that sends none was asked to send."""
    return MetaUnsupportedError(
        "this client sends no meta command (ClientSettings.meta is False: the backend's"
        " OPTIONS['protocol'] is 'classic'); the command was not sent"
    )


def only_reply(replies: list[MetaResult]) -> MetaReply:
    if len(replies) != 1:
        raise ProtocolError(f"one meta command drew {len(replies)} replies before MN")
    return _checked(replies[0])


def _checked(reply: MetaResult) -> MetaReply:
    if isinstance(reply, CommandError):
        raise reply
    return reply


__all__ = ["MetaCommands", "MetaCount", "only_reply"]
