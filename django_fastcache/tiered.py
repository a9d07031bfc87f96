"""memcached with the disk tier behind it: what each operation does to both, and when.

The rules, which ``docs/disk-tier.md`` explains for users:

* **Writes go to both tiers before they are acknowledged** (write-through), memcached first.
  So on this host the disk tier always holds the latest acknowledged value of every key it
  holds, and answering a memcached miss from it returns nothing older.
* **Deletes, incr/decr and refills hold the key's disk shard lock** (a SQLite write lock every
  process on the host shares) around their memcached round trip, so a refill can never put
  back a value that a delete (or incr) removed or changed in the meantime. Refilling uses
  ``add``: it never overwrites a newer value.
* **A node that fails is marked out for the whole host** (:class:`~.disk.NodeStates`). Its
  keys go straight to the disk tier, with no network wait; writes and deletes made then are
  journaled (:class:`~.disk.Journal`). A background probe (:mod:`.maintenance`) replays the
  journal as deletes on the node before marking it up again, under the journal's lock, so no
  process reads a pre-outage value from it.
* **A disk tier that fails never fails a request**: the memcached result stands, the key's
  disk entry stops answering, host-wide (:meth:`~.disk.NodeStates.distrust`: a stamp in
  shared memory, which cannot fail when the disk does), and the failure is counted. A write
  made while the key's node is out stays journaled even when its disk write fails.

Synchronous pieces (the disk, and memcached round trips made under a disk lock) run on the
blocking client even on the async path: a SQLite transaction belongs to its thread and must
not stay open across an ``await``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from .bridge import run_blocking
from .client.blocking import BlockingClient
from .client.cluster import Cluster
from .client.commands import CommandSet
from .client.failures import refusal_error
from .disk import DiskEntry, DiskError, DiskStore, Journal, NodeStates
from .errors import (
    CommandError,
    FastCacheError,
    LocalResourceError,
    NetworkError,
    NonIntegerValueError,
    ProtocolError,
)
from .expiry import memcached_exptime
from .logs import RateLimit, logger
from .serializers import FLAG_INTEGER

T = TypeVar("T")
R = TypeVar("R")

#: Journaled in place of a key: "flush the whole node" (a clear() made while it was out).
FLUSH_MARK = b""
_MAX_RETRIES = 3
#: What marks a node out: it could not be reached, or it answered with bytes that do not
#: parse (its connection is discarded; whether a write took effect is unknown either way).
#: A LocalResourceError (this process out of descriptors) is not one: see _memcached_failed.
NODE_FAILURES = (NetworkError, ProtocolError)


class _WentOut(Exception):
    """The key's node was marked out while the operation waited for the disk lock."""


@dataclass
class TierMetrics:
    """Counters of this process (the journal length is host-wide, read on demand)."""

    #: Reads answered by the disk tier because the key's node was out.
    fallbacks: int = 0
    #: memcached misses answered by the disk tier.
    disk_hits: int = 0
    #: Values put back into memcached from the disk tier (``add``).
    refills: int = 0
    #: Operations on the disk tier that failed (and were let go).
    disk_failures: int = 0
    #: Writes and deletes journaled while a node was out.
    journaled: int = 0
    #: Nodes brought back after replaying their journal, and keys replayed.
    replays: int = 0
    replayed_keys: int = 0
    #: Nodes this process marked out.
    nodes_marked_out: int = 0
    #: Calls this process could not send for want of its own resources (descriptors):
    #: reads were answered by the disk tier, no node was marked out.
    local_failures: int = 0
    by_node: dict[str, dict[str, int]] = field(default_factory=dict)


class TieredStore:
    """The two tiers for one cache configuration; shared by every thread of the process."""

    def __init__(
        self,
        cluster: Cluster,
        blocking: BlockingClient,
        disk: DiskStore,
        journal: Journal,
        states: NodeStates,
        *,
        max_staleness: float,
        on_node_out: Callable[[str], None] | None = None,
        directory: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.blocking = blocking
        self.disk = disk
        self.journal = journal
        self.states = states
        self.max_staleness = max_staleness
        #: The disk tier's directory as configured (``disk_directory``), which holds the
        #: values, the journal and the node states; what the signals and stats report.
        self.directory = disk.directory if directory is None else directory
        # A shard lock is held across one memcached round trip at a time (deletes, incr,
        # refills); a write waiting for it gives up only well after that round trip would
        # have timed out (failing would leave the key's disk entry out of date).
        disk.lock_wait = 2 * cluster.settings.timeout
        #: Seconds between a node answering a probe again and its journal's replay.
        self.replay_settle = 2 * cluster.settings.timeout
        self.metrics = TierMetrics()
        self._on_node_out = on_node_out
        #: Per node: why the latest probe failed (for the repeated "still out" warning).
        self.last_probe_error: dict[int, str] = {}
        self._warnings = RateLimit()

    # -- health --------------------------------------------------------------------------
    def node_failed(self, node: int, cause: BaseException | None = None) -> None:
        if self.states.mark_out(node):
            self.metrics.nodes_marked_out += 1
            logger.warning(
                "memcached node %s is out (%s): its keys are served by the disk tier at %s "
                "until a background probe brings it back",
                self.cluster.node_ids[node],
                _describe(cause),
                self.directory,
            )
            if self._on_node_out is not None:
                self._on_node_out(self.cluster.node_ids[node])

    def _memcached_failed(self, node: int, exc: FastCacheError, *, read: bool) -> None:
        """memcached failed its part of an operation on ``node``: mark the node out when the
        failure is the node's, and raise ``exc`` again when it is not.

        Host-wide node state changes only on evidence about the node. A process out of
        descriptors (:class:`LocalResourceError`) leaves the node alone: a read is answered
        by the disk tier; a write is refused (journaling it would need the node out)."""
        if isinstance(exc, LocalResourceError):
            self.metrics.local_failures += 1
            if self._warnings.allow(("local", node)):
                logger.warning(
                    "could not reach memcached node %s from this process: %s; %s",
                    self.cluster.node_ids[node],
                    exc,
                    "reads are answered by the disk tier, writes fail"
                    " (the node stays up for other processes)",
                )
            if read:
                return
            raise exc
        if isinstance(exc, NODE_FAILURES):
            self.node_failed(node, exc)
            return
        if isinstance(exc, CommandError):
            refused = refusal_error(exc, self.cluster.node_ids[node])
            if refused is not None:  # memcached's connection limit, seen as a reply
                self.node_failed(node, refused)
                return
        raise exc

    def _disk_failed(self, key: bytes | None = None, error: BaseException | None = None) -> None:
        self.metrics.disk_failures += 1
        self._log_disk_failure(error)
        if key is not None:
            # The entry may now be older than memcached's value: it must not answer a miss,
            # in any process. (Deleting it would need the disk that just failed.)
            self.states.distrust(key, time.time())

    def _fresh(self, key: bytes, entry: DiskEntry | None, now: float) -> DiskEntry | None:
        if (
            entry is None
            or now - entry.written_at > self.max_staleness
            or not self.states.trusts(key, entry.written_at)
        ):
            return None
        return entry

    def _disk_read(self, key: bytes) -> tuple[bytes, int] | None:
        try:
            entry = self._fresh(key, self.disk.get(key), time.time())
        except DiskError as exc:
            self._disk_failed(None, exc)
            return None
        return None if entry is None else (entry.data, entry.flags)

    def _journaled(
        self, node: int, keys: list[bytes], disk_write: Callable[[], T]
    ) -> tuple[bool, T | None]:
        """Run ``disk_write`` while ``node`` is out, journaling ``keys`` for its replay.

        Returns ``(True, result)``, or ``(False, None)`` when the node came back meanwhile
        (the caller then goes to memcached again). Raises :class:`DiskError` when the disk
        write failed: the keys are journaled all the same (the node may hold values the
        write was to replace) and their disk entries no longer answer."""
        failure: DiskError | None = None
        try:
            with self.journal.transaction() as connection:
                if not self.states.is_out(node):
                    return False, None
                Journal.record(connection, self.cluster.node_ids[node], keys)
                try:
                    result = disk_write()
                except DiskError as exc:
                    failure = exc
        except DiskError as exc:
            # Not even journaled: the write is lost, and the disk entries it was to replace
            # must not answer.
            self._distrust(keys, exc)
            raise
        self.metrics.journaled += len(keys)
        if failure is not None:
            self._distrust(keys, failure)
            raise failure
        return True, result

    def _log_disk_failure(self, error: BaseException | None) -> None:
        if self._warnings.allow("disk"):
            logger.warning(
                "the disk tier at %s failed: %s; memcached's answers stand, the entries "
                "involved no longer answer (further failures are counted in tier_stats(), "
                "logged at most once a minute)",
                self.directory,
                _describe(error),
            )

    def _distrust(self, keys: list[bytes], error: BaseException | None = None) -> None:
        self.metrics.disk_failures += 1
        self._log_disk_failure(error)
        now = time.time()
        for key in keys:
            self.states.distrust(key, now)

    # -- reads ---------------------------------------------------------------------------
    async def get(self, client: CommandSet, key: bytes) -> tuple[bytes, int] | None:
        node = self.cluster.node_index(key)
        if not self.states.is_out(node):
            try:
                item = await client.get(key)
            except FastCacheError as exc:
                self._memcached_failed(node, exc, read=True)
            else:
                if item is not None:
                    return item.value, item.flags
                return self._answer_miss(key, node)
        self.metrics.fallbacks += 1
        return self._disk_read(key)

    def _answer_miss(self, key: bytes, node: int) -> tuple[bytes, int] | None:
        """memcached had nothing: the disk tier's entry, put back into memcached."""
        try:
            if self._fresh(key, self.disk.get(key), time.time()) is None:
                return None  # the common miss: no lock taken
            with self.disk.locked(key):
                now = time.time()
                entry = self._fresh(key, self.disk.get(key), now)
                if entry is None:
                    return None
                remaining = entry.remaining_seconds(now)
                if remaining is not None and remaining <= 0:
                    return None
                if not self.states.is_out(node):
                    exptime = memcached_exptime(remaining, now)
                    try:
                        added = run_blocking(
                            self.blocking.add(key, entry.data, flags=entry.flags, exptime=exptime)
                        )
                    except FastCacheError as exc:
                        self._memcached_failed(node, exc, read=True)
                    else:
                        self.metrics.refills += added
        except DiskError as exc:
            self._disk_failed(None, exc)
            return None
        self.metrics.disk_hits += 1
        return entry.data, entry.flags

    async def get_many(
        self, client: CommandSet, keys: list[bytes]
    ) -> dict[bytes, tuple[bytes, int]]:
        # Each key's node state is read once: a node marked up while this runs must not
        # leave its keys asked of neither tier.
        up: list[bytes] = []
        out: list[bytes] = []
        for key in keys:
            (out if self.states.is_out(self.cluster.node_index(key)) else up).append(key)
        found: dict[bytes, tuple[bytes, int]] = {}
        if up:
            try:
                items = await client.get_many(up)
            except FastCacheError as exc:
                if not isinstance(exc, NODE_FAILURES) and refusal_error(exc, "") is None:
                    raise
                # Some node failed: settle each key on its own (marking nodes out as needed).
                for key in keys:
                    value = await self.get(client, key)
                    if value is not None:
                        found[key] = value
                return found
            for key in up:
                item = items.get(key)
                if item is not None:
                    found[key] = (item.value, item.flags)
                else:
                    value = self._answer_miss(key, self.cluster.node_index(key))
                    if value is not None:
                        found[key] = value
        for key in out:
            self.metrics.fallbacks += 1
            value = self._disk_read(key)
            if value is not None:
                found[key] = value
        return found

    # -- writes --------------------------------------------------------------------------
    def _on_either_tier(
        self, key: bytes, both: Callable[[int], R], disk_only: Callable[[], R], failed: R
    ) -> R:
        """``both(node)`` while ``key``'s node is up; ``disk_only()``, journaled, while it
        is out. A node failing on the way is marked out and the operation journaled; one
        that came back meanwhile is tried again. ``failed`` when neither tier took it."""
        node = self.cluster.node_index(key)
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                try:
                    return both(node)
                except _WentOut:
                    pass  # marked out while it waited for the disk lock: journal it
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
            try:
                done, result = self._journaled(node, [key], disk_only)
            except DiskError:
                return failed
            if done:
                return cast(R, result)
        return failed

    async def set(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool:
        def on_disk() -> bool:
            self.disk.set(key, data, flags, ttl)
            return True

        return self._on_either_tier(
            key, lambda node: self._set_both(node, key, data, flags, ttl), on_disk, False
        )

    def _set_both(self, node: int, key: bytes, data: bytes, flags: int, ttl: float | None) -> bool:
        """memcached and the disk under the key's shard lock, the disk write overlapping
        memcached's round trip.

        The lock keeps a delete, incr or refill from running between the two writes (which
        could leave memcached holding a value the disk tier does not, lost in the next
        outage). If memcached fails or refuses, the disk write is rolled back with the lock.
        """
        exptime = memcached_exptime(ttl, time.time())
        try:
            with self.disk.locked(key):
                if self.states.is_out(node):
                    raise _WentOut  # while this waited for the lock: journal it
                return run_blocking(
                    self.blocking.set(
                        key,
                        data,
                        flags=flags,
                        exptime=exptime,
                        meanwhile=lambda: self._write_disk(key, data, flags, ttl),
                    )
                )
        except DiskError as exc:
            # No lock, or no commit: the disk entry must not answer; memcached still gets it.
            self._disk_failed(key, exc)
            return run_blocking(self.blocking.set(key, data, flags=flags, exptime=exptime))

    def _write_disk(self, key: bytes, data: bytes, flags: int, ttl: float | None) -> None:
        try:
            self.disk.set(key, data, flags, ttl)
        except DiskError as exc:
            self._disk_failed(key, exc)

    async def add(
        self, client: CommandSet, key: bytes, data: bytes, flags: int, ttl: float | None
    ) -> bool:
        return self._on_either_tier(
            key,
            lambda node: self._add_both(node, key, data, flags, ttl),
            lambda: self.disk.add(key, data, flags, ttl),
            False,
        )

    def _add_both(self, node: int, key: bytes, data: bytes, flags: int, ttl: float | None) -> bool:
        """``add`` on memcached and, when it stored, the disk, under the key's shard lock."""
        exptime = memcached_exptime(ttl, time.time())
        try:
            with self.disk.locked(key):
                if self.states.is_out(node):
                    raise _WentOut
                added = run_blocking(self.blocking.add(key, data, flags=flags, exptime=exptime))
                if added:
                    self._write_disk(key, data, flags, ttl)
                return added
        except DiskError as exc:
            self._disk_failed(key, exc)
            return run_blocking(self.blocking.add(key, data, flags=flags, exptime=exptime))

    async def set_many(
        self,
        client: CommandSet,
        triples: list[tuple[bytes, bytes, int]],
        ttl: float | None,
    ) -> list[bytes]:
        up = [t for t in triples if not self.states.is_out(self.cluster.node_index(t[0]))]
        failed: frozenset[bytes] = frozenset()
        if up:
            try:
                failed = self._set_many_both(up, ttl)
            except (_WentOut, DiskError):
                failed = frozenset(key for key, _data, _flags in up)  # settled one by one below
        refused: list[bytes] = []
        for key, data, flags in triples:
            # Refused, or its node is (or just went) out: settle it on its own.
            settle = key in failed or self.states.is_out(self.cluster.node_index(key))
            if not settle:
                continue
            try:
                stored = await self.set(client, key, data, flags, ttl)
            except CommandError:
                # memcached refused it again (too large, out of memory): it failed, as
                # set_many reports a failure (the caller removes the key from both tiers).
                stored = False
            if not stored:
                refused.append(key)
        return refused

    def _set_many_both(
        self, triples: list[tuple[bytes, bytes, int]], ttl: float | None
    ) -> frozenset[bytes]:
        """Pipelined sets under the lock of every shard involved (taken in shard order, so
        that two writers never wait on each other), then the disk writes."""
        by_shard: dict[int, bytes] = {}
        for key, _data, _flags in triples:
            by_shard.setdefault(self.disk.shard_of(key), key)
        with contextlib.ExitStack() as locks:
            for shard in sorted(by_shard):
                locks.enter_context(self.disk.locked(by_shard[shard]))
            if any(self.states.is_out(self.cluster.node_index(k)) for k, _d, _f in triples):
                raise _WentOut
            exptime = memcached_exptime(ttl, time.time())
            failed = frozenset(run_blocking(self.blocking.set_many(triples, exptime=exptime)))
            for key, data, flags in triples:
                if key not in failed:
                    self._write_disk(key, data, flags, ttl)
        return failed

    async def touch(self, client: CommandSet, key: bytes, ttl: float | None) -> bool:
        node = self.cluster.node_index(key)
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                try:
                    touched = await client.touch(key, memcached_exptime(ttl, time.time()))
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                else:
                    try:
                        self.disk.touch(key, ttl)
                    except DiskError as exc:
                        self._disk_failed(key, exc)
                    return touched
            try:
                done, touched_on_disk = self._journaled(
                    node, [key], lambda: self.disk.touch(key, ttl)
                )
            except DiskError:
                return False
            if done:
                return bool(touched_on_disk)
        return False

    async def delete(self, client: CommandSet, key: bytes) -> bool:
        return self._delete(key)

    def _delete(self, key: bytes) -> bool:
        return self._on_either_tier(
            key, lambda node: self._delete_both(node, key), lambda: self.disk.delete(key), False
        )

    def _delete_both(self, node: int, key: bytes) -> bool:
        """Both tiers under the key's shard lock, so a refill cannot put the value back."""
        try:
            with self.disk.locked(key):
                if self.states.is_out(node):
                    raise _WentOut
                self.disk.delete(key)
                return run_blocking(self.blocking.delete(key))
        except DiskError as exc:
            self._disk_failed(key, exc)
            return run_blocking(self.blocking.delete(key))

    async def delete_many(self, client: CommandSet, keys: Iterable[bytes]) -> None:
        for key in dict.fromkeys(keys):
            self._delete(key)

    async def incr(self, client: CommandSet, key: bytes, delta: int) -> int | None:
        """Add ``delta`` (negative: subtract, stopping at 0); None when ``key`` is missing."""
        return self._on_either_tier(
            key,
            lambda node: self._incr_both(node, key, delta),
            lambda: self._incr_disk(key, delta),
            None,
        )

    def _incr_both(self, node: int, key: bytes, delta: int) -> int | None:
        def on_memcached() -> int | None:
            if delta < 0:
                return run_blocking(self.blocking.decr(key, -delta))
            return run_blocking(self.blocking.incr(key, delta))

        try:
            with self.disk.locked(key):
                if self.states.is_out(node):
                    raise _WentOut  # while this waited for the lock: journal it
                value = on_memcached()
                now = time.time()
                entry = self.disk.get(key)
                fresh = self._fresh(key, entry, now)
                if value is None and fresh is not None:
                    # memcached lost the key (restarted empty, or the journal replay deleted
                    # it) but the disk tier holds its latest value: put it back, count on it.
                    exptime = memcached_exptime(fresh.remaining_seconds(now), now)
                    self.metrics.refills += run_blocking(
                        self.blocking.add(key, fresh.data, flags=fresh.flags, exptime=exptime)
                    )
                    value = on_memcached()
                if entry is not None:
                    if value is None:
                        self.disk.delete(key)
                    else:
                        self.disk.set(key, b"%d" % value, entry.flags, entry.remaining_seconds(now))
                return value
        except DiskError as exc:
            self._disk_failed(key, exc)
            return on_memcached()

    def _incr_disk(self, key: bytes, delta: int) -> int | None:
        now = time.time()
        entry = self._fresh(key, self.disk.get(key), now)
        if entry is None:
            return None
        if entry.flags != FLAG_INTEGER:
            raise NonIntegerValueError(f"the value of {key.decode()!r} is not an integer")
        current = int(entry.data)
        # memcached's rules: decr stops at 0, incr wraps at 2**64.
        value = max(0, current + delta) if delta < 0 else (current + delta) % 2**64
        self.disk.set(key, b"%d" % value, entry.flags, entry.remaining_seconds(now))
        return value

    async def clear(self, client: CommandSet) -> None:
        out = [n for n in range(len(self.cluster)) if self.states.is_out(n)]
        up = [n for n in range(len(self.cluster)) if n not in out]
        if up:
            try:
                await client.flush_all(nodes=up)
            except FastCacheError:
                # Flush each node on its own to learn which ones failed.
                for node in up:
                    try:
                        await client.flush_all(nodes=[node])
                    except FastCacheError as exc:
                        self._memcached_failed(node, exc, read=False)
                        out.append(node)
        for node in out:
            with contextlib.suppress(DiskError):
                self._journaled(node, [FLUSH_MARK], lambda: None)
        try:
            self.disk.clear()
        except DiskError as exc:
            self._disk_failed(None, exc)
            self.states.distrust(None, time.time())  # every entry is now out of date

    # -- bringing a node back ------------------------------------------------------------
    def bring_back(self, node: int) -> int | None:
        """Replay ``node``'s journal as deletes and mark it up; the keys replayed, or None
        when the node is still unreachable. Called by the maintenance thread, never on a
        request."""
        node_id = self.cluster.node_ids[node]
        try:
            run_blocking(self.blocking.version(nodes=[node]))
            # Requests that timed out while the node hung may still sit in its sockets and
            # run now that it answers again, on other memcached threads, in any order with
            # ours: let them land first, so that the replay's deletes come after them.
            # (Connections that failed were reset, so nothing of theirs is still unsent.)
            time.sleep(self.replay_settle)
            with self.journal.transaction() as connection:
                if not self.states.is_out(node):
                    return 0
                keys = Journal.keys(connection, node_id)
                if FLUSH_MARK in keys:
                    run_blocking(self.blocking.flush_all(nodes=[node]))
                elif keys:
                    run_blocking(self.blocking.delete_many(keys))
                Journal.forget(connection, node_id)
                self.states.mark_up(node)
        except DiskError as journal_error:
            # The journal cannot be read (its directory removed, its file corrupt, locked
            # for good): any key may have changed while the node was out, so the node is
            # flushed whole instead. (A write the journal could not take was not kept on
            # disk either: its entry no longer answers.) Otherwise the node stays out for
            # good, and memcached is never used again.
            try:
                run_blocking(self.blocking.flush_all(nodes=[node]))
            except FastCacheError as exc:
                self.last_probe_error[node] = _describe(exc)
                return None
            self.states.mark_up(node)
            keys = []
            logger.warning(
                "memcached node %s is back; its outage journal could not be read (%s), so "
                "the node was flushed whole instead of replaying it",
                node_id,
                _describe(journal_error),
            )
        except FastCacheError as exc:
            # Unreachable, or anything else that stopped the replay (a refused command, a
            # reply that does not parse): the node stays out, its journal intact.
            self.last_probe_error[node] = _describe(exc)
            return None
        else:
            logger.warning(
                "memcached node %s is back: %s",
                node_id,
                f"replayed {len(keys)} journaled key(s) as deletes"
                if FLUSH_MARK not in keys
                else "flushed it, as a clear() was journaled while it was out",
            )
        self.last_probe_error.pop(node, None)
        self.metrics.replays += 1
        self.metrics.replayed_keys += len(keys)
        return len(keys)

    def close(self) -> None:
        """Close the disk tier's SQLite connections (they reopen on the next use)."""
        self.disk.close()
        self.journal.close()

    def snapshot(self) -> dict[str, Any]:
        """Breaker state, counters and journal lengths, for the backend's ``tier_stats()``."""
        nodes: dict[str, Any] = {}
        for node, node_id in enumerate(self.cluster.node_ids):
            try:
                journal_length: int | None = self.journal.length(node_id)
            except DiskError:
                journal_length = None
            nodes[node_id] = {
                "state": "out" if self.states.is_out(node) else "up",
                "journal_length": journal_length,
            }
        metrics = self.metrics
        return {
            "directory": self.directory,
            "nodes": nodes,
            "fallbacks": metrics.fallbacks,
            "disk_hits": metrics.disk_hits,
            "refills": metrics.refills,
            "disk_failures": metrics.disk_failures,
            "journaled": metrics.journaled,
            "replays": metrics.replays,
            "replayed_keys": metrics.replayed_keys,
            "nodes_marked_out": metrics.nodes_marked_out,
            "local_failures": metrics.local_failures,
        }


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "no detail"
    return f"{type(error).__name__}: {error}"
