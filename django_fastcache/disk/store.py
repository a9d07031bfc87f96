"""The disk tier's values: a thin layer over diskcache's sharded ``FanoutCache``.

Values are stored as the bytes memcached would hold, behind a small header (flags and the
time of the write), so nothing is serialized twice and a refill of memcached sends exactly
what a set would have sent. Every failure of SQLite or the file system surfaces as
:class:`DiskError`; the caller decides what a failure means for consistency.

Set-up choices, each to keep a write cheap on the request path:

* ``cull_limit=0``: no eviction work inside a write; the tier's maintenance thread culls.
* ``sqlite_synchronous=0``: commits reach the OS, not the platter. A process crash loses
  nothing; a power cut may lose recent cache entries (the outage journal is kept apart,
  with its own durability).
* Operations go to the shard's ``Cache`` directly, because ``FanoutCache`` turns lock
  timeouts into silent misses and failed writes, which the tiers cannot afford.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import diskcache

from ..client import forksafe
from ..errors import FastCacheError
from ..logs import logger
from . import forkgate
from .shard import adopt

T = TypeVar("T")

# flags (u32), written at (seconds since the epoch), the write stamp it was written under
# (see :mod:`.stamps`: an entry answers only while that stamp is its slot's current one).
_HEADER = struct.Struct("<IdQ")
#: Values from this size on are kept by diskcache in files of their own.
_FILE_THRESHOLD = 2**15
# Values written behind land with upserts of many rows each (diskcache's own set takes a
# SELECT and an UPDATE or INSERT per value): the row as diskcache's set would leave it for
# a small value kept in the database (MODE_RAW, size 0, no file, no tag). A row that holds
# a file is left to diskcache's own calls, which remove the file.
_UPSERT_ROW = "(?, 1, ?, ?, ?, 0, NULL, 0, 1, NULL, ?)"
_UPSERT_CONFLICT = (
    " ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time,"
    " expire_time = excluded.expire_time, access_time = excluded.access_time,"
    " access_count = 0, tag = NULL, size = 0, mode = 1, filename = NULL,"
    " value = excluded.value WHERE Cache.filename IS NULL"
)


def _upsert(rows: int) -> str:
    """The upsert of ``rows`` rows in one statement."""
    return (
        "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag,"
        " size, mode, filename, value) VALUES " + ",".join([_UPSERT_ROW] * rows) + _UPSERT_CONFLICT
    )


#: Rows per upsert statement: 64, then the rest in powers of two. Each row costs about
#: 3,000 instructions fewer than in a statement of its own. SQLite runs a statement's rows
#: in one step, with the interpreter's lock let go for the step (building and binding the
#: parameters holds it), where ``executemany`` takes the lock back after every row; so the
#: writer takes it back at most seven times per shard while it holds the shard's lock.
#: Whether a request thread beside the writer waits less for the lock is not settled
#: (bench/writer_beside_requests.py measures it; docs/tier-rounds.md has its runs). Seven
#: statements in each connection's statement cache, whatever the batch (about 0.3 MB);
#: statements of every size up to 64 would save some 1,600 more instructions per write,
#: for about 2.5 MB per connection. 64 rows are 320 parameters, within SQLite's limit of
#: 999 before 3.32.
_UPSERT_SIZES: tuple[int, ...] = (64, 32, 16, 8, 4, 2, 1)
_UPSERTS: dict[int, str] = {rows: _upsert(rows) for rows in _UPSERT_SIZES}

# A read takes the two columns it needs (each more column costs, per read): a row kept in
# the database holds the bytes (mode raw: the tier writes nothing else there); one whose
# value is NULL holds a file, read by diskcache's own get. Expiry is checked on the row.
_SELECT = "SELECT value, expire_time FROM Cache WHERE key = ? AND raw = 1"

_DELETE = "DELETE FROM Cache WHERE key = ? AND raw = 1 AND filename IS NULL"

#: How a bytes parameter of the read and write-behind statements is bound. Python 3.11's
#: sqlite3 looks for an adapter for every ``bytes`` parameter (and raises and clears an
#: AttributeError doing so: about 3,300 instructions, 6% of a disk read), while a
#: ``bytearray`` binds as the same BLOB at once. From 3.12 on, the conversion costs more
#: than it saves (measured), so bytes stay bytes (``bytes()`` of one is that object).
as_blob: Callable[[bytes], bytes | bytearray] = bytearray if sys.version_info < (3, 12) else bytes

#: A disk entry's fields, as :class:`DiskEntry` names them.
Fields = tuple[bytes, int, float, float | None, int]

#: Writes a group commit handles in Python between two releases of the GIL. The writer
#: behind shares the GIL with the request threads; a request thread back from memcached
#: waits for the writer's Python work in progress (up to the 5 ms switch interval, longer
#: when the writer is preempted while holding it), so the writer hands it over often.
YIELD_EVERY = 32

#: Releases the GIL for a moment (a waiting request thread takes it).
_yield_gil = functools.partial(time.sleep, 0)

#: A write behind: (key, stamp, data or None for a delete, flags, expire_at, written_at).
Landing = tuple[bytes, int, bytes | None, int, float | None, float]
#: A row of the upserts (:func:`_upsert`): key, store time, expire time, access time, value.
_Row = tuple[bytes | bytearray, float, float | None, float, bytes | bytearray]

# The process id, kept current by a fork hook instead of a getpid() per operation: SQLite
# connections must never be used across a fork.
_current_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _current_pid
    _current_pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


class DiskError(FastCacheError):
    """The disk tier could not read or write (locked, read-only, removed, corrupt)."""


class LandingError(DiskError):
    """A group commit (:meth:`DiskStore.land`) failed on one shard or more; the other
    shards' writes landed. ``landed`` and ``skipped`` count those, ``failed`` the writes of
    the shards that failed."""

    def __init__(self, message: str, landed: int, skipped: int, failed: int) -> None:
        super().__init__(message)
        self.landed = landed
        self.skipped = skipped
        self.failed = failed


class DiskEntry(NamedTuple):
    """One disk entry, immutable. (A tuple: one is made per read from disk, and a frozen
    dataclass cost five times as much to make.)"""

    data: bytes
    flags: int
    written_at: float
    #: Seconds since the epoch when the entry expires; None: never.
    expire_at: float | None
    #: The write stamp it was written under (0: none, it never answers).
    stamp: int = 0

    def remaining_seconds(self, now: float) -> float | None:
        return None if self.expire_at is None else self.expire_at - now


def _read_shards(path: str) -> int | None:
    """The number of shards recorded at ``path``; None when there is none (or garbage)."""
    try:
        with open(path, encoding="ascii") as file:
            made = int(file.read().strip())
    except (OSError, ValueError):
        return None
    return made if made > 0 else None


def _encode(data: bytes, flags: int, written_at: float, stamp: int = 0) -> bytes:
    return _HEADER.pack(flags, written_at, stamp) + data


class DiskStore:
    def __init__(
        self,
        directory: str,
        *,
        shards: int = 8,
        size_limit: int = 1024**3,
        eviction_policy: str = "least-recently-stored",
        timeout: float = 0.010,
        lock_wait: float = 2.0,
    ) -> None:
        self.directory = directory
        #: Seconds a write waits, at most, for a shard lock another process holds.
        self.lock_wait = lock_wait
        self._options: dict[str, Any] = {
            "shards": shards,
            "timeout": timeout,
            "size_limit": size_limit,
            "eviction_policy": eviction_policy,
            "cull_limit": 0,
            "sqlite_synchronous": 0,
            "statistics": False,
        }
        self._fanout: diskcache.FanoutCache | None = None
        self._shards: tuple[diskcache.Cache, ...] = ()
        # Reads take diskcache's SQL straight where its get would record no access.
        self._plain_reads = diskcache.EVICTION_POLICY[eviction_policy]["get"] is None
        self._local = threading.local()
        self._pid = os.getpid()
        #: The process that called :meth:`open_ahead` (0: none yet).
        self._opened_ahead_in = 0
        self._opening = threading.Lock()
        forksafe.register(self)

    @property
    def records_reads(self) -> bool:
        """Whether a read updates its entry for the eviction policy (least recently or
        least frequently used): a read answered from anywhere else would make the entry
        look colder than it is."""
        return not self._plain_reads

    def _forget_after_fork(self) -> object:
        """In a forked child: the parent's shards (and their connections) are handed over,
        to be kept, never closed: closing them could checkpoint the parent's databases from
        under it. The child opens its own on first use."""
        inherited, self._fanout, self._shards = self._fanout, None, ()
        self._opening = threading.Lock()  # (held at the fork only past the gate's wait)
        return inherited

    # -- shards --------------------------------------------------------------------------
    def _cache(self) -> diskcache.FanoutCache:
        fanout = self._fanout
        if fanout is None or self._pid != os.getpid():
            # First use, or a forked child: SQLite connections must not cross a fork. (A
            # child handed the parent's over at the fork, see _forget_after_fork.) One
            # thread opens, others wait for its shards (the maintenance thread opens them
            # ahead of the requests, see open_ahead). The lock is taken inside the gate, so
            # it is never held at a fork.
            with forkgate.writing(), self._opening:  # connecting: no fork meanwhile
                fanout = self._fanout
                if fanout is None or self._pid != os.getpid():
                    fanout = self._open()
        return fanout

    def _open(self) -> diskcache.FanoutCache:
        try:
            # Only this user may write here: the values are unpickled when read.
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            options = {**self._options, "shards": self._shards_made()}
            fanout = diskcache.FanoutCache(self.directory, **options)
            shards = adopt(fanout)
        except Exception as exc:
            raise DiskError(f"cannot open the disk tier at {self.directory}: {exc}") from exc
        # (The hash first, the shards next: a call that finds the shards uses both.)
        self._hash = fanout._hash
        self._shards = shards
        self._fanout, self._pid = fanout, os.getpid()
        return fanout

    def open_ahead(self) -> None:
        """Open the shards now, in the calling thread (the maintenance thread's, off the
        request path): the first read from disk of a process would otherwise open all of
        them in a request, 9 to 21 ms of CPU (one get per cachebench worker, 11 to 35 ms).
        Once per process; a failure is left to the calls that need the shards, which
        report it as they always did."""
        if self._opened_ahead_in == os.getpid():
            return
        self._opened_ahead_in = os.getpid()
        with contextlib.suppress(DiskError):
            self._shards_now()

    def _shards_made(self) -> int:
        """How many shards the directory was made with, whatever ``shards`` says: the
        first process to open it records its number (in ``shards``, beside them). Every
        process must find a key in the same shard (one that looked in another would miss
        the entry, and an ``add`` would take over it), so a process configured otherwise
        (a deploy changing ``disk_shards``) keeps to the directory's, and says so.
        (diskcache makes a shard's directory at its first use: they cannot be counted.)"""
        configured: int = self._options["shards"]
        path = os.path.join(self.directory, "shards")
        made = _read_shards(path)
        if made is None:
            # Recorded whole or not at all (a link fails where the file exists): a process
            # opening the directory at the same moment reads one number or the other's.
            temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
            try:
                with open(temporary, "w", encoding="ascii") as file:
                    file.write(f"{configured}\n")
                with contextlib.suppress(FileExistsError):
                    os.link(temporary, path)
            except OSError:
                return configured  # (a read-only directory: nothing is written there anyway)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
            made = _read_shards(path)
        if made is None or made == configured:
            return configured
        logger.warning(
            "the disk tier at %s was made with %d shards: it keeps them (disk_shards=%d is "
            "not applied; to change the number, use a new disk_directory)",
            self.directory,
            made,
            configured,
        )
        return made

    def _shard(self, key: bytes) -> diskcache.Cache:
        return self._shards_now()[self.shard_of(key)]

    def _shards_now(self) -> tuple[diskcache.Cache, ...]:
        shards = self._shards
        if not shards or self._pid != _current_pid:
            self._cache()
            shards = self._shards
        return shards

    def shard_of(self, key: bytes) -> int:
        """The shard holding ``key`` (FanoutCache's own placement, so that its whole-cache
        operations stay valid)."""
        shards = self._shards_now()  # first: it also sets up the hash function
        if type(key) is bytes:
            # diskcache's Disk.hash of a bytes key, without its two calls per key.
            return (zlib.adler32(key) & 0xFFFFFFFF) % len(shards)
        return int(self._hash(key)) % len(shards)

    @contextlib.contextmanager
    def _failures(self, what: str) -> Iterator[None]:
        try:
            yield
        except DiskError:
            raise
        except Exception as exc:  # SQLite, the file system, a lock timeout
            raise DiskError(f"disk tier {what} failed: {type(exc).__name__}: {exc}") from exc

    def _waiting(self, operation: Callable[[], T]) -> T:
        """Run a shard operation, again while another process holds the shard's lock.

        A lock is held for a group commit of the writer behind, or an outage write, so it
        may be held for a while. Writes keep trying for ``lock_wait`` seconds (each try
        waits ``timeout``). Every try is a write: no fork meanwhile (see forkgate)."""
        with forkgate.writing():
            try:
                return operation()
            except diskcache.Timeout:
                deadline = time.monotonic() + self.lock_wait
            while True:
                try:
                    return operation()
                except diskcache.Timeout:
                    if time.monotonic() >= deadline:
                        raise

    @contextlib.contextmanager
    def locked(self, key: bytes) -> Iterator[None]:
        """Hold the write lock of ``key``'s shard (host-wide: every process shares it).

        Only the disk tier's own failures (taking the lock, committing) become
        :class:`DiskError`; an error raised by the block itself (a memcached round trip)
        rolls the transaction back and goes through unchanged."""

        def begin() -> contextlib.AbstractContextManager[None]:
            transaction: contextlib.AbstractContextManager[None] = self._shard(key).transact(
                retry=False
            )
            transaction.__enter__()
            return transaction

        with forkgate.writing():  # no fork while the lock is held (see forkgate)
            with self._failures("lock"):
                transaction = self._waiting(begin)
            try:
                yield
            except BaseException as exc:
                with contextlib.suppress(Exception):  # the rollback re-raises ``exc``
                    transaction.__exit__(type(exc), exc, exc.__traceback__)
                raise
            with self._failures("commit"):
                transaction.__exit__(None, None, None)

    def _reader(self, key: bytes) -> Any:
        """A cursor of this thread's SQLite connection to ``key``'s shard (diskcache's
        own), kept without diskcache's process check per call: the shards are made anew
        after a fork or :meth:`close`, and the cursors kept with them. (On the read path:
        the shard is found here, in one call, and one cursor serves every read.)"""
        shards = self._shards
        if not shards or self._pid != _current_pid:
            shards = self._shards_now()
        if type(key) is bytes:
            index = (zlib.adler32(key) & 0xFFFFFFFF) % len(shards)  # as shard_of says
        else:
            index = self.shard_of(key)
        return self._cursor(shards, index)

    def _cursor(self, shards: tuple[diskcache.Cache, ...], index: int) -> Any:
        """This thread's cursor of shard ``index`` of ``shards`` (the current shards), made
        on first use. Kept, not made per statement: a connection's ``execute`` makes a
        cursor, which the connection tracks by a weak reference until it next sweeps them
        (every 200 cursors); those outlive the young generations of the garbage collector,
        and the full collections they bring on cost a worker some 15 ms each."""
        cursors: dict[int, Any]
        try:
            # (One attribute of the thread's: each costs a thread-local lookup.)
            held, cursors = self._local.cursors
        except AttributeError:
            held = None
        if held is not shards:
            cursors = {}
            self._local.cursors = (shards, cursors)
        cursor = cursors.get(index)
        if cursor is None:
            cursor = cursors[index] = shards[index]._con.cursor()
        return cursor

    # -- operations ----------------------------------------------------------------------
    # get, read and set are on the request path: plain try blocks, no context manager per
    # call.
    def get(self, key: bytes) -> DiskEntry | None:
        found = self.read(key)
        return None if found is None else DiskEntry._make(found)

    def read(self, key: bytes, stamp: int | None = None) -> Fields | None:
        """The fields of ``key``'s unexpired entry (those of :class:`DiskEntry`, as a plain
        tuple), or None; with ``stamp``, None also for an entry written under another
        stamp. The read path's :meth:`get`: an entry that cannot answer costs no object
        built."""
        try:
            if self._plain_reads:
                # diskcache's own get, as it runs for an eviction policy that records no
                # access (its fast path), for a row with no file of its own.
                forkgate.enter()  # inside SQLite: no fork meanwhile (see forkgate)
                try:
                    rows = self._reader(key).execute(_SELECT, (as_blob(key),)).fetchall()
                finally:
                    forkgate.leave()
                if not rows:
                    return None
                ((raw, expire_at),) = rows
                if raw is None:  # a file of its own
                    raw, expire_at = self._shard(key).get(key, expire_time=True, retry=False)
                elif expire_at is not None and expire_at <= time.time():
                    return None
            else:
                raw, expire_at = self._shard(key).get(key, expire_time=True, retry=False)
            if raw is None or len(raw) < _HEADER.size:
                return None  # none, or not of this format (an older version's): never answers
            # (Inside the try: a corrupt file can hand back a row of any type.)
            flags, written_at, written_under = _HEADER.unpack_from(raw)
        except Exception as exc:
            raise DiskError(f"disk tier read failed: {type(exc).__name__}: {exc}") from exc
        if stamp is not None and written_under != stamp:
            return None
        return raw[_HEADER.size :], flags, written_at, expire_at, written_under

    def set(
        self,
        key: bytes,
        data: bytes,
        flags: int,
        ttl: float | None,
        stamp: int = 0,
        written_at: float | None = None,
    ) -> None:
        """Store ``data`` under write stamp ``stamp``; ``ttl`` in seconds (None: no expiry;
        <= 0: remove instead)."""
        if ttl is not None and ttl <= 0:
            self.delete(key)
            return
        raw = _encode(data, flags, time.time() if written_at is None else written_at, stamp)
        try:
            shard = self._shard(key)
            self._waiting(lambda: shard.set(key, raw, expire=ttl, retry=False))
        except Exception as exc:
            raise DiskError(f"disk tier write failed: {type(exc).__name__}: {exc}") from exc

    def land(self, writes: list[Landing], current: Callable[[bytes], int]) -> tuple[int, int]:
        """Apply writes made behind memcached, in one transaction per shard.

        A write lands only if ``current(key)`` (its slot's stamp, read while the shard's
        lock is held) is still the write's stamp: one overtaken by a newer write or delete
        of its slot is skipped (so is an earlier write of a key written again in the same
        batch). Returns (landed, skipped). :class:`LandingError` when a shard's transaction
        failed: the other shards' writes landed all the same, and its counts say how many."""
        latest = {write[0]: write for write in writes}
        shards = self._shards_now()
        # Each shard's writes, encoded here, before its transaction: the GIL is handed over
        # only while no shard's lock is held (a hand-over inside the transaction could
        # keep the lock up to a switch interval per hand-over, from every other process).
        by_shard: dict[int, list[tuple[Landing, bytes | None]]] = {}
        count = len(shards)
        skipped = len(writes) - len(latest)
        for done, (key, write) in enumerate(latest.items(), 1):
            if current(key) != write[1]:
                # Overtaken already (a slot's stamp never comes back), as most writes are
                # when several processes write the same keys: skipped before any work. The
                # check under the shard's lock below catches those overtaken from now on.
                skipped += 1
                continue
            if type(key) is bytes:
                index = (zlib.adler32(key) & 0xFFFFFFFF) % count  # shard_of, inlined
            else:
                index = self.shard_of(key)
            data = write[2]
            raw = None if data is None else _encode(data, write[3], write[5], write[1])
            by_shard.setdefault(index, []).append((write, raw))
            if not done % YIELD_EVERY:
                _yield_gil()
        landed = 0
        # A shard that fails loses its own writes, not the other shards' (each is landed
        # by a transaction of its own, and stamp-checked: any order is safe).
        failed = 0
        failure: DiskError | None = None
        for index in sorted(by_shard):
            try:
                done, passed = self._land_shard(
                    shards[index], self._cursor(shards, index), by_shard[index], current
                )
            except LandingError as exc:
                landed += exc.landed
                skipped += exc.skipped
                failed += exc.failed
                failure = failure or exc
            except DiskError as exc:
                failed += len(by_shard[index])
                failure = failure or exc
            else:
                landed += done
                skipped += passed
        if failure is not None:
            raise LandingError(str(failure), landed, skipped, failed) from failure
        return landed, skipped

    def _land_shard(
        self,
        shard: diskcache.Cache,
        con: Any,
        writes: list[tuple[Landing, bytes | None]],
        current: Callable[[bytes], int],
    ) -> tuple[int, int]:
        """:meth:`land`'s writes of one shard, encoded: (landed, skipped). ``con``: this
        thread's cursor of the shard (:meth:`_cursor`). DiskError when none landed;
        LandingError when those involving files failed after the rest."""
        landed = skipped = 0
        slow: list[Landing] = []  # large values, and rows that hold a file
        with self._failures("write behind"), forkgate.writing():
            # Plain statements in a plain transaction: diskcache's own, needed by its
            # calls for the rows that involve files, costs as much again.
            self._waiting(functools.partial(_begin, con))
            try:
                now = time.time()
                upserts: list[_Row] = []
                deletes: list[tuple[bytes | bytearray]] = []
                for write, raw in writes:
                    key, stamp, _data, _flags, expire_at, _written_at = write
                    if current(key) != stamp:
                        skipped += 1
                    elif raw is None or (expire_at is not None and expire_at <= now):
                        deletes.append((as_blob(key),))
                    elif len(raw) >= _FILE_THRESHOLD:
                        slow.append(write)
                    else:
                        upserts.append((as_blob(key), now, expire_at, now, as_blob(raw)))
                with_files = _land_rows(con, upserts, deletes)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):  # none open after a failed COMMIT
                    con.execute("ROLLBACK")
                raise
        landed += len(upserts) + len(deletes) - len(with_files)
        if with_files:
            slow += [w for w, _raw in writes if w[0] in with_files]
        if slow:
            try:
                with self._failures("write behind"), self._transaction(shard):
                    done = self._land_slow(shard, slow, current)
            except DiskError as exc:
                raise LandingError(str(exc), landed, skipped, len(slow)) from exc
            landed += done
            skipped += len(slow) - done
        return landed, skipped

    @staticmethod
    def _land_slow(
        shard: diskcache.Cache, writes: list[Landing], current: Callable[[bytes], int]
    ) -> int:
        """Writes that involve files of diskcache's own (large values, rows that hold
        one), by its own calls, which remove the files, within ``shard``'s transaction;
        each only while its stamp is still current. Returns how many landed."""
        now = time.time()
        landed = 0
        for key, stamp, data, flags, expire_at, written_at in writes:
            if current(key) != stamp:
                continue  # overtaken since: its row never answers again (the stamp moved)
            landed += 1
            if data is None or (expire_at is not None and expire_at <= now):
                shard.delete(key, retry=False)
            else:
                expire = None if expire_at is None else expire_at - now
                shard.set(key, _encode(data, flags, written_at, stamp), expire=expire, retry=False)
        return landed

    @contextlib.contextmanager
    def _transaction(self, shard: diskcache.Cache) -> Iterator[None]:
        """``shard``'s write lock, waited for as :meth:`_waiting` says."""

        def begin() -> contextlib.AbstractContextManager[None]:
            transaction: contextlib.AbstractContextManager[None] = shard.transact(retry=False)
            transaction.__enter__()
            return transaction

        with forkgate.writing():  # no fork while the lock is held (see forkgate)
            transaction = self._waiting(begin)
            try:
                yield
            except BaseException as exc:
                with contextlib.suppress(Exception):  # the rollback re-raises ``exc``
                    transaction.__exit__(type(exc), exc, exc.__traceback__)
                raise
            transaction.__exit__(None, None, None)

    def add(self, key: bytes, data: bytes, flags: int, ttl: float | None) -> bool:
        """Store only if ``key`` holds nothing (unexpired); True when stored."""
        if ttl is not None and ttl <= 0:
            return self.get(key) is None
        with self._failures("write"):
            shard = self._shard(key)
            return bool(
                self._waiting(
                    lambda: shard.add(
                        key, _encode(data, flags, time.time()), expire=ttl, retry=False
                    )
                )
            )

    def delete(self, key: bytes) -> bool:
        with self._failures("delete"):
            shard = self._shard(key)
            return bool(self._waiting(lambda: shard.delete(key, retry=False)))

    def touch(self, key: bytes, ttl: float | None) -> bool:
        if ttl is not None and ttl <= 0:
            # Expired at once, as memcached does: True when there was an entry to touch.
            return self.delete(key)
        with self._failures("touch"):
            shard = self._shard(key)
            return bool(self._waiting(lambda: shard.touch(key, expire=ttl, retry=False)))

    def clear(self) -> None:
        with self._failures("clear"), forkgate.writing():
            self._cache().clear(retry=True)

    def cull(self) -> None:
        """Evict down to the size limit and drop expired entries (maintenance work)."""
        with self._failures("cull"), forkgate.writing():
            self._cache().expire(retry=False)
            self._cache().cull(retry=False)

    def volume(self) -> int:
        with self._failures("volume"):
            return int(self._cache().volume())

    def close(self) -> None:
        if self._fanout is not None and self._pid == os.getpid():
            self._fanout.close()
        self._fanout = None
        self._shards = ()


def _begin(con: Any) -> None:
    """Take the shard's write lock (``BEGIN IMMEDIATE``); :class:`diskcache.Timeout` when
    another process holds it past SQLite's busy timeout, as diskcache's own calls say it."""
    try:
        con.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        raise diskcache.Timeout from exc


def _land_rows(
    con: Any, upserts: list[_Row], deletes: list[tuple[bytes | bytearray]]
) -> set[bytes]:
    """One shard's small values and deletes, one statement per kind, within its
    transaction. Rows that hold a file of diskcache's own are left alone by both
    statements: their keys are returned, for diskcache's own calls (which remove the
    file)."""
    with_files: set[bytes] = set()
    # An upsert changes one row unless the row holds a file: only then look for them.
    if upserts and _upsert_all(con, upserts) != len(upserts):
        with_files |= _keys_with_files(con, [row[0] for row in upserts])
    if deletes:
        # A row the delete left may hold a file, or not exist: only a read tells which.
        con.executemany(_DELETE, deletes)
        with_files |= _keys_with_files(con, [row[0] for row in deletes])
    return with_files


def _upsert_all(con: Any, rows: list[_Row]) -> int:
    """Upsert ``rows`` in statements of :data:`_UPSERT_SIZES` rows; the rows changed."""
    changed = 0
    first = 0
    left = len(rows)
    for size in _UPSERT_SIZES:
        while left >= size:
            chunk = rows[first : first + size]
            changed += con.execute(
                _UPSERTS[size], [field for row in chunk for field in row]
            ).rowcount
            first += size
            left -= size
    return changed


def _keys_with_files(con: Any, keys: list[bytes | bytearray]) -> set[bytes]:
    found: set[bytes] = set()
    for first in range(0, len(keys), 500):
        chunk = keys[first : first + 500]
        rows = con.execute(
            "SELECT key FROM Cache WHERE raw = 1 AND filename IS NOT NULL AND key IN "
            f"({','.join('?' * len(chunk))})",
            chunk,
        )
        found.update(bytes(row[0]) for row in rows)
    return found
