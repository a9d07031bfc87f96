"""memcached with the disk tier behind it: what each operation does to both, and when.

The rules, which ``docs/disk-tier.md`` explains for users:

* **While a key's node is up, the request path does no disk work and takes no lock.** A
  write or delete first *stamps* its key (:class:`~.disk.WriteStamps`: a new random stamp
  in the key's slot of a table every process on the host shares), then goes to memcached,
  then queues its disk copy for the writer behind (:class:`~.disk.WriteBehind`), which
  lands it in group commits. A disk entry answers only while its stamp is its slot's
  current one, so an entry older than an acknowledged write or delete never answers, in
  any process, however far the disk lags: lag shows as misses, never as old values.
* **A memcached miss is answered from disk and refilled under a lease**: ``mg … N`` hands
  this caller the key's stub, the stamp is checked again, and ``ms … C<cas>`` stores the
  value only if nothing replaced or deleted the stub meanwhile. A write or delete stamps
  before it reaches memcached, so whichever lands first, the refill cannot put back a value
  older than it. A stub in memcached (a refill or a ``get_or_set`` under way) reads as a
  miss.
* **add, touch, delete and incr agree with get**: where memcached has nothing, what get
  would answer from disk counts (add refuses, touch and delete find it, incr counts on it).
* **A node that fails is marked out for the whole host** (:class:`~.disk.NodeStates`). Its
  keys go straight to the disk tier, with no network wait; writes and deletes made then are
  journaled (:class:`~.disk.Journal`) and stamped under the journal's lock, and written to
  disk at once after it (add, incr and touch, which read the entry they replace, under
  it). A background probe (:mod:`.maintenance`) replays the journal as deletes on the node
  before marking it up again, so no process reads a pre-outage value from it.
  Writes still queued behind when a node goes out are stamped already: their keys miss
  until they land, and a journaled write overtakes them.
* **memcached's answer to a request is not served when the node went out while it ran**
  (:meth:`TieredStore.went_out`): the disk tier answers. An ``incr`` (or an ``add``)
  memcached may have made when its node failed is made on disk only where the disk makes
  it alike; otherwise :class:`~.errors.OutcomeUnknownError`.
* **A disk tier that fails never fails a request**: the memcached result stands, and the
  entries involved stop answering (their stamps moved on before the disk was touched).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from .bridge import run_blocking
from .client.blocking import BlockingClient, count_line
from .client.cluster import Cluster
from .client.commands import CommandSet
from .client.failures import refusal_error
from .client.meta import counted
from .disk import DiskEntry, DiskError, DiskStore, Journal, NodeStates
from .disk.nodestate import CHECK_INTERVAL
from .disk.readcopies import LIMIT as READ_COPIES
from .disk.readcopies import ReadCopies
from .disk.stamps import WriteStamps, holds_value, slot_of
from .disk.store import Fields
from .disk.writebehind import INTERVAL, MIN_AGE, WriteBehind
from .errors import (
    ClientError,
    CommandError,
    ConnectFailedError,
    FastCacheError,
    LocalResourceError,
    NetworkError,
    NonIntegerValueError,
    OutcomeUnknownError,
    ProtocolError,
    ReplyTooLargeError,
    ServerRefusedConnectionError,
    TLSError,
)
from .expiry import memcached_exptime
from .handles import Handle
from .logs import RateLimit, logger
from .protocol import MetaReply, MetaStatus, MetaUnsupportedError
from .protocol.counters import RECOUNT_TRIES, Recount, counted_by_memcacheds_rules
from .serializers import FLAG_INTEGER
from .stampede import let_go

T = TypeVar("T")
R = TypeVar("R")

#: Journaled in place of a key: "flush the whole node" (a clear() made while it was out).
FLUSH_MARK: Final = b""
_MAX_RETRIES: Final = 3
#: What marks a node out: it could not be reached, or it answered with bytes that do not
#: parse (its connection is discarded; whether a write took effect is unknown either way).
#: A LocalResourceError (this process out of descriptors, or its pool busy) is not one: see
#: _memcached_failed.
NODE_FAILURES: Final = (NetworkError, ProtocolError)
#: Tries of an incr that finds a refill's stub (the value is on its way back from disk).
_STUB_TRIES: Final = 20
_STUB_PAUSE: Final = 0.001
#: The largest delta memcached counts by (an unsigned 64-bit number).
_UINT64_MAX: Final = 2**64 - 1
#: ``time.time`` and ``time.monotonic``, bound once: compiled, a module's attribute is
#: looked up per call.
_now: Final = time.time
_monotonic: Final = time.monotonic
#: Seconds between two checks that the tier's files are still the directory's, made by the
#: calls themselves (see :meth:`TieredStore._follow_files`).
FILES_CHECK_INTERVAL: Final = 0.1


def _is_stub(data: bytes, flags: int) -> bool:
    """A lease's stub: memcached's empty vivified item (flags 0), which FastCache never
    writes as a value. (``len(data)``, not ``not data``: compiled, the length is read from
    the object, where a truth test goes through the interpreter's generic protocol, code a
    tiered get otherwise never reaches.)"""
    return len(data) == 0 and flags == 0


def _seconds_left(ttl: int | None) -> float | None:
    """A count's TTL as memcached reports it (-1: none) as the disk copy keeps it."""
    return None if ttl is None or ttl < 0 else float(ttl)


async def _recount(
    client: CommandSet, node: int, key: bytes, delta: int, refusal: CommandError
) -> Recount | None:
    """The increment memcached refused (``refusal``), counted by the client where memcached
    misread a counter of 2**63 or more (:meth:`~MetaCommands.recount`); None where the
    refusal stands."""
    if not isinstance(refusal, ClientError):
        return None
    try:
        return await client.recount(key, delta, refusal, node)
    except ClientError:
        return None


def _is_value(found: tuple[bytes, int] | None) -> bool:
    """Whether a blocking get's ``(value, flags)`` is a value: neither a miss nor a stub.
    (A call of its own: tested in place, ``found`` would be unpacked, compiled, and a new
    tuple built to return it.)"""
    return found is not None and not _is_stub(found[0], found[1])


@dataclass
class TierMetrics:
    """Counters of this process (the journal length is host-wide, read on demand)."""

    #: Reads answered by the disk tier because the key's node was out.
    fallbacks: int = 0
    #: memcached misses answered by the disk tier.
    disk_hits: int = 0
    #: Values put back into memcached from the disk tier (under a lease).
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
    #: Lease winners' stores (get_or_set's ``ms … C<cas>``) memcached took: the consistency
    #: checker tells from it whether a computed value was written.
    leased_stores: int = 0


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
        on_node_back: Callable[[str, int], None] | None = None,
        directory: str | None = None,
        stamps: WriteStamps | None = None,
        write_interval: float = INTERVAL,
        write_delay: float = MIN_AGE,
        read_copies: int = READ_COPIES,
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
        #: The host-wide write stamps, beside the node states.
        self.stamps = (
            stamps
            if stamps is not None
            else WriteStamps(os.path.join(self.directory, "stamps.anchor"))
        )
        # A shard lock is held by the writer behind for one group commit, and by an outage
        # write for one entry; a write waiting for it gives up only well after that.
        disk.lock_wait = 2 * cluster.settings.timeout
        #: Copies of the disk entries this process read, at most ``read_copies`` bytes;
        #: none under an eviction policy that counts reads (a copy's reads go uncounted).
        self.copies = ReadCopies(0 if disk.records_reads else read_copies)
        #: ``time.monotonic()`` until which the copies may answer without a check of the
        #: write stamps anchor (see :meth:`_copies_hold`).
        self._copies_checked_until = -math.inf
        #: The writer behind memcached: disk copies of writes made while nodes are up.
        self.behind = WriteBehind(
            disk,
            self.stamps,
            interval=write_interval,
            min_age=write_delay,
            on_failure=self._behind_failed,
        )
        #: Seconds a refill's lease (memcached's stub) lives if its holder dies.
        self.lease_seconds = max(1, math.ceil(2 * cluster.settings.timeout))
        #: Seconds between a node answering a probe again and its journal's replay.
        self.replay_settle = 2 * cluster.settings.timeout
        self.metrics = TierMetrics()
        self._on_node_out = on_node_out
        #: Called by the maintenance thread with the node's id and the keys replayed, once
        #: this process has brought a node back (the backend sends ``node_back``).
        self.on_node_back = on_node_back
        #: Per node: why the latest probe failed (for the repeated "still out" warning).
        self.last_probe_error: dict[int, str] = {}
        self._warnings = RateLimit()
        #: What the maintenance thread holds (weakly) of this store while registered.
        self.maintained: Handle[TieredStore] | None = None
        #: The check that the tier's files are still the directory's, moving to them when
        #: they are not (:func:`.maintenance.check_files`); set while the store is
        #: registered with the maintenance thread.
        self.check_files: Callable[[TieredStore], None] | None = None
        #: ``time.monotonic()`` from which the next call checks the files.
        self._files_due = -math.inf

    def _follow_files(self) -> None:
        """Check that the tier's files are still the directory's, when the last check is
        FILES_CHECK_INTERVAL old (and move to the directory's files when they are not).

        Every call runs this before it reads a node's state, stamps a key or reads from
        disk: what it uses is then the files the directory's processes use, as checked at
        most that long ago (a directory deleted and made again, a stamps anchor removed:
        docs/disk-tier.md). The calls check, not only the maintenance thread, which does
        so for a process that makes none: the thread need not wake every 0.1 s to bound
        that window, and a wake-up costs a busy process more than the check."""
        now = _monotonic()
        if now < self._files_due:
            return
        self._files_due = now + FILES_CHECK_INTERVAL
        check = self.check_files
        if check is None:
            return
        try:
            check(self)
        except Exception as exc:  # the disk's own failures are handled inside; not the call's
            if self._warnings.allow("files-check"):
                logger.warning(
                    "could not check the disk tier's files at %s: %s", self.directory, exc
                )

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
        descriptors, or an async call that found its pool busy until its timeout
        (:class:`LocalResourceError`), leaves the node alone: a read is answered by the disk
        tier; a write is refused (journaling it would need the node out). So does a reply
        over this process's ``max_value_size`` (:class:`ReplyTooLargeError`): another
        process, with a larger limit, stored the value; every process would otherwise mark
        the node out each time this one reads it."""
        if isinstance(exc, (LocalResourceError, ReplyTooLargeError)):
            self._local_failure(self.cluster.node_ids[node], exc, read=read)
            return
        if isinstance(exc, NODE_FAILURES) and not isinstance(exc, MetaUnsupportedError):
            self.node_failed(node, exc)
            return
        if isinstance(exc, CommandError):
            refused = refusal_error(exc, self.cluster.node_ids[node])
            if refused is not None:  # memcached's connection limit, seen as a reply
                self.node_failed(node, refused)
                return
        raise exc

    def _local_failure(
        self, node_id: str | None, exc: LocalResourceError | ReplyTooLargeError, *, read: bool
    ) -> None:
        """This process's own trouble reaching memcached (see :meth:`_memcached_failed`),
        at ``node_id``; None for a call over several nodes, whose error names the one."""
        self.metrics.local_failures += 1
        if self._warnings.allow(("local", node_id)):
            logger.warning(
                "could not reach %s from this process: %s; %s",
                "memcached" if node_id is None else f"memcached node {node_id}",
                exc,
                "reads are answered by the disk tier, writes fail"
                " (the node stays up for other processes)",
            )
        if not read:
            raise exc

    def _disk_failed(self, key: bytes | None = None, error: BaseException | None = None) -> None:
        self.metrics.disk_failures += 1
        self._log_disk_failure(error)
        if key is not None:
            # The entry may now be older than memcached's value: it must not answer a miss,
            # in any process. (Deleting it would need the disk that just failed.)
            self.stamps.bump(key, gone=True)

    def _behind_failed(self, error: DiskError, writes: int) -> None:
        # The writes were stamped before they were queued: their keys miss, nothing older
        # answers. Only counted (each write lost) and logged here.
        self.metrics.disk_failures += writes
        self._log_disk_failure(error)

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
        for key in keys:
            self.stamps.bump(key, gone=True)

    # -- disk entries --------------------------------------------------------------------
    def _answering(self, key: bytes, stamp: int | None = None) -> Fields | None:
        """The fields of the key's disk entry if it may answer now: written under
        ``stamp`` (by default, its slot's current one), which must be a write's; within
        ``max_staleness``; not expired; not distrusted. A disk that fails answers nothing.
        (What :meth:`_on_disk` answers, with nothing built: every read of an outage runs
        it.) Under the slot's current stamp, a copy kept in memory answers in place of a
        read from disk (:mod:`.disk.readcopies`), checked alike."""
        if stamp is None:
            # Whether copies may answer, settled before the slot is read: a move to
            # another table in between then shows as a stamp no copy holds. (No copies
            # kept: nothing to check.)
            hold = self.copies.limit > 0 and self._copies_hold()
            stamp = self.stamps.current(key)
            if not stamp & 1:  # not holds_value(stamp), inline
                return None  # deleted, or never written: no entry answers, no need to look
            # The slot's current stamp: a copy read earlier answers as its entry would.
            # (Only then: under an older stamp, a newer write may have landed since.)
            found = self.copies.get(key, stamp) if hold else None
            if found is None:
                found = self._read(key, stamp)
                if found is None:
                    return None
                self.copies.keep(key, found)
        else:
            if not stamp & 1:
                return None
            found = self._read(key, stamp)
            if found is None:
                return None
        written_at = found[2]
        expire_at = found[3]
        now = _now()
        if (
            now - written_at > self.max_staleness
            or (expire_at is not None and expire_at <= now)
            or not self.states.trusts(key, written_at)
        ):
            return None
        return found

    def _copies_hold(self) -> bool:
        """Whether a copy matching its slot's stamp may answer: this process's write
        stamps anchor is still the directory's, as checked at most CHECK_INTERVAL ago.

        A copy is matched against the table this process maps. Once the anchor alone was
        removed (an age-based temp cleaner), a process started since stamps another table,
        and until this one moves (its maintenance thread's check of the files) its slots
        say nothing of that process's writes, while a read from disk would find the row
        that process's write landed, under a stamp of the other table, and miss. So the
        copies answer only while a check made within CHECK_INTERVAL found the anchor in
        place, and are dropped when it did not (the window left: CHECK_INTERVAL, as for
        the node states' files). A ``stat`` that fails (other than for a missing file)
        counts as a removed anchor here."""
        now = _monotonic()
        if now < self._copies_checked_until:
            return True
        if self.stamps.replaced(unknown=True):
            self.copies.clear()
            return False
        self._copies_checked_until = now + CHECK_INTERVAL
        return True

    def _read(self, key: bytes, stamp: int) -> Fields | None:
        """The fields of ``key``'s disk entry written under ``stamp``, read from disk."""
        try:
            return self.disk.read(key, stamp)
        except DiskError as exc:
            self._disk_failed(None, exc)
            return None

    def _on_disk(self, key: bytes, stamp: int | None = None) -> DiskEntry | None:
        """The key's disk entry if it answers (see :meth:`_answering`)."""
        found = self._answering(key, stamp)
        return None if found is None else DiskEntry._make(found)

    def _disk_read(self, key: bytes) -> tuple[bytes, int] | None:
        found = self._answering(key)
        return None if found is None else (found[0], found[1])

    def _queue(
        self, key: bytes, stamp: int, data: bytes | None, flags: int, ttl: float | None, now: float
    ) -> None:
        """The disk copy of a write acknowledged by memcached, for the writer behind."""
        if ttl is not None and ttl <= 0:
            data = None  # expired at once: the disk copy is a delete
        self._behind(key, stamp, data, flags, None if ttl is None else now + ttl, now)

    def _behind(
        self,
        key: bytes,
        stamp: int,
        data: bytes | None,
        flags: int,
        expire_at: float | None,
        written_at: float,
    ) -> None:
        """Queue the disk copy (``data`` None: a delete) of a write or delete memcached
        answered, stamped ``stamp`` before it was sent.

        When the slot's stamp is no longer ``stamp``, another write or delete of the slot
        was stamped while this one was in flight, and memcached may have taken the two in
        either order: the slot is stamped gone instead, so that its disk entries miss (a
        copy queued under an older stamp is skipped by the writer). Of two such racers, the
        one checking second sees the other's stamp."""
        slot = slot_of(key)
        if self.stamps.current_slot(slot) != stamp:
            self.stamps.bump_slot(slot, gone=True)
            return
        self.behind.put(key, slot, stamp, data, flags, expire_at, written_at)

    def _write_now(
        self,
        key: bytes,
        data: bytes | None,
        flags: int,
        expire_at: float | None,
        written_at: float | None = None,
    ) -> None:
        """Write ``key``'s disk entry at once (a node is out): stamped first, so that the
        entry it replaces stops answering even if the write fails, and landed only while
        that stamp is current (overtaken, it never answers: see :meth:`_land_now`)."""
        stamp = self.stamps.bump(key, gone=data is None)
        self._land_now(key, stamp, data, flags, expire_at, written_at)

    def _land_now(
        self,
        key: bytes,
        stamp: int,
        data: bytes | None,
        flags: int,
        expire_at: float | None,
        written_at: float | None = None,
    ) -> None:
        """Land the disk entry of a write made at once, stamped ``stamp`` already, while
        that stamp is current."""
        now = _now()
        self.disk.land(
            [(key, stamp, data, flags, expire_at, now if written_at is None else written_at)],
            self.stamps.current,
        )
        if self.stamps.current(key) != stamp:
            # Overtaken, or stamped in a table the process has since left (it moved to a
            # directory made again): the slot is stamped gone where it is read now. Even
            # when overtaken within one table: the newer stamp may be that of a call that
            # answers from the entry before this write (touch, incr: see _base), which
            # this write's landing, had it been made, would have replaced. The newer
            # write's own copy is hidden with it: a miss.
            self.stamps.bump(key, gone=True)

    def _journaled(
        self, node: int, keys: list[bytes], disk_write: Callable[[], T]
    ) -> tuple[bool, T | None]:
        """Run ``disk_write`` while ``node`` is out, journaling ``keys`` for its replay.

        Returns ``(True, result)``, or ``(False, None)`` when the node came back meanwhile
        (the caller then goes to memcached again). Raises :class:`DiskError` when the disk
        write failed: the keys are journaled all the same (the node may hold values the
        write was to replace) and their disk entries no longer answer. When the journal
        itself failed, the node is flushed whole at its replay instead (its journal does not
        name these keys), and the disk entries the write was to replace no longer answer."""
        failure: DiskError | None = None
        brought_back = False
        try:
            with self.journal.transaction() as connection:
                if not self.states.is_out(node):
                    return False, None
                Journal.record(connection, self.cluster.node_ids[node], keys)
                # The journal they went to, in the node's state (a replay that finds
                # another flushes the node: see NodeStates.journaled_in).
                self.states.journaled_in(node, self.journal.id)
                # Brought back meanwhile by a replay that did not see these keys: one of a
                # journal removed since, under its own file's lock (this one is the file
                # at the path). Out again below, before anything is acknowledged: the next
                # replay reads them here. (A replay that marked it up after this read
                # notices the journal moved: see _out_again_if_moved.)
                brought_back = not self.states.is_out(node)
                try:
                    result = disk_write()
                except DiskError as exc:
                    failure = exc
        except DiskError as exc:
            # Not even journaled: the write is lost, and the disk entries it was to replace
            # must not answer. The node may still hold the values it was to replace, and
            # the replay would not know the keys: it flushes the node instead. The request
            # is made before the node's state is read again, as the replay reads it after
            # marking the node up (see bring_back): one of the two sees the other.
            self.states.must_flush(node)
            self._distrust(keys, exc)
            if not self.states.is_out(node):
                return False, None  # brought back meanwhile: memcached again
            raise
        self.metrics.journaled += len(keys)
        if brought_back:  # (here: node_out's receivers run outside the journal's lock)
            self.node_failed(
                node,
                DiskError(
                    "brought back by the replay of an outage journal removed since, while "
                    "a write was journaled in the one at its path"
                ),
            )
        if failure is not None:
            self._distrust(keys, failure)
            raise failure
        return True, result

    def recover_lost_states(self) -> None:
        """Called once the store is set up, before it serves: a node whose state page no
        process has checked yet (made again, its file missing or truncated, say by a
        cleaner while no process ran) may have been out, with writes of its outage
        journaled; read as up, it would serve the values they replaced. A node the journal
        names keys of is marked out again, for its replay; when the journal cannot be
        read, such nodes go out to be flushed whole. Every process starting meets an
        unchecked page this way, the one that made it or not, until one has checked it."""
        unchecked = self.states.unchecked()
        if not unchecked:
            return
        try:
            with self.journal.transaction() as connection:
                for node in unchecked:
                    node_id = self.cluster.node_ids[node]
                    if not self.states.is_out(node) and Journal.keys(connection, node_id):
                        self.states.mark_out(node)
                        self.states.journaled_in(node, self.journal.id)
                        logger.warning(
                            "memcached node %s: its state in %s was lost while its outage "
                            "journal names keys; it is out until they are replayed",
                            node_id,
                            self.directory,
                        )
                    self.states.checked(node)
        except (DiskError, sqlite3.Error) as exc:
            for node in unchecked:
                self.states.must_flush(node)
                self.states.mark_out(node)
                self.states.checked(node)  # (the flush asked for stands in the page)
            logger.warning(
                "the disk tier's node states at %s were made again, and its outage journal "
                "cannot be read (%s): its nodes are out until they are flushed whole",
                self.directory,
                _describe(exc),
            )

    # -- reads ---------------------------------------------------------------------------
    def get_now(self, key: bytes) -> tuple[bytes, int] | None:
        """:meth:`get` on the blocking client, as a plain call (the sync API's flat path;
        ``key`` is valid, as the backend's wire keys are)."""
        now = _monotonic()
        if now >= self._files_due:  # (_follow_files, inline: the flat path)
            self._follow_files()
            now = _monotonic()
        node = self.cluster.node_index(key)
        epoch = self.states.epoch(node)
        if not epoch & 1:  # up
            try:
                # (The node and the clock read here, passed on: not found again.)
                found = self.blocking.value_at(node, key, now)
            except FastCacheError as exc:
                self._memcached_failed(node, exc, read=True)
            else:
                if self.states.epoch(node) == epoch:  # (else: see went_out)
                    if _is_value(found):
                        return found
                    if not holds_value(self.stamps.current(key)):
                        return None  # deleted, or never written: no disk entry answers
                    return run_blocking(self._answer_miss(self.blocking, key, node))
        self.metrics.fallbacks += 1
        entry = self._answering(key)  # (_disk_read, inline: every read of an outage)
        return None if entry is None else (entry[0], entry[1])

    async def get(self, client: CommandSet, key: bytes) -> tuple[bytes, int] | None:
        self._follow_files()
        node = self.cluster.node_index(key)
        epoch = self.states.epoch(node)
        if not epoch & 1:  # up
            try:
                item = await client.get(key)
            except FastCacheError as exc:
                self._memcached_failed(node, exc, read=True)
            else:
                if self.states.epoch(node) == epoch:  # (else: see went_out)
                    if item is not None and not _is_stub(item.value, item.flags):
                        return item.value, item.flags
                    return await self._answer_miss(client, key, node)
        self.metrics.fallbacks += 1
        return self._disk_read(key)

    def went_out(self, node: int, epoch: int) -> bool:
        """Whether ``node`` went out (or came back) since its :meth:`NodeStates.epoch` was
        ``epoch``: memcached's answer to a request sent before then must not be served.

        A request sent just before its node hung is answered when the node runs again,
        with what memcached holds by then, which may include a write that timed out
        meanwhile (its caller marked the node out first) and was then made on the disk tier
        instead: memcached applied it to its value, the disk to its own, and an ``incr``
        then reads a value no acknowledged call returned. The disk tier answers instead
        (its entries are stamped: at worst a miss)."""
        return self.states.epoch(node) != epoch

    async def _answer_miss(
        self, client: CommandSet, key: bytes, node: int
    ) -> tuple[bytes, int] | None:
        """memcached had nothing (or a stub): the disk tier's entry, put back under a lease."""
        entry = self._on_disk(key)
        if entry is None:
            return None  # the common miss: one read, no lock
        self.metrics.disk_hits += 1
        if not self.states.is_out(node):
            try:
                await self._refill(client, key, entry)
            except FastCacheError as exc:
                with contextlib.suppress(FastCacheError):
                    self._memcached_failed(node, exc, read=True)
        return entry.data, entry.flags

    async def _refill(
        self, client: CommandSet, key: bytes, entry: DiskEntry, take_over: bool = False
    ) -> bool:
        """Put ``entry`` back into memcached, unless a write or delete of the key lands
        meanwhile: True when stored.

        ``mg <key> c N`` creates a stub and hands this caller its CAS (or finds the key held:
        a value written since, or another caller's stub, and leaves it). The stamp is then
        checked again: a write or delete stamps before it reaches memcached, so one that
        landed before the stub was made shows here, and the stub is given back. One that
        lands later replaces or deletes the stub, and the CAS store fails.

        ``take_over``: another caller's stub is replaced too, with its CAS, as an add
        replaces one (for an incr, whose ``entry`` is the key's latest value under its own
        stamp). A stub whose holder died, or whose ``mg`` reply never reached it, is never
        given back: left, it would keep the counter missing until it expires."""
        lease = await client.meta_get(
            key, value=take_over, cas=True, client_flags=take_over, vivify=self.lease_seconds
        )
        if lease is None:
            return False
        if not lease.win and (
            not take_over
            or lease.stale
            or not _is_stub(lease.value or b"", lease.client_flags or 0)
        ):
            return False
        if self.stamps.current(key) != entry.stamp:
            if lease.win:
                await let_go(client, client.meta_delete(key, cas=lease.cas))
            return False
        now = _now()
        exptime = memcached_exptime(entry.remaining_seconds(now), now)
        stored = await _stored_under(
            client,
            key,
            lease,
            client.meta_set(key, entry.data, flags=entry.flags, exptime=exptime, cas=lease.cas),
        )
        if stored.status is MetaStatus.HD:
            self.metrics.refills += 1
            return True
        return False

    async def answer_leased_miss(
        self, client: CommandSet, key: bytes, cas: int | None
    ) -> tuple[bytes, int] | None:
        """A get_or_set winner's miss (it holds the stub of CAS ``cas``): the disk tier's
        entry, stored back under that lease, or None.

        The stub was made before the entry is read, so a write or delete that reached
        memcached first has stamped the key already (the entry no longer answers), and one
        that lands later replaces or deletes the stub (the store fails)."""
        self._follow_files()
        entry = self._on_disk(key)
        if entry is None:
            return None
        self.metrics.disk_hits += 1
        now = _now()
        exptime = memcached_exptime(entry.remaining_seconds(now), now)
        with contextlib.suppress(FastCacheError):
            stored = await client.meta_set(
                key, entry.data, flags=entry.flags, exptime=exptime, cas=cas
            )
            if stored.status is MetaStatus.HD:
                self.metrics.refills += 1
        return entry.data, entry.flags

    async def get_many(
        self, client: CommandSet, keys: list[bytes]
    ) -> dict[bytes, tuple[bytes, int]]:
        self._follow_files()
        # Each key's node state is read once: a node marked up while this runs must not
        # leave its keys asked of neither tier.
        up: list[bytes] = []
        out: list[bytes] = []
        epochs: dict[int, int] = {}
        for key in keys:
            node = self.cluster.node_index(key)
            epoch = epochs.get(node)
            if epoch is None:
                epoch = epochs[node] = self.states.epoch(node)
            (out if epoch & 1 else up).append(key)
        found: dict[bytes, tuple[bytes, int]] = {}
        if up:
            items, failures = await client.get_many_by_node(up)
            if failures:
                # A node that failed is marked out (as a get's failure marks it), or, for
                # this process's own trouble (a busy pool, no descriptors), left alone:
                # either way the disk tier answers its keys, and the other nodes' answers
                # stand (asking them again, key by key, waited a timeout per hung node).
                for node, exc in failures.items():
                    self._memcached_failed(node, exc, read=True)  # (raises what is neither)
                out += [key for key in up if self.cluster.node_index(key) in failures]
                up = [key for key in up if self.cluster.node_index(key) not in failures]
            moved = {node for node, epoch in epochs.items() if self.went_out(node, epoch)}
            for key in up:
                item = items.get(key)
                if moved and self.cluster.node_index(key) in moved:
                    out.append(key)  # its node went out meanwhile: see went_out
                elif item is not None and not _is_stub(item.value, item.flags):
                    found[key] = (item.value, item.flags)
                else:
                    value = await self._answer_miss(client, key, self.cluster.node_index(key))
                    if value is not None:
                        found[key] = value
        for key in out:
            self.metrics.fallbacks += 1
            value = self._disk_read(key)
            if value is not None:
                found[key] = value
        return found

    # -- writes --------------------------------------------------------------------------
    # Each write stamps its key, then goes to memcached, then queues its disk copy. While
    # the node is out, the key is journaled and stamped, and its disk entry written at once.
    def _out(self, node: int, key: bytes, disk_write: Callable[[], R], failed: R) -> tuple[bool, R]:
        """``disk_write()``, journaled, while ``node`` is out: ``(True, result)``;
        ``(False, failed)`` when the node came back meanwhile (go to memcached again);
        ``(True, failed)`` when the disk failed."""
        try:
            done, result = self._journaled(node, [key], disk_write)
        except DiskError:
            return True, failed
        return (True, cast(R, result)) if done else (False, failed)

    def _out_write(
        self,
        node: int,
        key: bytes,
        data: bytes | None,
        flags: int,
        ttl: float | None,
        bumped: list[int] | None = None,
        ran: _Attempts | None = None,
    ) -> tuple[bool, bool]:
        """A set of ``data`` (None: a delete) of ``key`` while ``node`` is out, as
        :meth:`_out` runs a write, but with the journal's lock held only to journal the key
        and stamp it: the disk write lands after the lock is let go. (The lock is the
        host's; held across the disk write, it queued every write of an outage on the host
        behind one another.) The stamp, taken before the node can be brought back, hides
        the entry the write replaces at once, so a read before the landing misses, as one
        of a write behind does; the landing is made only while the stamp is current, and
        one overtaken stamps the slot gone (see :meth:`_land_now`): a miss.

        ``ran``: the call's attempts on memcached, when one may have run (a set that timed
        out). If another write stamped the key since, its value may have been counted on
        or replaced in memcached meanwhile (an ``incr`` by another process answered on top
        of it), which the replay deletes: the set is journaled, and the key's disk entries
        stamped gone rather than answering the set's value (a miss).

        Returns ``(True, result)``, the result being a set's "stored" or a delete's "found"
        (whether get would have answered the key, read before the stamp moved);
        ``(False, False)`` when the node came back meanwhile (go to memcached again);
        ``(True, False)`` when the disk failed (the key's entries no longer answer)."""
        deleting = data is None or (ttl is not None and ttl <= 0)
        gone: list[bool] = [deleting]

        def journal_and_stamp() -> tuple[int, bool]:
            found = (
                data is not None or self._on_disk(key, self._base(key, bumped or [])) is not None
            )
            if ran is not None and ran.overtaken(self.stamps.current(key)):
                gone[0] = True
            return self.stamps.bump(key, gone=gone[0]), found

        try:
            done, stamped = self._journaled(node, [key], journal_and_stamp)
        except DiskError:
            return True, False
        if not done or stamped is None:
            return False, False
        stamp, result = stamped
        expire_at = None if gone[0] or ttl is None else _now() + ttl
        try:
            self._land_now(key, stamp, None if gone[0] else data, flags, expire_at)
        except DiskError as exc:
            # (StampsUnavailable too: this process cannot stamp the slot gone where the
            # others read it now, and reads nothing from disk until it can.)
            with contextlib.suppress(DiskError):
                self._distrust([key], exc)
            return True, False
        return True, result

    def _base(self, key: bytes, bumped: list[int]) -> int | None:
        """The stamp under which ``key``'s disk entry holds its latest acknowledged value,
        after an attempt on memcached that stamped ``bumped`` = [before, after] and failed:
        the one before, unless another write stamped the slot since (None: the current)."""
        if bumped and self.stamps.current(key) == bumped[1]:
            return bumped[0]
        return None

    def _before(self, key: bytes, bumped: list[int]) -> int:
        """The stamp ``key``'s value lies under, read as another attempt of a call whose
        earlier one stamped ``bumped`` = [before, after] is about to stamp it again: the
        stamp before the earlier attempt's, unless another write stamped the slot since.
        (Nothing lies under an attempt's own stamp: its disk copy is queued only once it
        succeeded, and then the call returns.) With nothing stamped yet, the current one."""
        base = self._base(key, bumped)
        return self.stamps.current(key) if base is None else base

    def _attempt_stamp(self, slot: int, ran: _Attempts | None) -> int:
        """The stamp of an attempt of a write on memcached; with ``ran`` (an earlier one
        may have run), it records whether another write stamped the slot in between."""
        if ran is None:
            return self.stamps.bump_slot(slot)
        before, stamp = self.stamps.replace_slot(slot)
        ran.followed(before)
        return stamp

    def set_now(self, key: bytes, data: bytes, flags: int, ttl: float | None) -> bool:
        """:meth:`set` on the blocking client, as a plain call (the sync API's flat path;
        every argument is valid, as the backend's are)."""
        if _monotonic() >= self._files_due:  # (_follow_files, inline: the flat path)
            self._follow_files()
        node = self.cluster.node_index(key)
        ran: _Attempts | None = None
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                slot = slot_of(key)
                stamp = self._attempt_stamp(slot, ran)
                now = _now()
                try:
                    stored = self.blocking.store_now(
                        b"set", key, data, flags, memcached_exptime(ttl, now), True
                    )
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                    ran = _Attempts.after(ran, stamp, exc)
                else:
                    if not stored:
                        return False
                    # The disk copy, for the writer behind (_queue and _behind, inline: the
                    # flat path).
                    stamps = self.stamps
                    if ttl is not None and ttl <= 0:
                        self._queue(key, stamp, data, flags, ttl, now)
                    elif stamps.current_slot(slot) == stamp:
                        expire_at = None if ttl is None else now + ttl
                        self.behind.put(key, slot, stamp, data, flags, expire_at, now)
                    else:
                        stamps.bump_slot(slot, gone=True)
                    return True
            done, result = self._out_write(node, key, data, flags, ttl, ran=ran)
            if done:
                return result
        return False

    async def set(
        self,
        client: CommandSet,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        ran: _Attempts | None = None,
    ) -> bool:
        """``ran``: an earlier attempt of this write that may have run (set_many's)."""
        self._follow_files()
        node = self.cluster.node_index(key)
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                stamp = self._attempt_stamp(slot_of(key), ran)
                now = _now()
                try:
                    stored = await client.set(
                        key, data, flags=flags, exptime=memcached_exptime(ttl, now)
                    )
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                    ran = _Attempts.after(ran, stamp, exc)
                else:
                    if stored:
                        self._queue(key, stamp, data, flags, ttl, now)
                    return stored
            done, result = self._out_write(node, key, data, flags, ttl, ran=ran)
            if done:
                return result
        return False

    async def store_leased(
        self,
        client: CommandSet,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        cas: int | None,
    ) -> bool:
        """A lease winner's store (``ms … C<cas>``) as a write: stamped first, its disk copy
        queued once memcached took it. False when a write or delete replaced the lease's
        item meanwhile (memcached's value, if any, becomes the disk copy under the new
        stamp), or when the node failed or is out (nothing to hold a lease with)."""
        self._follow_files()
        node = self.cluster.node_index(key)
        if self.states.is_out(node):
            return False
        stamp = self.stamps.bump(key)
        now = _now()
        try:
            stored = await client.meta_set(
                key, data, flags=flags, exptime=memcached_exptime(ttl, now), cas=cas
            )
        except FastCacheError as exc:
            self._memcached_failed(node, exc, read=False)
            return False
        if stored.status is MetaStatus.HD:
            self.metrics.leased_stores += 1
            self._queue(key, stamp, data, flags, ttl, now)
            return True
        if stored.status is MetaStatus.EX:
            await self._copy_back(client, key, stamp)
        return False

    def _set_on_disk(self, key: bytes, data: bytes, flags: int, ttl: float | None) -> bool:
        now = _now()
        if ttl is not None and ttl <= 0:
            self._write_now(key, None, flags, None)
        else:
            self._write_now(key, data, flags, None if ttl is None else now + ttl)
        return True

    async def set_many(
        self,
        client: CommandSet,
        triples: list[tuple[bytes, bytes, int]],
        ttl: float | None,
    ) -> list[bytes]:
        self._follow_files()
        up = [t for t in triples if not self.states.is_out(self.cluster.node_index(t[0]))]
        settle: set[bytes] = {key for key, _data, _flags in triples} - {k for k, _d, _f in up}
        sent: dict[bytes, int] = {}
        if up:
            stamps = [self.stamps.bump(key) for key, _data, _flags in up]
            now = _now()
            # A node that fails shows as its keys not stored: they are settled one by one
            # below (which marks the node out and journals them).
            refused = set(await client.set_many(up, exptime=memcached_exptime(ttl, now)))
            for (key, data, flags), stamp in zip(up, stamps):
                if key in refused:
                    settle.add(key)
                    # (Its node may have failed after running it: the stamp it went under.)
                    sent[key] = stamp
                else:
                    self._queue(key, stamp, data, flags, ttl, now)
        failed: list[bytes] = []
        for key, data, flags in triples:
            if key not in settle:
                continue
            went = sent.get(key)
            try:
                stored = await self.set(
                    client, key, data, flags, ttl, None if went is None else _Attempts(went)
                )
            except CommandError:
                # memcached refused it again (too large, out of memory): it failed, as
                # set_many reports a failure (the caller removes the key from both tiers).
                stored = False
            if not stored:
                failed.append(key)
        return failed

    async def add(
        self,
        client: CommandSet,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        first: MetaReply | FastCacheError | None = None,
    ) -> bool:
        """``first``: the outcome of the lease's ``mg`` that :meth:`add_now` sent, taken by
        the first attempt as its own."""
        self._follow_files()
        node = self.cluster.node_index(key)
        bumped: list[int] = []
        for _attempt in range(_MAX_RETRIES):
            strict = False
            # (A reply add_now took is handled even if the node went out since: a win it
            # took on a stale value goes back, as when the mg is sent here.)
            if not self.states.is_out(node) or first is not None:
                bumped.clear()
                try:
                    return await self._add_up(client, key, data, flags, ttl, bumped, first)
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                    # Stamped: its store was sent, and memcached may have taken it (and
                    # readers seen its value) before the node was marked out.
                    strict = bool(bumped) and _may_have_run(exc)
            done, result = self._out(
                node,
                key,
                functools.partial(self._add_on_disk, key, data, flags, ttl, bumped, strict),
                False,
            )
            if done:
                return result
            if strict:  # the node came back meanwhile: trying again might be refused by itself
                raise _outcome_unknown(key, "add")
            first = None
        return False

    def add_now(self, key: bytes, data: bytes, flags: int, ttl: float | None) -> bool:
        """:meth:`add` on the blocking client, as a plain call (the sync API's flat path;
        every argument is valid, as the backend's are) where its commonest answer comes
        from the lease's ``mg`` alone: memcached holds a value, and the add is refused.
        Anything else (a lease, a stale value, a failure, no meta) goes on in :meth:`add`,
        which takes that ``mg``'s outcome as its first attempt's."""
        if _monotonic() >= self._files_due:  # (_follow_files, inline: the flat path)
            self._follow_files()
        node = self.cluster.node_index(key)
        first: MetaReply | FastCacheError | None = None
        if not self.states.is_out(node):
            try:
                first = self.blocking.meta_at(
                    node, b"mg %s v c f N%d\r\n" % (key, self.lease_seconds)
                )
            except FastCacheError as exc:
                first = exc
            else:
                if first.status is MetaStatus.EN:
                    first = None  # no lease handed out (the item went meanwhile): ask again
                elif not first.stale and not _is_stub(first.value or b"", first.client_flags or 0):
                    return False  # memcached holds a value (_add_up's refusal)
        return run_blocking(self.add(self.blocking, key, data, flags, ttl, first))

    async def _add_up(
        self,
        client: CommandSet,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        bumped: list[int],
        first: MetaReply | FastCacheError | None = None,
    ) -> bool:
        """``add`` where memcached may have lost a value the disk tier still holds (a
        restart, or a replay's deletes): that value counts, as get would have answered it.

        The add takes the key's lease first (``mg … N``), so that memcached holds nothing a
        reader could see while the disk is consulted: a value found there goes back under
        the lease and the add is refused; otherwise the add's value is stored with the
        lease's CAS. A stub of another caller (a refill, or a ``get_or_set`` computing) is
        replaced only when the disk has nothing either, as a set would replace it. A write
        or delete landing meanwhile replaces or removes the stub, and the CAS store fails."""
        for _try in range(_STUB_TRIES):
            try:
                if first is None:
                    lease = await client.meta_get(
                        key, value=True, cas=True, client_flags=True, vivify=self.lease_seconds
                    )
                else:  # asked already (add_now): its outcome, as if asked here
                    lease, first = _outcome(first), None
            except MetaUnsupportedError:
                return await self._add_classic(client, key, data, flags, ttl, bumped)
            if lease is None:
                continue  # no lease handed out (the item went meanwhile): ask again
            if lease.stale or not _is_stub(lease.value or b"", lease.client_flags or 0):
                if lease.win and lease.stale:
                    # Reading a stale value took its win: mark it stale again.
                    await let_go(client, client.meta_delete(key, cas=lease.cas, invalidate=True))
                return False  # memcached holds a value
            # A stub: this caller's lease, or another's. The stamp is read after it, so a
            # write or delete stamped before it shows here; one stamped later lands in
            # memcached after the stub was made, and the CAS store below fails.
            prev = self.stamps.current(key)
            entry = self._on_disk(key, prev)
            if entry is not None:
                # The key exists: get would answer it from disk. Back into memcached under
                # this caller's lease (another's is a refill of it under way).
                if lease.win:
                    now = _now()
                    exptime = memcached_exptime(entry.remaining_seconds(now), now)
                    with contextlib.suppress(FastCacheError):
                        stored = await _stored_under(
                            client,
                            key,
                            lease,
                            client.meta_set(
                                key, entry.data, flags=entry.flags, exptime=exptime, cas=lease.cas
                            ),
                        )
                        if stored.status is MetaStatus.HD:
                            self.metrics.refills += 1
                return False
            stamp = self.stamps.bump(key, gone=ttl is not None and ttl <= 0)
            bumped[:] = [prev, stamp]
            now = _now()
            stored = await _stored_under(
                client,
                key,
                lease,
                client.meta_set(
                    key, data, flags=flags, exptime=memcached_exptime(ttl, now), cas=lease.cas
                ),
            )
            if stored.status is MetaStatus.HD:
                self._queue(key, stamp, data, flags, ttl, now)
                return True
            # A write replaced the stub (EX: the key holds its value now, the add is refused)
            # or a delete removed it (NF: ask again). The add's stamp stays: the key's disk
            # copy misses until its next write, never answers older.
            if stored.status is not MetaStatus.NF:
                return False
        return False

    async def _add_classic(
        self,
        client: CommandSet,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        bumped: list[int],
    ) -> bool:
        """``add`` on a memcached without the meta protocol (no leases, and so no refills
        to race with): memcached's add, then the disk consulted. A value found there makes
        the add refused; without a CAS its value cannot be swapped back in safely, so the
        add's value is deleted again and the key misses in memcached (get answers it from
        disk). The stamp moves only once the add took: a refused add leaves the key's disk
        copy as it was."""
        now = _now()
        if not await client.add(key, data, flags=flags, exptime=memcached_exptime(ttl, now)):
            return False
        prev = self.stamps.current(key)
        if self._on_disk(key, prev) is not None:
            with contextlib.suppress(FastCacheError):
                await client.delete(key)
            return False
        stamp = self.stamps.bump(key, gone=ttl is not None and ttl <= 0)
        bumped[:] = [prev, stamp]
        self._queue(key, stamp, data, flags, ttl, now)
        return True

    async def _copy_back(self, client: CommandSet, key: bytes, stamp: int) -> None:
        """Queue memcached's value of ``key`` as its disk copy under ``stamp`` (an operation
        that stamped the key left its value unchanged)."""
        with contextlib.suppress(FastCacheError):
            held = await client.meta_get(key, value=True, client_flags=True, ttl=True, cas=True)
            if held is None or held.stale or _is_stub(held.value or b"", held.client_flags or 0):
                await _give_back(client, key, held)
                return
            assert held.value is not None
            ttl = None if held.ttl is None or held.ttl < 0 else float(held.ttl)
            self._queue(key, stamp, held.value, held.client_flags or 0, ttl, _now())

    def _add_on_disk(
        self,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        bumped: list[int],
        strict: bool = False,
    ) -> bool:
        """The add on disk (while the node is out, journaled). ``strict``: memcached may
        have taken its store; made on disk only while no other write of the key was
        stamped since (the disk found nothing under the stamp before, as memcached did),
        else :class:`OutcomeUnknownError`."""
        if strict and not self._slot_still(key, bumped):
            raise _outcome_unknown(key, "add")
        if self._on_disk(key, self._base(key, bumped)) is not None:
            return False
        self._set_on_disk(key, data, flags, ttl)
        return True

    async def touch(
        self,
        client: CommandSet,
        key: bytes,
        ttl: float | None,
        bumped: list[int] | None = None,
        first: MetaReply | FastCacheError | None = None,
        asked: bool = False,
    ) -> bool:
        """``bumped``, ``first`` and ``asked``: where :meth:`touch_now` hands over, after
        stamping the key (``bumped``) and sending the touch's ``mg`` (its outcome
        ``first``, None for a miss), which the first attempt takes as its own."""
        self._follow_files()
        node = self.cluster.node_index(key)
        if bumped is None:
            bumped = []
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node) or asked:
                try:
                    return await self._touch_up(client, key, node, ttl, bumped, first, asked)
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                finally:
                    first, asked = None, False
            done, result = self._out(
                node, key, lambda: self._touch_on_disk(key, ttl, bumped), False
            )
            if done:
                return result
        return False

    def touch_now(self, key: bytes, ttl: float | None) -> bool:
        """:meth:`touch` on the blocking client, as a plain call (the sync API's flat path;
        ``key`` is valid, as the backend's are) where the touch's ``mg`` settles it:
        memcached holds a value, touched, whose disk copy is queued with its new expiry;
        or the key is missing in both tiers. Anything else (a miss the disk holds a value
        for, a stub, a stale value, a failure, no meta) goes on in :meth:`touch` from this
        stamp, which takes that ``mg``'s outcome as its own; a TTL of 0 or less (a delete)
        goes there at once."""
        if ttl is not None and ttl <= 0:
            return run_blocking(self.touch(self.blocking, key, ttl))
        if _monotonic() >= self._files_due:  # (_follow_files, inline: the flat path)
            self._follow_files()
        node = self.cluster.node_index(key)
        if self.states.is_out(node):
            return run_blocking(self.touch(self.blocking, key, ttl))
        # _touch_up's steps: stamped first, then touched and read in one step. (One call
        # reads and stamps the slot, found once.)
        stamps = self.stamps
        slot = slot_of(key)
        prev, stamp = stamps.replace_slot(slot)
        bumped = [prev, stamp]
        now = _now()
        first: MetaReply | FastCacheError | None
        try:
            first = self.blocking.meta_at(node, _touch_read(key, memcached_exptime(ttl, now)))
        except FastCacheError as exc:
            first = exc
        else:
            if first.status is MetaStatus.EN:
                # A miss: the disk may hold the key (or nothing does, as _touch_up finds).
                if self._on_disk(key, prev) is None:
                    return False
                first = None
            elif not first.stale and not _is_stub(first.value or b"", first.client_flags or 0):
                assert first.value is not None
                # The disk copy with its new expiry (_queue and _behind, inline: the flat
                # path; the TTL is positive or None here).
                if stamps.current_slot(slot) == stamp:
                    expire_at = None if ttl is None else now + ttl
                    self.behind.put(
                        key, slot, stamp, first.value, first.client_flags or 0, expire_at, now
                    )
                else:
                    stamps.bump_slot(slot, gone=True)
                return True
        return run_blocking(self.touch(self.blocking, key, ttl, bumped, first, True))

    async def _touch_up(
        self,
        client: CommandSet,
        key: bytes,
        node: int,
        ttl: float | None,
        bumped: list[int],
        first: MetaReply | FastCacheError | None = None,
        asked: bool = False,
    ) -> bool:
        """``asked``: :meth:`touch_now` stamped the key (``bumped``) and sent the ``mg``
        already; ``first`` is its outcome."""
        if asked:
            prev, stamp = bumped
        else:
            prev = self._before(key, bumped)
            stamp = self.stamps.bump(key, gone=ttl is not None and ttl <= 0)
            bumped[:] = [prev, stamp]
        now = _now()
        exptime = memcached_exptime(ttl, now)
        if ttl is not None and ttl <= 0:
            touched = await client.touch(key, exptime)
            self._behind(key, stamp, None, 0, None, now)
            return touched or self._on_disk(key, prev) is not None
        try:
            # Touched and read in one step, for the disk copy's new expiry.
            if asked:
                held = None if first is None else _outcome(first)
            else:
                reply = await client.meta_line(node, _touch_read(key, exptime))
                held = None if reply.status is MetaStatus.EN else reply
        except MetaUnsupportedError:
            # memcached's touch, which reads no value for the disk copy's new expiry: the
            # key misses on disk once touched there. Not found there: the disk's entry, if
            # it answers, takes the new expiry (not put back into memcached: no lease to
            # do that safely with), as get would have answered it.
            if await client.touch(key, exptime):
                self._behind(key, stamp, None, 0, None, now)
                return True
            entry = self._on_disk(key, prev)
            if entry is None:
                return False
            return self._touched_on_disk(key, stamp, entry, None if ttl is None else now + ttl)
        if held is not None and held.stale:
            # Marked stale by invalidate(): touched, and no disk copy (the value is on its
            # way out); a win this read took goes back to get_or_set.
            await _give_back(client, key, held)
            return True
        if held is not None and not _is_stub(held.value or b"", held.client_flags or 0):
            assert held.value is not None
            self._queue(key, stamp, held.value, held.client_flags or 0, ttl, now)
            return True
        entry = self._on_disk(key, prev)
        if entry is None:
            return False
        # memcached lost it, the disk has it: back into memcached with the new expiry.
        expire_at = None if ttl is None else now + ttl
        if not self._touched_on_disk(key, stamp, entry, expire_at):
            return False
        touched_entry = DiskEntry(entry.data, entry.flags, entry.written_at, expire_at, stamp)
        with contextlib.suppress(FastCacheError):
            await self._refill(client, key, touched_entry)
        return True

    def _touched_on_disk(
        self, key: bytes, stamp: int, entry: DiskEntry, expire_at: float | None
    ) -> bool:
        """The disk entry of a key memcached lost, touched: landed at once with its new
        expiry under the touch's stamp, which hid the entry it replaces. Queued for the
        writer behind, it would leave the key missing until landed, in every process, where
        get answered it before the touch (for good without a refill, as under the classic
        protocol). False when the disk failed: the key misses, as get then answers."""
        try:
            self._land_now(key, stamp, entry.data, entry.flags, expire_at, entry.written_at)
        except DiskError as exc:
            self._disk_failed(key, exc)
            return False
        return True

    def _touch_on_disk(self, key: bytes, ttl: float | None, bumped: list[int]) -> bool:
        entry = self._on_disk(key, self._base(key, bumped))
        if entry is None:
            return False
        if ttl is not None and ttl <= 0:
            self._write_now(key, None, 0, None)
        else:
            expire_at = None if ttl is None else _now() + ttl
            self._write_now(key, entry.data, entry.flags, expire_at, entry.written_at)
        return True

    def delete_now(self, key: bytes) -> bool:
        """:meth:`delete` on the blocking client, as a plain call (the sync API's flat path;
        ``key`` is valid, as the backend's wire keys are)."""
        if _monotonic() >= self._files_due:  # (_follow_files, inline: the flat path)
            self._follow_files()
        node = self.cluster.node_index(key)
        # [before, after]: the stamps of the latest attempt that failed on memcached (see
        # _before); None until one did (the flat path: a first attempt allocates nothing).
        bumped: list[int] | None = None
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                stamps = self.stamps
                slot = slot_of(key)
                if bumped is None:  # (the flat path: one call reads and stamps the slot)
                    prev, stamp = stamps.replace_slot(slot, gone=True)
                else:
                    prev = self._before(key, bumped)
                    stamp = stamps.bump_slot(slot, gone=True)
                try:
                    deleted = self.blocking.delete_now(key, True)
                except FastCacheError as exc:
                    bumped = [prev, stamp]
                    self._memcached_failed(node, exc, read=False)
                else:
                    # The disk copy, for the writer behind (_behind, inline: the flat path).
                    if stamps.current_slot(slot) == stamp:
                        self.behind.put(key, slot, stamp, None, 0, None, _now())
                    else:
                        stamps.bump_slot(slot, gone=True)
                    # Not in memcached: it existed if get would have found it on disk.
                    return deleted or self._on_disk(key, prev) is not None
            done, result = self._out_write(node, key, None, 0, None, bumped)
            if done:
                return result
        return False

    async def delete(self, client: CommandSet, key: bytes) -> bool:
        self._follow_files()
        node = self.cluster.node_index(key)
        bumped: list[int] = []
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                prev = self._before(key, bumped)
                stamp = self.stamps.bump(key, gone=True)
                bumped[:] = [prev, stamp]
                try:
                    deleted = await client.delete(key)
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                else:
                    self._behind(key, stamp, None, 0, None, _now())
                    return deleted or self._on_disk(key, prev) is not None
            done, result = self._out_write(node, key, None, 0, None, bumped)
            if done:
                return result
        return False

    async def invalidate(self, client: CommandSet, key: bytes, exptime: int | None) -> bool:
        """``invalidate()``: memcached keeps the value marked stale (``md … I``) for
        get_or_set, while the disk copy goes as a delete's would (stamped gone first): no
        disk entry answers the key again. While the node is out, a delete (journaled).
        Raises MetaUnsupportedError (the disk copy deleted) when the node does not speak
        meta."""
        self._follow_files()
        node = self.cluster.node_index(key)
        bumped: list[int] = []
        for _attempt in range(_MAX_RETRIES):
            if not self.states.is_out(node):
                prev = self._before(key, bumped)
                stamp = self.stamps.bump(key, gone=True)
                bumped[:] = [prev, stamp]
                try:
                    reply = await client.meta_delete(key, invalidate=True, exptime=exptime)
                except MetaUnsupportedError:
                    self._behind(key, stamp, None, 0, None, _now())
                    raise
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                else:
                    self._behind(key, stamp, None, 0, None, _now())
                    return reply.status is MetaStatus.HD or self._on_disk(key, prev) is not None
            done, result = self._out_write(node, key, None, 0, None, bumped)
            if done:
                return result
        return False

    async def delete_many(self, client: CommandSet, keys: Iterable[bytes]) -> None:
        self._follow_files()
        node_of = self.cluster.node_index
        unique = list(dict.fromkeys(keys))
        up = [k for k in unique if not self.states.is_out(node_of(k))]
        asked = set(up)
        settle = [k for k in unique if k not in asked]
        if up:
            stamps = [self.stamps.bump(key, gone=True) for key in up]
            _existed, failures = await client.delete_many_by_node(up)
            now = _now()
            for key, stamp in zip(up, stamps):
                if node_of(key) not in failures:
                    self._behind(key, stamp, None, 0, None, now)
            # A node that failed is marked out (as a delete's failure marks it) before its
            # keys are deleted again one by one, journaled then: a hung node costs one
            # timeout, not two, and the other nodes' deletes stand. A failure that is not
            # the node's leaves it up: its keys' own deletes meet their own outcome.
            for node, exc in failures.items():
                with contextlib.suppress(FastCacheError):
                    self._memcached_failed(node, exc, read=False)
            settle += [key for key in up if node_of(key) in failures]
        # Every key is settled before an error is raised (the first).
        failure: FastCacheError | None = None
        for key in settle:
            try:
                await self.delete(client, key)
            except FastCacheError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    async def incr(
        self,
        client: CommandSet,
        key: bytes,
        delta: int,
        bumped: list[int] | None = None,
        attempts: int = _MAX_RETRIES,
    ) -> int | None:
        """Add ``delta`` (negative: subtract, stopping at 0); None when ``key`` is missing.

        An increment memcached may have counted when its node failed (:func:`_may_have_run`)
        is counted on disk only from the entry under the stamp before its own, and only
        while no other write of the slot was stamped since: the disk's count is then the
        one memcached made, which readers may have seen before the node was marked out.
        Otherwise :class:`OutcomeUnknownError` (it may have taken effect).

        ``bumped`` and ``attempts``: where :meth:`incr_now` hands over, after an attempt
        that counted nothing."""
        # A delta memcached cannot count by is refused before anything is stamped, and
        # alike whichever tier would count (an outage's count on disk included).
        line = count_line(key, delta)
        self._follow_files()
        node = self.cluster.node_index(key)
        if bumped is None:
            bumped = []
        for _attempt in range(attempts):
            strict = False
            epoch = self.states.epoch(node)
            if not epoch & 1:  # up
                try:
                    count = await self._incr_up(client, key, delta, line, bumped, node, epoch)
                except _WentOutBeforeSending:
                    pass  # nothing sent: counted on disk like any write of an outage
                except _StubStayed:
                    # Not a miss (get answers the disk's counter), and not counted: the
                    # caller may count again.
                    raise OutcomeUnknownError(
                        f"the increment of {key.decode(errors='replace')!r} was not made: "
                        "memcached kept the key's lease stub through every try"
                    ) from None
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                    strict = _may_have_run(exc)
                else:
                    # memcached's count stands when the node did not go out meanwhile, or
                    # no other write of the slot was stamped since this one (the count is
                    # then this increment's alone, and its key was not journaled). Else it
                    # may include an increment made on disk instead (see went_out), or
                    # have been deleted by a replay since: unknown. (memcached's "not
                    # found" counted nothing: counted on disk instead.)
                    if self.states.epoch(node) == epoch or self._slot_still(key, bumped):
                        if count is None:
                            return None
                        value, ttl, now = count
                        self._queue(key, bumped[1], b"%d" % value, FLAG_INTEGER, ttl, now)
                        return value
                    if count is not None:
                        raise _outcome_unknown(key)
            done, result = self._incr_out(node, key, delta, bumped, strict)
            if done:
                return result
        return None

    def incr_now(self, key: bytes, delta: int) -> int | None:
        """:meth:`incr` on the blocking client, as a plain call (the sync API's flat path;
        ``key`` is valid and ``delta`` an int within memcached's range, as the backend's
        are): the first attempt, line for line as :meth:`incr` and :meth:`_incr_up` make
        it, while memcached holds the counter (or, on a node without meta, with memcached's
        ``incr``), or when the key is missing in both tiers. Any other outcome that counted
        nothing (a miss the disk holds the counter for, a stub or a value that is not a
        number) goes on in :meth:`incr` from this attempt's stamp; a failure as
        :meth:`incr`'s does."""
        if type(delta) is not int or not -_UINT64_MAX <= delta <= _UINT64_MAX:
            return run_blocking(self.incr(self.blocking, key, delta))  # (checked there)
        if _monotonic() >= self._files_due:  # (_follow_files, inline: the flat path)
            self._follow_files()
        node = self.cluster.node_index(key)
        bumped: list[int] = []
        strict = False
        epoch = self.states.epoch(node)
        if not epoch & 1:  # up
            stamps = self.stamps
            slot = slot_of(key)  # (found once: one call reads and stamps the slot)
            prev, stamp = stamps.replace_slot(slot)
            bumped = [prev, stamp]
            if self.states.epoch(node) == epoch:  # (else: _WentOutBeforeSending)
                now = _now()
                count: tuple[int, int | None] | None = None
                failed = False
                # memcached's "not found": the disk's entry under the stamp before this
                # one may hold the counter (True), or, on a node without meta, nothing is
                # looked up (None), as _incr_up makes its first try.
                not_found: bool | None = False
                try:
                    try:
                        count = self.blocking.count_at(node, key, delta)
                        not_found = count is None
                    except MetaUnsupportedError:
                        # No meta: memcached's incr, and no TTL to copy (a TTL of 0 queues a
                        # delete: the key misses on disk), as _incr_up does.
                        counted = self.blocking.incr_now(key, delta, True)
                        count = None if counted is None else (counted, 0)
                        not_found = None if counted is None else False
                except CommandError:
                    pass  # counted nothing: incr reads what holds the key (below)
                except FastCacheError as exc:
                    self._memcached_failed(node, exc, read=False)
                    strict = _may_have_run(exc)
                    failed = True
                if count is not None:
                    if self.states.epoch(node) == epoch or stamps.current_slot(slot) == stamp:
                        value, seconds = count
                        if seconds == 0:  # expires now: the disk copy is a delete
                            self._queue(key, stamp, None, FLAG_INTEGER, 0.0, now)
                        elif stamps.current_slot(slot) == stamp:
                            # The disk copy (_queue and _behind, inline: the flat path).
                            expire_at = None if seconds is None or seconds < 0 else now + seconds
                            data = b"%d" % value
                            self.behind.put(key, slot, stamp, data, FLAG_INTEGER, expire_at, now)
                        else:
                            stamps.bump_slot(slot, gone=True)
                        return value
                    raise _outcome_unknown(key)
                if not_found is not False and (
                    not_found is None or self._on_disk(key, prev) is None
                ):
                    # Missing in both tiers, settled as incr settles it: unless the node
                    # went out and the slot moved on meanwhile (then counted on disk).
                    if self.states.epoch(node) == epoch or stamps.current_slot(slot) == stamp:
                        return None
                elif not failed:
                    # Counted nothing (a stub, not a number, or memcached lost a counter the
                    # disk holds): the disk's entry may hold the counter, or a value may be
                    # on its way back: incr's attempt, from this stamp.
                    return run_blocking(self.incr(self.blocking, key, delta, bumped))
        done, result = self._incr_out(node, key, delta, bumped, strict)
        if done:
            return result
        return run_blocking(self.incr(self.blocking, key, delta, bumped, _MAX_RETRIES - 1))

    def _incr_out(
        self, node: int, key: bytes, delta: int, bumped: list[int], strict: bool
    ) -> tuple[bool, int | None]:
        """The increment counted on disk while ``node`` is out (:meth:`_out`): ``(False,
        None)`` when the node came back meanwhile, for another attempt on memcached, unless
        ``strict`` (the attempt may have counted: another might count it twice), which
        raises :class:`OutcomeUnknownError` instead."""
        done, result = self._out(
            node, key, functools.partial(self._incr_on_disk, key, delta, bumped, strict), None
        )
        if not done and strict:
            raise _outcome_unknown(key)
        return done, result

    def _slot_still(self, key: bytes, bumped: list[int]) -> bool:
        """Whether the key's slot still holds the stamp this write gave it (bumped = [before,
        after]): no other write or delete of the slot was stamped since."""
        return bool(bumped) and self.stamps.current(key) == bumped[1]

    async def _incr_up(
        self,
        client: CommandSet,
        key: bytes,
        delta: int,
        line: bytes,
        bumped: list[int],
        node: int,
        epoch: int,
    ) -> tuple[int, float | None, float] | None:
        """memcached's count (``line``: its ``ma``, :func:`count_line`), its TTL and the
        time it was asked (its disk copy not yet queued: the caller checks the node first),
        or None when the key is missing.

        :class:`_WentOutBeforeSending` when ``node``'s epoch moved from ``epoch`` before
        the key was stamped: a write made on disk in the outage may be stamped before this
        increment's, where the check after the reply (:meth:`_slot_still`) cannot see it,
        and memcached would count on a value older than it."""
        prev = self._before(key, bumped)
        stamp = self.stamps.bump(key)
        bumped[:] = [prev, stamp]
        if self.states.epoch(node) != epoch:
            raise _WentOutBeforeSending
        entry: DiskEntry | None = None
        refused_digits = False
        recounts = RECOUNT_TRIES
        for _try in range(_STUB_TRIES):
            now = _now()
            count: tuple[int, int | None] | None
            try:
                count = counted(await client.meta_line(node, line))
            except MetaUnsupportedError:
                try:
                    value = await (
                        client.decr(key, -delta) if delta < 0 else client.incr(key, delta)
                    )
                except CommandError as refused:
                    # Not a number: memcached kept its value, the disk its copy.
                    kept = await client.get(key)
                    if kept is not None:
                        self._copy_again(key, prev, bumped, kept.value, kept.flags)
                    raise refused  # (named: see _stored_under)
                # No TTL to copy: a TTL of 0 queues a delete (the key misses on disk).
                return None if value is None else (value, 0.0, now)
            except CommandError as refusal:
                recount = await _recount(client, node, key, delta, refusal)
                if recount is not None:  # a counter memcached misread, counted here
                    if recount.value is not None:
                        return recount.value, _seconds_left(recount.ttl), now
                    recounts -= 1  # it changed meanwhile: count again, as the client would
                    if not recounts:
                        raise refusal
                    continue
                held = await client.get(key)
                if held is not None and not _is_stub(held.value, held.flags):
                    # Not a number; or digits refused twice: memcached's own reason (digits
                    # beyond 2**64 - 1), not a stub replaced meanwhile.
                    # (Named, not a bare raise: see _stored_under.)
                    if not held.value.strip().isdigit() or refused_digits:
                        # memcached kept its value, so the disk keeps its copy.
                        self._copy_again(key, prev, bumped, held.value, held.flags)
                        raise refusal
                    refused_digits = True
                    continue  # a stub then, replaced by its value since: count again
                count = None  # a stub: the value is missing, or on its way back from disk
            if count is not None:
                number, seconds = count
                return number, _seconds_left(seconds), now
            if entry is None:
                entry = self._on_disk(key, prev)
                if entry is None:
                    return None  # missing in both tiers
            # memcached lost the counter, the disk has it: put it back, and count on it.
            # Over another caller's stub too: get answers the disk's value meanwhile, and a
            # stub nobody gives back would leave this incr nothing to count on.
            restored = DiskEntry(entry.data, entry.flags, entry.written_at, entry.expire_at, stamp)
            if not await self._refill(client, key, restored, take_over=True):
                await _pause(client, _STUB_PAUSE)  # a value now, or raced by a write: again
        if entry is not None and self._slot_still(key, bumped):
            # Counted nothing, and the key's value is still the disk's: its copy answers
            # again under this stamp (which hides it) rather than the counter going missing.
            self._behind(key, stamp, entry.data, entry.flags, entry.expire_at, entry.written_at)
            raise _StubStayed
        return None

    def _copy_again(
        self, key: bytes, prev: int, bumped: list[int], data: bytes, flags: int
    ) -> None:
        """An increment memcached refused (its value not a number) changed nothing there,
        but its stamp hid the key's disk copy: queue that copy again under the increment's
        stamp when it holds what memcached still does, while no other write of the slot
        was stamped since (as every write's copy is queued: :meth:`_behind`). A copy that
        had not landed yet stays hidden: the key misses on disk once memcached loses it."""
        if not self._slot_still(key, bumped):
            return
        entry = self._on_disk(key, prev)
        if entry is not None and entry.data == data and entry.flags == flags:
            self._behind(key, bumped[1], entry.data, entry.flags, entry.expire_at, entry.written_at)

    def _incr_on_disk(
        self, key: bytes, delta: int, bumped: list[int], strict: bool = False
    ) -> int | None:
        """Count on the disk's entry (while the node is out, journaled). ``strict``: the
        attempt on memcached may have counted (see :meth:`incr`)."""
        if strict:
            entry = self._on_disk(key, bumped[0]) if self._slot_still(key, bumped) else None
            if entry is None:
                raise _outcome_unknown(key)
        else:
            entry = self._on_disk(key, self._base(key, bumped))
        if entry is None:
            return None
        if entry.flags != FLAG_INTEGER:
            raise NonIntegerValueError(f"the value of {key.decode()!r} is not an integer")
        current = int(entry.data)
        value = counted_by_memcacheds_rules(current, delta)
        self._write_now(key, b"%d" % value, entry.flags, entry.expire_at)
        return value

    async def clear(self, client: CommandSet) -> None:
        self._follow_files()
        # Every stamp forgotten first: no entry answers, and no write queued before the
        # clear lands after it.
        self.stamps.reset()
        self.copies.clear()  # (none answers any more: their memory goes)
        out = [n for n in range(len(self.cluster)) if self.states.is_out(n)]
        up = [n for n in range(len(self.cluster)) if n not in out]
        # A failure that is not the node's (this process's own, or memcached's reply) is
        # raised once every other node and the disk are cleared.
        refused: FastCacheError | None = None
        if up:
            # Each node's outcome at once: a failed node is not asked again (a hung one
            # would cost a timeout more), and is journaled below once marked out.
            for node, exc in (await client.flush_all_by_node(up)).items():
                try:
                    self._memcached_failed(node, exc, read=False)
                except FastCacheError as raised:
                    refused = refused or raised
                else:
                    out.append(node)
        for node in out:
            for _attempt in range(_MAX_RETRIES):
                try:
                    done, _nothing = self._journaled(node, [FLUSH_MARK], lambda: None)
                except DiskError:
                    break  # not journaled: the node states ask its replay for the flush
                if done:
                    break
                # Brought back meanwhile: flushed now, as it was up all along.
                try:
                    await client.flush_all(nodes=[node])
                    break
                except FastCacheError as exc:
                    # Asked in the node states first (it cannot fail): whatever the next
                    # attempt finds, the node's replay flushes it.
                    self.states.must_flush(node)
                    try:
                        self._memcached_failed(node, exc, read=False)  # out: journaled next
                    except FastCacheError as raised:
                        refused = refused or raised
                        break  # still up here: the flush asked for waits for its outage
        try:
            self.disk.clear()
        except DiskError as exc:
            self._disk_failed(None, exc)
            self.states.distrust(None, _now())  # every entry is now out of date
        if refused is not None:
            raise refused

    # -- bringing a node back ------------------------------------------------------------
    def bring_back(self, node: int) -> int | None:
        """Replay ``node``'s journal as deletes and mark it up; the keys deleted (0 when
        the node was flushed whole instead), or None
        when this call did not bring it back: still unreachable, or brought back by another
        process meanwhile. Called by the maintenance thread, never on a request."""
        node_id = self.cluster.node_ids[node]
        outage = self.states.outages(node)
        try:
            run_blocking(self.blocking.version(nodes=[node]))
            # Requests that timed out while the node hung may still sit in its sockets and
            # run now that it answers again, on other memcached threads, in any order with
            # ours: let them land first, so that the replay's deletes come after them.
            # (Connections that failed were reset, so nothing of theirs is still unsent.)
            time.sleep(self.replay_settle)
            with self.journal.transaction() as connection:
                if not self.states.is_out(node):
                    return None  # brought back by another process: it says so
                if self.states.replaced():
                    # Its files were replaced and the new ones could not be mapped (the
                    # transaction's check tried): marking the node up on the old pages
                    # would leave the processes on the new ones journaling its keys while
                    # this one reads memcached. Probe again once it could move.
                    self.last_probe_error[node] = "the node states could not be followed"
                    return None
                if self.states.outages(node) != outage:
                    # Brought back by another process and out again while this waited:
                    # the probe answered before this outage, whose timed-out requests
                    # may still be on their way. Probe again.
                    self.last_probe_error[node] = "went out again during the replay's wait"
                    return None
                keys = Journal.keys(connection, node_id)
                unjournaled = self.states.flush_needed(node)
                # The outage's writes went to a journal removed since, which no process
                # carried over: what it named is lost.
                lost = self.states.journal_of(node) not in (0, self.journal.id)
                if FLUSH_MARK in keys or unjournaled or lost:
                    self.states.flushing(node)  # (first: a request made meanwhile stays)
                    try:
                        run_blocking(self.blocking.flush_all(nodes=[node]))
                    except BaseException:
                        # Still to do, at the next replay (the request taken above, or one
                        # made since, would be lost with the flush that did not happen).
                        self.states.must_flush(node)
                        raise
                    self.states.flush_done(node)
                elif keys:
                    # At the node, wherever this process routes them: the processes that
                    # journaled them may route by another node list (a deploy's).
                    run_blocking(self.blocking.delete_many_at(node, keys))
                Journal.forget(connection, node_id)
                self.states.mark_up(node)
                if self._out_again_if_unjournaled(node) or self._out_again_if_moved(node):
                    return None
        except DiskError as journal_error:
            # The journal cannot be read (its directory removed, its file corrupt, locked
            # for good): any key may have changed while the node was out, so the node is
            # flushed whole instead. (A write the journal could not take was not kept on
            # disk either: its entry no longer answers.) Otherwise the node stays out for
            # good, and memcached is never used again.
            if self.states.outages(node) != outage:
                return None  # out again meanwhile (see above): probe again
            self.states.flushing(node)
            try:
                run_blocking(self.blocking.flush_all(nodes=[node]))
            except BaseException as exc:
                self.states.must_flush(node)  # (whatever it held: flushed the next time)
                if not isinstance(exc, FastCacheError):
                    raise
                self.last_probe_error[node] = _describe(exc)
                return None
            self.states.flush_done(node)
            self.states.mark_up(node)
            if self._out_again_if_unjournaled(node):
                return None
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
                "flushed it, as a clear() was journaled while it was out"
                if FLUSH_MARK in keys
                else "flushed it, as a write made while it was out could not be journaled"
                if unjournaled
                else "flushed it, as the outage journal its writes went to was removed"
                if lost
                else f"replayed {len(keys)} journaled key(s) as deletes",
            )
        self.last_probe_error.pop(node, None)
        self.metrics.replays += 1
        # Keys deleted one by one: none where the node was flushed whole instead (the
        # journal then holds the flush's mark, or keys it did not need to delete).
        replayed = 0 if not keys or FLUSH_MARK in keys or unjournaled or lost else len(keys)
        self.metrics.replayed_keys += replayed
        return replayed

    def _out_again_if_moved(self, node: int) -> bool:
        """Just marked up: the journal this replay read was removed meanwhile, and a
        process that opened the file now at its path may have journaled keys of ``node``
        there, under that file's lock, not this one's, having found the node out before
        it was marked up. Out again, then (True): the next replay reads that file. (A
        write journaled there after the node was marked up marks it out itself: see
        :meth:`_journaled`.)"""
        if not self.journal.replaced():
            return False
        self.node_failed(
            node,
            DiskError(
                "the outage journal was removed during the node's replay; it is replayed "
                "again from the journal now at its path"
            ),
        )
        self.last_probe_error[node] = "the outage journal was removed during the replay"
        return True

    def _out_again_if_unjournaled(self, node: int) -> bool:
        """Just marked up: a write that could not be journaled while ``node`` was out may
        have asked for a flush after the replay looked (it asks before it reads the node's
        state; this reads the request after marking the node up). Out again, then (True):
        the next replay flushes it."""
        if not self.states.flush_needed(node):
            return False
        self.node_failed(
            node,
            DiskError(
                "a write made while the node was out could not be journaled during its "
                "replay; it is flushed whole at the next one"
            ),
        )
        self.last_probe_error[node] = "a write could not be journaled during the replay"
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the writes this process queued so far are on disk (or skipped);
        False when ``timeout`` ran out first."""
        return self.behind.flush(timeout)

    def close(self) -> None:
        """Land the queued writes (briefly) and close the disk tier's SQLite connections
        (they reopen on the next use)."""
        self.behind.flush(1.0)
        self.disk.close()
        self.journal.close()

    def discard(self) -> None:
        """:meth:`close`, for a store no call will use again (a test's): the writer's
        thread ends too, once it landed the queue, so that it no longer keeps the store
        alive, with its mapped tables (8 MiB of write stamps each). Unregister it from
        the maintenance thread first."""
        self.behind.stop(1.0)
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
        behind = self.behind
        return {
            "directory": self.directory,
            "nodes": nodes,
            "fallbacks": metrics.fallbacks,
            "disk_hits": metrics.disk_hits,
            "refills": metrics.refills,
            "leased_stores": metrics.leased_stores,
            "disk_failures": metrics.disk_failures,
            "journaled": metrics.journaled,
            "replays": metrics.replays,
            "replayed_keys": metrics.replayed_keys,
            "nodes_marked_out": metrics.nodes_marked_out,
            "local_failures": metrics.local_failures,
            "write_queue": len(behind),
            "write_lag": behind.lag(),
            "writes_landed": behind.landed,
            "writes_skipped": behind.skipped,
            "writes_dropped": behind.dropped + behind.failed,
            "read_copies": len(self.copies),
            "read_copies_bytes": self.copies.size,
        }


def _touch_read(key: bytes, exptime: int) -> bytes:
    """The ``mg`` line of a touch (of a valid key) that reads the value it touches, for its
    disk copy's new expiry: value, client flags and CAS, and the new exptime."""
    return b"mg %s v c f T%d\r\n" % (key, exptime)


def _outcome(reply: MetaReply | FastCacheError) -> MetaReply:
    """A request's outcome, made elsewhere: its reply, or its error raised here."""
    if isinstance(reply, FastCacheError):
        raise reply
    return reply


async def _give_back(client: CommandSet, key: bytes, held: MetaReply | None) -> None:
    """A read of a stale item took its win (memcached hands it to the first ``mg``): mark
    it stale again (``md … I C<cas>``, keeping its TTL) so that get_or_set's next caller
    wins."""
    if held is not None and held.stale and held.win:
        await let_go(client, client.meta_delete(key, cas=held.cas, invalidate=True))


async def _stored_under(
    client: CommandSet, key: bytes, lease: MetaReply, store: Coroutine[Any, Any, MetaReply]
) -> MetaReply:
    """``store``, the ``ms … C<cas>`` of ``lease``'s holder. Cancelled meanwhile, the store
    may never have reached memcached: a stub this caller won is given back (deleted under
    its CAS, which fails if the store did land), as a refill that finds the key written
    gives it back, so that it does not read as a miss until it expires (a stale value's
    win is marked stale again, as :func:`_give_back` does)."""
    try:
        return await store
    except asyncio.CancelledError as cancelled:
        if lease.win:
            await let_go(client, client.meta_delete(key, cas=lease.cas, invalidate=lease.stale))
        # Named, not a bare raise: compiled, the exception being handled is not kept
        # across the await above.
        raise cancelled


async def _pause(client: CommandSet, seconds: float) -> None:
    """Wait a moment: the calling thread sleeps on the blocking client (whose coroutines
    never suspend), the event loop on the asyncio one."""
    if isinstance(client, BlockingClient):
        time.sleep(seconds)  # noqa: ASYNC251 - run by the sync bridge, never on a loop
    else:
        await asyncio.sleep(seconds)


class _Attempts:
    """A write's attempts on memcached from the first that may have run (one that timed
    out, say): the stamp of the latest, and whether another write stamped the key's slot
    between two of them."""

    __slots__ = ("foreign", "latest")

    def __init__(self, latest: int) -> None:
        self.latest = latest
        self.foreign = False

    @staticmethod
    def after(ran: _Attempts | None, stamp: int, error: BaseException) -> _Attempts | None:
        """``ran`` once the attempt stamped ``stamp`` failed with ``error`` (None while no
        attempt may have run)."""
        if ran is not None:
            ran.latest = stamp
            return ran
        return _Attempts(stamp) if _may_have_run(error) else None

    def followed(self, before: int) -> None:
        """The next attempt stamped the slot over ``before``."""
        if before != self.latest:
            self.foreign = True

    def overtaken(self, current: int) -> bool:
        """Whether another write stamped the slot since the first attempt that may have
        run, the slot's stamp being ``current``."""
        return self.foreign or current != self.latest


class _WentOutBeforeSending(Exception):
    """An increment's node went out between its state read and its stamp (see _incr_up)."""


class _StubStayed(Exception):
    """An increment found memcached's key a stub on every try, while the disk held its
    counter (see _incr_up): nothing was counted."""


def _outcome_unknown(key: bytes, what: str = "increment") -> OutcomeUnknownError:
    return OutcomeUnknownError(
        f"the {what} of {key.decode(errors='replace')!r} may have been made by memcached "
        f"when its node failed, and the disk tier cannot make it alike (another write of the "
        "key ran meanwhile, the disk had not caught up, or the node came back meanwhile): it "
        "may have taken effect"
    )


def _may_have_run(error: BaseException) -> bool:
    """Whether a request that failed with ``error`` may have reached memcached and run: a
    timeout, a lost connection, a reply that did not parse, a TLS session that broke (a
    :class:`TLSError` also comes from an established connection, after a request went
    out). Not a connection that could not be opened in time (:class:`ConnectFailedError`,
    :class:`ConnectTimeoutError` among them), or that memcached refused: nothing was
    sent."""
    if isinstance(error, TLSError):
        return True
    return isinstance(error, (NetworkError, ProtocolError)) and not isinstance(
        error, (ConnectFailedError, ServerRefusedConnectionError, LocalResourceError)
    )


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "no detail"
    return f"{type(error).__name__}: {error}"
