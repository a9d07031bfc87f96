"""The writer behind memcached: the disk copies of acknowledged writes, in group commits.

A write or delete made while its node is up is acknowledged once memcached has it; its
disk copy goes into this process's queue (a deque append, no lock, no disk: one bytes
object, see :func:`record`) and a
background thread lands the copies once they are ``min_age`` seconds old, every
``interval`` seconds (the first time a random part of ``interval`` later: see ``_run``), in
one transaction per disk shard (:meth:`DiskStore.land`). A write
lands only while its stamp is still its slot's current one (:mod:`.stamps`), so a write
overtaken meanwhile, from this process or another, is skipped; and until a write lands, the
older entry of its key no longer answers (its stamp was replaced before the write was
acknowledged). So the disk tier's lag shows as misses, never as old values. A queue lost
with its process (killed) leaves those keys missing on disk; nothing older comes back.

The thread is started on first need, and again in a forked child, which inherits neither
the thread nor the parent's queue (the parent lands its own writes).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import math
import os
import random
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from ..handles import Handle
from .stamps import WriteStamps
from .store import YIELD_EVERY, DiskError, DiskStore, Landing, LandingError, _yield_gil

#: Seconds a write waits in the queue before it lands (unless a flush asks for it sooner;
#: the backend's ``disk_write_delay`` option). Most of the writer's CPU goes to the rows it
#: lands, and a write overtaken before its landing, by a newer write of its key from any
#: process, is skipped without a statement: at cachebench's pace (8 processes writing
#: 1,100 keys, 100,000 operations each) one write in five or six landed when writes landed
#: at the next commit, one in about thirty once each waited a second, for half the
#: writer's CPU. Three seconds lowered the tiered row's P99s by a further 4 to 7 % in
#: paired runs (docs/tier-rounds.md, fourteenth round). A longer lag only means more misses
#: on disk (after a crash, at an outage's start), never older values, and a queue that
#: holds the copies of that many seconds of writes.
MIN_AGE = 3.0
#: Seconds between group commits while writes keep coming: a write lands between MIN_AGE
#: and MIN_AGE + INTERVAL after it was made. A commit costs about as much for one write as
#: for a hundred (one transaction per shard), and more when other processes committed to
#: the same shards meanwhile (each transaction then reads again what they changed).
INTERVAL = 1.0
#: Writes of one landing, at most: a burst lands in batches of this many, one after
#: another (the batch's Python work stays short).
BATCH: Final = 1000
#: Writes a queue may hold; past it new ones are not queued (their keys miss on disk).
MAX_QUEUE = 100_000
#: Seconds the process's exit waits for its queues to land.
EXIT_WAIT = 2.0

#: A queued write's fields before its key and value (see :func:`record`): stamp, the key's
#: stamp slot, the key's length, expiry (NaN: never), when it was written, flags, whether
#: it holds a value.
_HEAD: Final = struct.Struct("=QIIddIB")
_HEAD_SIZE: Final = _HEAD.size
#: Bound once: compiled, ``_HEAD.pack(...)`` looks the method up on every write.
_pack_head: Final = _HEAD.pack
#: A record's first fields: what the writer needs to tell whether it was overtaken.
_STAMP_AND_SLOT: Final = struct.Struct("=QI")
#: Where ``written_at`` lies in a record.
_WRITTEN_AT: Final = struct.Struct("=d")
_WRITTEN_AT_OFFSET: Final = 24
_NEVER: Final = math.nan


def record(
    key: bytes,
    slot: int,
    stamp: int,
    data: bytes | None,
    flags: int,
    expire_at: float | None,
    written_at: float,
) -> bytes:
    """A write as queued: its fields, key and value in one bytes object. Not a tuple: the
    garbage collector counts every container made and not yet freed, and queued tuples,
    which live seconds, set off a collection every 700 writes and were promoted to the older
    generations, where they set off full collections of the whole process (one per process
    under bench/writer_eight.py's eight, none untiered; tens of milliseconds each): about
    4,600 instructions a write on average, a third of a sync set's own. A bytes object is
    not counted. The value is copied once, which costs less than its seal did. ``slot``:
    the key's stamp slot (:func:`.stamps.slot_of`), which the request found already: the
    writer reads a record's stamp slot without hashing its key again."""
    head = _pack_head(
        stamp,
        slot,
        len(key),
        _NEVER if expire_at is None else expire_at,
        written_at,
        flags,
        data is not None,
    )
    if data is None:
        return head + key
    return head + key + data


def landing(item: bytes) -> Landing:
    """The write a :func:`record` holds."""
    stamp, _slot, length, expire_at, written_at, flags, has_data = _HEAD.unpack_from(item)
    end = _HEAD_SIZE + length
    return (
        item[_HEAD_SIZE:end],
        stamp,
        item[end:] if has_data else None,
        flags,
        None if math.isnan(expire_at) else expire_at,
        written_at,
    )


def still_current(item: bytes, words: memoryview) -> bool:
    """Whether the write a :func:`record` holds still has its slot's stamp in ``words``
    (the table's, :meth:`.WriteStamps.words_now`), read without decoding the rest."""
    stamp: int
    slot: int
    stamp, slot = _STAMP_AND_SLOT.unpack_from(item)
    stamped: int = words[slot]
    return stamped == stamp


def _written_at(item: bytes) -> float:
    written_at: float = _WRITTEN_AT.unpack_from(item, _WRITTEN_AT_OFFSET)[0]
    return written_at


#: The process's writers, for a forked child and the exit: weakly, through handles they hold
#: (a compiled writer has no weak reference).
_queues: weakref.WeakSet[Handle[WriteBehind]] = weakref.WeakSet()


class WriteBehind:
    def __init__(
        self,
        disk: DiskStore,
        stamps: WriteStamps,
        *,
        interval: float = INTERVAL,
        min_age: float = MIN_AGE,
        max_queue: int = MAX_QUEUE,
        on_failure: Callable[[DiskError, int], None] | None = None,
    ) -> None:
        self.disk = disk
        self.stamps = stamps
        self.interval = interval
        self.min_age = min_age
        self.max_queue = max_queue
        self._on_failure = on_failure
        #: Counters of this process: writes landed, skipped (overtaken), not queued (the
        #: queue was full), lost to a failed commit.
        self.landed = 0
        self.skipped = 0
        self.dropped = 0
        self.failed = 0
        #: While True the writer lands nothing (tests hold it to keep writes queued).
        self.paused = False
        self._fresh_state()
        self.handle = Handle(self)
        _queues.add(self.handle)

    def _fresh_state(self) -> None:
        #: Writes (:func:`record`) and the markers of flush() calls, in order.
        self._queue: collections.deque[bytes | threading.Event] = collections.deque()
        self._idle = True
        self._wake = threading.Event()
        #: flush() calls waiting: while any does, the writer lands all it finds queued,
        #: whatever the writes' age.
        self._flushes = 0
        self._flushes_lock = threading.Lock()
        self._start_lock = threading.Lock()
        # Held while a batch lands, so that pause() returns only between batches.
        self._batch_lock = threading.Lock()
        self._writer_thread: threading.Thread | None = None
        # Set by stop(): the thread ends once the queue is empty.
        self._stopping = False

    # -- the request path ----------------------------------------------------------------
    def put(
        self,
        key: bytes,
        slot: int,
        stamp: int,
        data: bytes | None,
        flags: int,
        expire_at: float | None,
        written_at: float,
    ) -> None:
        """Queue the disk copy of a write (``data`` None: a delete) stamped ``stamp`` in
        ``slot``, the key's (:func:`.stamps.slot_of`)."""
        queue = self._queue
        if len(queue) >= self.max_queue:
            self.dropped += 1
            return
        queue.append(record(key, slot, stamp, data, flags, expire_at, written_at))
        if self._idle:
            self._notify()

    def _notify(self) -> None:
        self._idle = False
        thread = self._writer_thread
        if thread is None or not thread.is_alive():
            with self._start_lock:
                if self._writer_thread is None or not self._writer_thread.is_alive():
                    self._stopping = False
                    self._writer_thread = threading.Thread(
                        target=self._run, name="fastcache-write-behind", daemon=True
                    )
                    self._writer_thread.start()
        self._wake.set()

    # -- state ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._queue)

    def lag(self) -> float:
        """Seconds the oldest queued write has waited (0.0 when the queue is empty)."""
        for item in list(self._queue):
            if isinstance(item, bytes):
                return max(0.0, time.time() - _written_at(item))
        return 0.0

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every write queued before this call has landed (or been skipped);
        False when ``timeout`` ran out first."""
        done = threading.Event()
        with self._flushes_lock:
            self._flushes += 1
        self._queue.append(done)
        self._notify()
        return done.wait(timeout)

    def stop(self, timeout: float = EXIT_WAIT) -> bool:
        """Land what is queued, then end the writer's thread: for a writer no call will use
        again (a test's store), which the thread would otherwise keep alive, with the
        store's mapped tables, for the rest of the process. A write queued afterwards
        starts a thread again. False when ``timeout`` ran out first."""
        deadline = time.monotonic() + timeout
        landed = self.flush(timeout)
        thread = self._writer_thread
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        if self._queue:  # queued while it was ending: landed by a thread of its own
            self._notify()
        return landed

    def pause(self) -> None:
        """Land nothing queued from now until :meth:`resume` (writes keep being queued)."""
        with self._batch_lock:
            self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._notify()

    # -- the writer ----------------------------------------------------------------------
    def _run(self) -> None:
        _batch_class()
        queue = self._queue
        # Until the thread's first landing, a write waits a random part of the interval
        # more than its minimum age: processes started together (a prefork server's
        # workers, their first writes at once) would otherwise land together, once an
        # interval, for as long as writes keep coming, each landing taking CPUs from the
        # others' requests at the same moment. Staggered once, they stay apart. (Within
        # the bound on lag: a write lands by min_age + interval after it was made.)
        phase = random.uniform(0.0, self.interval)
        while True:
            if self.paused or not queue:
                self._idle = True
                if self._stopping and not queue:
                    return
                if queue and not self.paused:
                    self._idle = False  # queued while going idle: not woken for it
                    continue
                self._wake.wait()
                self._wake.clear()
                continue
            self._wake.clear()  # before looking: a flush() made from now on ends the waits
            if not self._landing_all():
                young = self._seconds_to_age(queue)
                if young > 0:
                    self._wake.wait(young + phase)
                    continue
            phase = 0.0
            with self._batch_lock:
                more = False if self.paused else self._land_batch(queue)
            # Let writes gather for a group commit, unless more are due already (a burst's
            # next batch) or a flush() waits.
            if not more and not self._landing_all():
                self._wake.wait(self.interval)

    def _landing_all(self) -> bool:
        """Whether every queued write is due, whatever its age: a flush() waits, or the
        thread is to end."""
        return bool(self._flushes) or self._stopping

    def _seconds_to_age(self, queue: collections.deque[bytes | threading.Event]) -> float:
        """Seconds until the oldest queued write is ``min_age`` old (0.0: due now)."""
        head = queue[0]
        if not isinstance(head, bytes):
            return 0.0
        now = time.time()
        written_at = _written_at(head)
        if written_at > now:
            return 0.0  # written "later" than now: the wall clock was set back; due
        return written_at + self.min_age - now

    def _land_batch(self, queue: collections.deque[bytes | threading.Event]) -> bool:
        """Land the writes due: all queued while a flush() waits, else up to BATCH of those
        ``min_age`` old. True when more are due at once."""
        records: list[bytes] = []
        waiters: list[threading.Event] = []
        if self._landing_all():
            for _ in range(len(queue)):
                item = queue.popleft()
                if isinstance(item, bytes):
                    records.append(item)
                else:
                    waiters.append(item)
        else:
            now = time.time()
            due = now - self.min_age
            while queue and len(records) < BATCH:
                item = queue[0]
                if isinstance(item, bytes):
                    # (Written "later" than now: the wall clock was set back. Due.)
                    if due < _written_at(item) <= now:
                        break
                    records.append(item)
                else:
                    # A flush() queued meanwhile: every write queued before it is here.
                    waiters.append(item)
                queue.popleft()
        writes = self._still_current(records)
        if writes:
            try:
                landed, skipped = self.disk.land(writes, self.stamps.current)
            except DiskError as exc:
                # Their stamps are in place, so the entries they were to replace no longer
                # answer: lost writes miss. (Those of the shards that did not fail landed.)
                lost = len(writes)
                if isinstance(exc, LandingError):
                    lost = exc.failed
                    self.landed += exc.landed
                    self.skipped += exc.skipped
                self.failed += lost
                if self._on_failure is not None:
                    with contextlib.suppress(Exception):
                        self._on_failure(exc, lost)
            except Exception:  # the thread must go on, whatever one batch did
                self.failed += len(writes)
            else:
                self.landed += landed
                self.skipped += skipped
        for waiter in waiters:
            waiter.set()
        if waiters:
            with self._flushes_lock:
                self._flushes -= len(waiters)
        return bool(queue) and not self._landing_all() and self._seconds_to_age(queue) <= 0

    def _still_current(self, records: list[bytes]) -> list[Landing]:
        """The writes of ``records`` whose stamp is still their slot's, decoded; the others,
        overtaken by a newer write or delete of their slot (most of them, when several
        processes write the same keys), are counted skipped without being decoded. The
        table is checked once for the batch: should the process follow another table
        meanwhile (its directory made again), the check lets through writes the landing
        skips (it checks each write again, as it lands) or skips writes that would have
        landed (misses on disk, never older values). The interpreter's lock is handed over
        every YIELD_EVERY records, as the landing does."""
        words = self.stamps.words_now()
        writes: list[Landing] = []
        if words is not None:  # (else no slot has a stamp to land under now)
            for done, item in enumerate(records, 1):
                if still_current(item, words):
                    writes.append(landing(item))
                if not done % YIELD_EVERY:
                    _yield_gil()
        self.skipped += len(records) - len(writes)
        return writes


def _batch_class() -> None:
    """Put the calling thread (the writer) in Linux's batch scheduling class: it keeps its
    share of the CPU, but its wake-ups no longer preempt a running thread. Under load the
    writer's landings otherwise take CPUs from request threads the moment they start (every
    process's writer at once, when the processes started together), and the requests
    running then make up a third of cachebench's slowest percent. Elsewhere (no such class,
    or refused) the thread runs as it is."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, policy, os.sched_param(0))


def _after_fork_in_child() -> None:
    for handle in list(_queues):
        writer = handle.target
        writer.paused = False
        writer._fresh_state()


def _land_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT
    for handle in list(_queues):
        writer = handle.target
        # Not idle: a batch may be landing, taken off the queue already (the flush lands
        # behind it).
        if (writer._queue or not writer._idle) and not writer.paused:
            writer.flush(max(0.0, deadline - time.monotonic()))


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_land_at_exit)
