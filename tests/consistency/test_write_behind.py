"""The windows the disk tier's write path opens, each forced open and checked.

The disk copy of a write lands behind memcached (:mod:`django_fastcache.disk.writebehind`),
and a memcached miss is refilled under a lease. Each test below holds one of the windows
open on purpose (the writer paused, a write slipped in between a refill's lease and its
store, a process killed with writes queued, a node going out with writes queued, memcached
restarted under a counter), logs every call it makes as the checker's operations, and runs
the checker (:func:`.checker.check`) over the log: no read may return a value older than an
acknowledged write or delete. Misses are allowed where a write had not landed (the checker's
"stale nothing"); each test says which answer it expects.

"Processes" sharing the host's disk tier are two FastCache stacks of their own in this
process (their options differ by a harmless timeout, so they do not share a stack): each has
its own queue and writer, both use the same directory, its write stamps and its journal.
The killed process is a real one.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.disk import DiskError
from django_fastcache.disk.stamps import StampsUnavailable, WriteStamps, slot_of
from django_fastcache.errors import (
    ClientError,
    OperationTimeoutError,
    OutcomeUnknownError,
    TLSError,
)
from django_fastcache.serializers import FLAG_INTEGER
from django_fastcache.stampede import blocking_pause
from django_fastcache.stampede import get_or_set as leased_get_or_set
from django_fastcache.testing.servers import MemcachedServer
from django_fastcache.tiered import TieredStore
from tests.conftest import LANDING_WAIT, forget_stacks
from tests.integration.test_misread_counters import plant_misread
from tests.twins import calling_first, twin

from .checker import ADD, DELETE, GET, INCR, INVALIDATE, SET, STALE_NOTHING, Op, check

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not MemcachedServer.available(), reason="memcached is not installed"),
]

SPAWN = multiprocessing.get_context("spawn")


class Log:
    """The calls of a test, as the checker's operations (one clock: monotonic_ns)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def _run(self, process: int, kind: str, key: str, call: Callable[[], Any]) -> Any:
        start = time.monotonic_ns()
        result = call()
        self.ops.append(Op(process, kind, key, result, start, time.monotonic_ns(), True))
        return result

    def set(self, cache: FastCache, process: int, key: str, value: int) -> None:
        start = time.monotonic_ns()
        cache.set(key, value, timeout=None)
        self.ops.append(Op(process, SET, key, value, start, time.monotonic_ns(), True))

    def delete(self, cache: FastCache, process: int, key: str) -> None:
        self._run(process, DELETE, key, lambda: cache.delete(key) and None)

    def get(self, cache: FastCache, process: int, key: str) -> Any:
        return self._run(process, GET, key, lambda: cache.get(key))

    def incr(self, cache: FastCache, process: int, key: str) -> int | None:
        def call() -> int | None:
            try:
                return cache.incr(key)
            except ValueError:
                return None  # missing

        value: int | None = self._run(process, INCR, key, call)
        return value

    def add_through(
        self, cache: FastCache, process: int, key: str, value: int, client: Any
    ) -> bool:
        """:meth:`add` on the tier with ``client`` in place of its blocking client."""
        wire = cache.wire_key(key)
        data, flags = cache._serializer.dumps(value)
        start = time.monotonic_ns()
        added: bool = run_blocking(tier(cache).add(client, wire, data, flags, None))
        if added:
            self.ops.append(Op(process, SET, key, value, start, time.monotonic_ns(), True))
        return added

    def get_or_set(
        self, cache: FastCache, process: int, key: str, value: int, during: Callable[[], None]
    ) -> Any:
        """get_or_set whose default runs ``during`` (the lease held, its store not yet
        sent). Logged as the worker logs it: an add that took when the lease store was
        taken, else a write that may have landed; a value other than its own, as a read."""
        metrics = tier(cache).metrics
        before = metrics.leased_stores
        ran: list[int] = []

        def default() -> int:
            ran.append(value)
            during()
            return value

        start = time.monotonic_ns()
        result = cache.get_or_set(key, default, timeout=None)
        end = time.monotonic_ns()
        if ran:
            stored = metrics.leased_stores != before
            self.ops.append(Op(process, ADD if stored else SET, key, value, start, end, stored))
        if not ran or result != value:
            self.ops.append(Op(process, GET, key, result, start, end, True))
        return result

    def record(self, op: Op) -> None:
        self.ops.append(op)

    def stale_reads(self) -> list[Any]:
        """The checker's findings other than misses."""
        return [v for v in check(self.ops) if v.kind != STALE_NOTHING]


def make(location: str, directory: str, process: int, **extra: Any) -> FastCache:
    """FastCache as process ``process`` of the host would have it: its own stack."""
    options = {
        "disk_directory": directory,
        "sign_values": False,
        "connect_timeout": 1.0 + process / 100,  # a stack of its own
        "operation_timeout": 0.5,
        **extra,
    }
    return FastCache(location, {"OPTIONS": options})


def tier(cache: FastCache) -> TieredStore:
    store = cache._shared().tiered
    assert store is not None
    return store


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    own = MemcachedServer()
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "disk"
    yield str(path)
    forget_stacks(path)
    forget_stacks(tmp_path / "disk-link")  # (the stacks built on it by _elsewhere)


def _landed_then_lost(
    log: Log, server: MemcachedServer, cache: FastCache, process: int, key: str, value: int
) -> None:
    """``process`` writes ``key``; its disk copy lands; memcached loses the key (its next
    read is answered from disk)."""
    log.set(cache, process, key, value)
    assert tier(cache).flush(LANDING_WAIT)
    server.flush()


def _elsewhere(directory: str) -> str:
    """The tier's directory reached by another path (a symbolic link to it). A process
    built on that path makes its stamps table without retiring the tables made for the
    directory's own path (it cannot tell them from another directory's): the processes on
    them follow only at their check of the files, as they do when the table was removed with
    its directory, or was made in another mount namespace."""
    link = directory.rstrip(os.sep) + "-link"  # (the directory fixture forgets its stacks)
    if not os.path.islink(link):
        os.symlink(directory, link)
    return link


@contextlib.contextmanager
def _still(store: TieredStore) -> Iterator[None]:
    """The block runs with ``store``'s process kept from moving by its maintenance thread
    and by its own calls' checks of the files (the test moves it, or keeps it on the files
    it has: as within FILES_CHECK_INTERVAL of its last check)."""
    from django_fastcache.maintenance import maintenance

    maintenance.unregister(store)
    try:
        yield
    finally:
        maintenance.register(store)


class _AppliedThenTimedOut:
    """Stands in for a tier's blocking client whose ``method`` reaches memcached and takes
    effect, and whose reply never comes back in time (the node hung right after, or this
    process stalled past its timeout); ``meanwhile`` runs before the timeout fires.
    ``error``: what the call raises instead of the timeout (a reply lost otherwise)."""

    def __init__(
        self,
        inner: Any,
        method: str,
        meanwhile: Callable[[], None] | None = None,
        error: Exception | None = None,
    ):
        self._inner = inner
        self._method = method
        self._meanwhile = meanwhile
        self._error = error

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != self._method:
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            await attribute(*args, **kwargs)
            if self._meanwhile is not None:
                self._meanwhile()
            raise self._error or OperationTimeoutError("timed out: the node hung")

        return call


def _timed_out_incr(
    log: Log,
    cache: FastCache,
    process: int,
    key: str,
    meanwhile: Callable[[], None] | None = None,
    error: Exception | None = None,
) -> int | None:
    """An incr through ``cache``'s tier that memcached counts and that times out (or fails
    with ``error``): logged as acknowledged with what it returned, or as failed when it
    raised OutcomeUnknownError (it may have taken effect)."""
    store = tier(cache)
    hung = _AppliedThenTimedOut(store.blocking, "meta_line", meanwhile, error)
    start = time.monotonic_ns()
    try:
        value: int | None = run_blocking(store.incr(hung, cache.wire_key(key), 1))
    except OutcomeUnknownError:
        log.record(Op(process, INCR, key, None, start, time.monotonic_ns(), False))
        raise
    log.record(Op(process, INCR, key, value, start, time.monotonic_ns(), True))
    return value


# -- a write racing a refill ------------------------------------------------------------------


@pytest.mark.parametrize("racer", ["set", "delete"])
def test_a_write_or_delete_racing_a_refill_wins(
    server: MemcachedServer, directory: str, racer: str
) -> None:
    log = Log()
    reader, writer = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(writer, 1, "k", 1)
    assert tier(writer).flush(LANDING_WAIT)
    server.flush()  # memcached lost it: the next read is answered from disk and refilled

    def write_meanwhile() -> None:
        if racer == "set":
            log.set(writer, 1, "k", 2)
        else:
            log.delete(writer, 1, "k")

    store = tier(reader)
    blocking = store.blocking
    store.blocking = calling_first(blocking, "meta_set", write_meanwhile)
    try:
        assert log.get(reader, 0, "k") == 1  # the disk's answer, concurrent with the write
    finally:
        store.blocking = blocking
    # The refill's store carried the lease's CAS: the write (or delete) stands.
    expected = 2 if racer == "set" else None
    for process, cache in ((0, reader), (1, writer), (0, reader)):
        assert log.get(cache, process, "k") == expected
    assert store.metrics.refills == 0
    assert log.stale_reads() == []


def test_a_write_landing_between_the_miss_and_the_lease_is_not_undone(
    server: MemcachedServer, directory: str
) -> None:
    # The lease is taken after the write's stamp moved on: the refill gives it back.
    log = Log()
    reader, writer = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(writer, 1, "k", 1)
    assert tier(writer).flush(LANDING_WAIT)
    server.flush()
    store = tier(reader)
    blocking = store.blocking

    def delete_meanwhile() -> None:
        log.delete(writer, 1, "k")

    store.blocking = calling_first(blocking, "meta_get", delete_meanwhile)
    try:
        log.get(reader, 0, "k")  # 1 or nothing: it overlaps the delete
    finally:
        store.blocking = blocking
    assert log.get(reader, 0, "k") is None
    assert log.get(writer, 1, "k") is None
    assert log.stale_reads() == []


# -- a write racing a get_or_set's computation ------------------------------------------------


@pytest.mark.parametrize("state", ["missing", "stale"])
@pytest.mark.parametrize("racer", ["set", "delete"])
def test_a_write_or_delete_landing_while_get_or_set_computes_wins(
    server: MemcachedServer, directory: str, racer: str, state: str
) -> None:
    # The winner's lease is held (a stub for a missing key; for a value invalidate() marked
    # stale, the win stale-while-revalidate hands out) while another process writes or
    # deletes; the winner's store carries the lease's CAS and must lose, in memcached and
    # on disk, though get_or_set still returns what it computed.
    log = Log()
    cache = make(server.location, directory, 0, stale_while_revalidate=30)
    other = make(server.location, directory, 1, stale_while_revalidate=30)
    if state == "stale":
        log.set(other, 1, "k", 1)
        start = time.monotonic_ns()
        assert cache.invalidate("k") is True  # type: ignore[attr-defined]
        log.record(Op(0, INVALIDATE, "k", None, start, time.monotonic_ns(), True))

    def write_meanwhile() -> None:
        if racer == "set":
            log.set(other, 1, "k", 2)
        else:
            log.delete(other, 1, "k")

    assert log.get_or_set(cache, 0, "k", 3, write_meanwhile) == 3
    assert tier(cache).flush(LANDING_WAIT)
    assert tier(other).flush(LANDING_WAIT)
    seen = [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    server.flush()  # the disk answers now
    seen += [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    assert check(log.ops) == []  # not even a miss: nothing was lost
    expected = 2 if racer == "set" else None
    assert seen == [expected] * 4
    assert tier(cache).metrics.leased_stores == 0


def test_an_add_landing_while_get_or_set_computes_wins(
    server: MemcachedServer, directory: str
) -> None:
    # The disk has nothing for the key: the add replaces the get_or_set's stub, as a set
    # would, and the winner's store (with the stub's CAS) must then lose.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    added: list[bool] = []

    def add_meanwhile() -> None:
        start = time.monotonic_ns()
        took = other.add("k", 2, timeout=None)
        if took:
            log.record(Op(1, ADD, "k", 2, start, time.monotonic_ns(), True))
        added.append(took)

    assert log.get_or_set(cache, 0, "k", 3, add_meanwhile) == 3
    assert tier(cache).flush(LANDING_WAIT)
    assert tier(other).flush(LANDING_WAIT)
    seen = [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    server.flush()  # the disk answers now
    seen += [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    assert check(log.ops) == []  # not even a miss: nothing was lost
    assert added == [True]
    assert seen == [2] * 4


def test_a_set_stamped_before_a_lease_store_but_landing_after_it_wins_on_disk_too(
    server: MemcachedServer, directory: str
) -> None:
    # Found by the soak: the set stamps the key, then get_or_set (another process) wins
    # the lease, stamps, and stores; then the set lands in memcached, over it. The set is
    # the key's last write (the lease store took, so it came first), and memcached holds
    # it; once memcached loses it, the disk must not answer the lease store's value (the
    # set, seeing the slot stamped since, stamps it gone: a miss).
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)

    def get_or_set_meanwhile() -> None:
        assert log.get_or_set(cache, 0, "k", 3, lambda: None) == 3

    store = tier(other)
    blocking = store.blocking
    store.blocking = calling_first(blocking, "store_now", get_or_set_meanwhile)
    try:
        log.set(other, 1, "k", 2)  # stamped, then the get_or_set, then memcached
    finally:
        store.blocking = blocking
    assert tier(cache).metrics.leased_stores == 1
    assert tier(cache).flush(LANDING_WAIT)
    assert store.flush(LANDING_WAIT)
    seen = [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    server.flush()  # the disk answers now
    seen += [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    assert seen[:2] == [2, 2]
    assert seen[2:] == [None, None]  # the lease store's copy is hidden, not answered


# -- two writes of a key in flight at once ------------------------------------------------------


@pytest.mark.parametrize(
    ("outer", "inner"),
    [("set", "set"), ("set", "delete"), ("set", "add"), ("delete", "set"), ("delete", "add")],
)
def test_a_write_landing_after_one_stamped_later_leaves_the_key_missing_on_disk(
    server: MemcachedServer, directory: str, outer: str, inner: str
) -> None:
    # The outer write stamps the key, then (its request held) the inner one, of another
    # process, stamps, lands, and queues its disk copy; then the outer one lands in
    # memcached, last. The disk must not answer the inner write's value (nor, for an
    # outer delete, anything): the outer write sees the slot stamped since and stamps it
    # gone.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    if inner != "add":
        log.set(cache, 0, "k", 1)

    def inner_meanwhile() -> None:
        if inner == "set":
            log.set(cache, 0, "k", 3)
        elif inner == "delete":
            log.delete(cache, 0, "k")
        else:  # the key is missing: the add takes (its lease, then its store)
            start = time.monotonic_ns()
            assert cache.add("k", 3, timeout=None)
            log.record(Op(0, ADD, "k", 3, start, time.monotonic_ns(), True))

    store = tier(other)
    blocking = store.blocking
    method = "store_now" if outer == "set" else "delete_now"
    store.blocking = calling_first(blocking, method, inner_meanwhile)
    try:
        if outer == "set":
            log.set(other, 1, "k", 2)
        else:
            log.delete(other, 1, "k")
    finally:
        store.blocking = blocking
    assert tier(cache).flush(LANDING_WAIT)
    assert store.flush(LANDING_WAIT)
    last = 2 if outer == "set" else None
    seen = [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    assert seen == [last, last]  # memcached's order: the outer write landed last
    server.flush()  # the disk answers now
    seen = [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    assert seen == [None, None]
    assert log.stale_reads() == []


@pytest.mark.parametrize("outer", ["set", "set_many", "delete", "delete_many", "incr"])
def test_an_async_write_landing_after_a_set_stamped_later_leaves_the_key_missing_on_disk(
    server: MemcachedServer, directory: str, outer: str
) -> None:
    # The async paths of the tier, each held between its stamp and its request while a set
    # of another process stamps, lands and queues its copy: the outer call lands last in
    # memcached, and the set's copy must not answer once memcached loses the key.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "k", 1)
    store = tier(cache)
    wire = cache.wire_key("k")
    data, flags = cache._serializer.dumps(2)
    method = {"incr": "meta_line", "delete_many": "delete_many_by_node"}.get(outer, outer)
    raced: list[bool] = []

    def racing_set() -> None:
        log.set(other, 1, "k", 3)
        raced.append(True)

    client = calling_first(store.blocking, method, racing_set)
    start = time.monotonic_ns()
    last: int | None = None
    if outer == "set":
        assert run_blocking(store.set(client, wire, data, flags, None))
        last = 2
    elif outer == "set_many":
        assert run_blocking(store.set_many(client, [(wire, data, flags)], None)) == []
        last = 2
    elif outer in ("delete", "delete_many"):
        if outer == "delete":
            run_blocking(store.delete(client, wire))
        else:
            run_blocking(store.delete_many(client, [wire]))
        log.record(Op(0, DELETE, "k", None, start, time.monotonic_ns(), True))
    else:
        assert run_blocking(store.incr(client, wire, 1)) == 4  # the set's 3, then + 1
        last = 4
    if last is not None:
        log.record(Op(0, SET, "k", last, start, time.monotonic_ns(), True))
    assert len(raced) == 1  # the other process's set ran inside the outer call
    assert store.flush(LANDING_WAIT)
    assert tier(other).flush(LANDING_WAIT)
    assert [log.get(each, process, "k") for process, each in ((0, cache), (1, other))] == [
        last,
        last,
    ]
    server.flush()  # the disk answers now
    seen = [log.get(each, process, "k") for process, each in ((0, cache), (1, other))]
    assert seen == [None, None]
    assert log.stale_reads() == []


# -- an add racing a refill -------------------------------------------------------------------


def test_an_add_racing_another_process_refill_is_refused(
    server: MemcachedServer, directory: str
) -> None:
    # The refill's lease (a stub) is held when the other process adds: the disk has the
    # value, so the add is refused and leaves the stub; the refill's store then lands.
    log = Log()
    reader, adder = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(reader, 0, "k", 1)
    assert tier(reader).flush(LANDING_WAIT)
    server.flush()
    added: list[bool] = []

    def add_meanwhile() -> None:
        start = time.monotonic_ns()
        took = adder.add("k", 2, timeout=None)
        if took:
            log.record(Op(1, ADD, "k", 2, start, time.monotonic_ns(), True))
        added.append(took)

    store = tier(reader)
    blocking = store.blocking
    store.blocking = calling_first(blocking, "meta_set", add_meanwhile)
    try:
        assert log.get(reader, 0, "k") == 1
    finally:
        store.blocking = blocking
    for process, each in ((0, reader), (1, adder), (0, reader)):
        log.get(each, process, "k")
    assert check(log.ops) == []  # not even a miss: nothing was lost
    assert added == [False]
    assert store.metrics.refills == 1
    assert log.get(adder, 1, "k") == 1


def _lost_before_landing(
    log: Log,
    server: MemcachedServer,
    writer: FastCache,
    process: int,
    value: int,
    readers: tuple[tuple[int, FastCache], ...],
) -> None:
    """``writer`` (``process``) sets "k" to ``value``, acknowledged while its disk copy is
    held back, and memcached loses the key: no reader may answer an older value (a miss is
    due). Once the copy lands and memcached loses the key again, every reader answers
    ``value``."""
    store = tier(writer)
    store.behind.pause()  # the copy has not landed yet...
    try:
        log.set(writer, process, "k", value)  # ...acknowledged
        server.flush()  # ...when memcached loses the key
        for reader_process, reader in readers:
            assert log.get(reader, reader_process, "k") is None
    finally:
        store.behind.resume()
    assert store.flush(LANDING_WAIT)
    server.flush()
    for reader_process, reader in readers:
        assert log.get(reader, reader_process, "k") == value


# -- a touch without meta of a key only the disk holds ---------------------------------------


def _touching_then(client: Any, meanwhile: Callable[[], None]) -> Any:
    """A twin of ``client`` whose classic ``touch`` runs ``meanwhile`` once answered."""
    touch = client.touch

    async def touched_then(key: bytes, exptime: int, **kwargs: Any) -> bool:
        touched: bool = await touch(key, exptime, **kwargs)
        meanwhile()
        return touched

    return twin(client, touch=touched_then)


@pytest.mark.parametrize("racer", ["set", "delete"])
def test_a_classic_touch_of_a_key_only_the_disk_holds_loses_to_a_write_racing_it(
    server: MemcachedServer, directory: str, racer: str
) -> None:
    # Under protocol "classic" a touch that memcached did not find gives the disk's entry
    # its new expiry. A write or delete of another process landing between memcached's
    # answer and that copy wins: the old value never answers again.
    log = Log()
    cache = make(server.location, directory, 0, protocol="classic")
    other = make(server.location, directory, 1, protocol="classic")
    _landed_then_lost(log, server, cache, 0, "k", 1)
    store = tier(cache)

    def write_meanwhile() -> None:
        if racer == "set":
            log.set(other, 1, "k", 2)
        else:
            log.delete(other, 1, "k")

    client = _touching_then(store.blocking, write_meanwhile)
    tier(other).behind.pause()  # the racer's copy lands after the touch read the disk
    try:
        assert run_blocking(store.touch(client, cache.wire_key("k"), 100)) is True
    finally:
        tier(other).behind.resume()
    assert store.flush(LANDING_WAIT)
    assert tier(other).flush(LANDING_WAIT)
    expected = 2 if racer == "set" else None
    assert log.get(cache, 0, "k") == expected
    server.flush()  # memcached loses it again: the disk answers, never with the 1
    assert log.get(cache, 0, "k") in (expected, None)
    assert log.get(other, 1, "k") in (expected, None)
    assert log.stale_reads() == []


# -- the tier's directory deleted and made again under a running process -----------------------


def test_a_process_on_a_deleted_directory_misses_rather_than_answering_its_old_copy(
    server: MemcachedServer, directory: str
) -> None:
    # P's directory is deleted; Q, started afterwards, makes it again and writes; memcached
    # loses the key. P's read from disk finds its files replaced (its check is due: more
    # than CHECK_INTERVAL since its last, none here) and misses instead of answering its
    # own old copy from the removed files. Once P moves, no entry written before answers.
    import shutil

    from django_fastcache.maintenance import check_files

    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _still(store):  # the test moves P itself, after its read
        _landed_then_lost(log, server, older, 0, "k", 1)
        assert log.get(older, 0, "k") == 1  # from disk: P's reading connection is open
        shutil.rmtree(directory)
        newer = make(server.location, directory, 1)
        _landed_then_lost(log, server, newer, 1, "k", 2)
        store.states._next_check = 0.0  # P's next read from disk checks the files
        assert log.get(older, 0, "k") is None  # not 1, from the removed files
        assert log.get(newer, 1, "k") == 2  # Q's files answer for Q (and refill it)
        check_files(store)
        assert store.states.reopened == 1
        server.flush()
        for process, each in ((0, older), (1, newer)):
            assert log.get(each, process, "k") is None  # written before P moved
        log.set(older, 0, "k", 3)
        assert store.flush(LANDING_WAIT)
        server.flush()
        for process, each in ((0, older), (1, newer)):
            assert log.get(each, process, "k") == 3
    assert log.stale_reads() == []


def test_a_copy_of_a_disk_entry_never_answers_once_another_process_wrote_its_key(
    server: MemcachedServer, directory: str
) -> None:
    # P answers k from disk and keeps a copy of the entry in memory (disk/readcopies.py);
    # Q then writes or deletes k. P's next read must not come from its copy: Q's write
    # gave k's slot a new stamp. Both with memcached up (P's miss answered from disk) and
    # with the node out (every read answered from disk).
    log = Log()
    older = make(server.location, directory, 0)
    newer = make(server.location, directory, 1)
    store = tier(older)
    wire = older.wire_key("k")

    def copied() -> bool:
        return store.copies.get(wire, store.stamps.current(wire)) is not None

    _landed_then_lost(log, server, older, 0, "k", 1)
    assert log.get(older, 0, "k") == 1  # a miss, answered from disk
    assert copied()
    _landed_then_lost(log, server, newer, 1, "k", 2)
    assert not copied()
    assert log.get(older, 0, "k") == 2  # not 1, from the copy
    server.kill()
    assert log.get(older, 0, "k") == 2  # the node found out: from disk (the copy, now)
    assert copied()
    log.set(newer, 1, "k", 3)  # journaled, landed at once
    assert log.get(older, 0, "k") == 3
    assert log.get(older, 0, "k") == 3
    log.delete(newer, 1, "k")
    assert log.get(older, 0, "k") is None
    log.set(newer, 1, "k", 4)
    assert log.incr(newer, 1, "k") == 5
    assert log.get(older, 0, "k") == 5
    assert log.stale_reads() == []


def test_a_process_that_moved_stamps_its_writes_where_the_directory_s_processes_read_them(
    server: MemcachedServer, directory: str
) -> None:
    # Once P moved to the directory Q made again, P's writes must stamp the directory's
    # table: else Q's older entry of a key P wrote keeps answering while P's copy waits to
    # land, and memcached losing the key then hands Q its own older value.
    import shutil

    from django_fastcache.maintenance import check_files

    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _still(store):  # the test moves P itself
        log.set(older, 0, "k", 1)
        assert store.flush(LANDING_WAIT)
        shutil.rmtree(directory)
        newer = make(server.location, directory, 1)
        store.states._next_check = 0.0
        check_files(store)
        assert store.states.reopened == 1
        log.set(newer, 1, "k", 2)
        assert tier(newer).flush(LANDING_WAIT)
        _lost_before_landing(log, server, older, 0, 3, ((1, newer), (0, older)))  # not Q's 2
    assert log.stale_reads() == []


# -- the write stamps table removed from /dev/shm under a running process ---------------------


def _stamps_table_removed(older: FastCache, directory: str, server: MemcachedServer) -> FastCache:
    """P's table in /dev/shm removed (RemoveIPC, an admin); Q, started afterwards, makes
    one in the directory. P has not read or written since."""
    from django_fastcache.disk.stamps import FILE, SHM

    stamps = tier(older).stamps
    assert stamps.mode == SHM
    os.unlink(stamps.table_path)
    newer = make(server.location, directory, 1)
    assert tier(newer).stamps.mode == FILE
    assert stamps.mode == SHM  # P moves at its next stamp or read, not before
    return newer


def test_a_process_whose_stamps_table_vanished_stamps_its_writes_where_the_others_read(
    server: MemcachedServer, directory: str
) -> None:
    # Q's entry must stop answering once P's later write is acknowledged: P stamps the
    # table the anchor names now, not the removed one it mapped.
    log = Log()
    older = make(server.location, directory, 0)
    newer = _stamps_table_removed(older, directory, server)
    log.set(newer, 1, "k", 2)
    assert tier(newer).flush(LANDING_WAIT)
    _lost_before_landing(log, server, older, 0, 3, ((1, newer), (0, older)))  # not Q's 2
    assert log.stale_reads() == []


def test_a_process_whose_stamps_table_vanished_reads_the_others_stamps(
    server: MemcachedServer, directory: str
) -> None:
    # P's own older copy, landed under P's stamp in the removed table, must not answer P
    # once Q's later write is acknowledged: P reads the table the anchor names now.
    log = Log()
    older = make(server.location, directory, 0)
    log.set(older, 0, "k", 1)
    assert tier(older).flush(LANDING_WAIT)
    newer = _stamps_table_removed(older, directory, server)
    _lost_before_landing(log, server, newer, 1, 2, ((0, older), (1, newer)))  # not P's 1
    assert log.stale_reads() == []


def test_a_process_whose_stamps_anchor_was_removed_moves_to_the_directory_s_at_its_check(
    server: MemcachedServer, directory: str
) -> None:
    # A temp cleaner removes the anchor alone (it is written only when a table is made);
    # Q, started afterwards, makes another anchor and table. P's check of the files moves
    # its stamps there, so its later write hides Q's older entry.
    from django_fastcache.maintenance import check_files

    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _still(store):  # the test moves P itself
        os.unlink(store.stamps.path)
        newer = make(server.location, directory, 1)
        assert tier(newer).stamps.table_path != store.stamps.table_path
        check_files(store)
        assert store.stamps.table_path == tier(newer).stamps.table_path
        log.set(newer, 1, "k", 2)
        assert tier(newer).flush(LANDING_WAIT)
        _lost_before_landing(log, server, older, 0, 3, ((1, newer), (0, older)))  # not Q's 2
    assert log.stale_reads() == []


def test_a_copy_does_not_answer_once_its_process_s_stamps_anchor_was_removed(
    server: MemcachedServer, directory: str
) -> None:
    # P keeps a copy of k's entry. A temp cleaner removes the anchor alone; Q, started
    # afterwards (on the directory by another path: P's table is not retired), stamps
    # another table and writes k, which lands; memcached loses k. P's slot in the table it
    # still maps matches its copy, but the copy must not answer: the check of the anchor
    # that the copies wait for (at most CHECK_INTERVAL old) finds it gone, and the read
    # goes to the disk, whose row is Q's (another stamp): a miss.
    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    wire = older.wire_key("k")
    with _still(store):  # P stays on the removed anchor: the test moves it
        _landed_then_lost(log, server, older, 0, "k", 1)
        assert log.get(older, 0, "k") == 1  # from disk, copied
        assert store.copies.get(wire, store.stamps.current(wire)) is not None
        os.unlink(store.stamps.path)
        newer = make(server.location, _elsewhere(directory), 1)
        _landed_then_lost(log, server, newer, 1, "k", 2)
        assert os.path.exists(store.stamps.table_path)  # not retired
        store._copies_checked_until = 0.0  # the check is due, as CHECK_INTERVAL on
        assert log.get(older, 0, "k") is None  # not 1, from the copy
        assert len(store.copies) == 0  # dropped with the anchor
    assert log.stale_reads() == []


def test_a_copy_does_not_answer_when_its_process_moves_between_the_check_and_the_slot(
    server: MemcachedServer, directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, but P's maintenance thread moves it to the new anchor while a read is under
    # way, right after the read took k's slot from the old table: the read must not then
    # find the anchor in place (it is, by then) and answer its copy under the old stamp.
    from django_fastcache.disk.stamps import WriteStamps

    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _still(store):
        _landed_then_lost(log, server, older, 0, "k", 1)
        # P's stamps, as a twin on the same (old) anchor, whose current() moves P to the
        # directory's anchor right after the read's own look at the slot (the second of
        # the get: get_now's look, then _answering's).
        stamps = twin(store.stamps)
        calls: list[int] = []
        armed: list[bool] = []

        def current(key: bytes) -> int:
            stamp = WriteStamps.current(stamps, key)
            calls.append(stamp)
            if armed and len(calls) == 2:
                assert stamps.reopen()
            return stamp

        monkeypatch.setattr(stamps, "current", current)
        monkeypatch.setattr(store, "stamps", stamps)
        assert log.get(older, 0, "k") == 1  # from disk, copied
        os.unlink(stamps.path)
        newer = make(server.location, _elsewhere(directory), 1)  # (P's table not retired)
        _landed_then_lost(log, server, newer, 1, "k", 2)
        calls.clear()
        armed.append(True)
        store._copies_checked_until = 0.0  # the check is due
        assert log.get(older, 0, "k") in (None, 2)  # not 1, from the copy
        assert len(calls) >= 2  # the move happened during that read
        assert stamps.table_path == tier(newer).stamps.table_path
    assert log.stale_reads() == []


def test_a_write_by_a_process_whose_anchor_was_removed_hides_the_older_copy_at_once(
    server: MemcachedServer, directory: str
) -> None:
    # The anchor alone removed; Q, started afterwards, makes another anchor and table and
    # writes. P has not checked its files since (its write is within FILES_CHECK_INTERVAL of
    # its last check), and its copy has not landed when memcached loses the key. Q retired
    # P's table when it made its own (its id zeroed), so P's write stamps Q's table: Q's
    # older copy misses. (Before, P stamped its own table, and Q answered 2.)
    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _still(store):  # P does not move during the test
        os.unlink(store.stamps.path)
        newer = make(server.location, directory, 1)
        log.set(newer, 1, "k", 2)
        assert tier(newer).flush(LANDING_WAIT)
        store.behind.pause()
        try:
            log.set(older, 0, "k", 3)  # acknowledged, stamped in the table Q never reads
            server.flush()
            log.get(newer, 1, "k")  # 2: older than P's acknowledged 3
        finally:
            store.behind.resume()
    assert log.stale_reads() == []


def test_a_write_in_flight_when_another_process_retires_its_table_hides_the_older_copy(
    server: MemcachedServer, directory: str
) -> None:
    # P stamps k in its table; before its set reaches memcached, the anchor alone is
    # removed, and Q, started then, makes a table (retiring P's) and writes k, which lands.
    # P's set then reaches memcached, after Q's. P's check of its stamp after the reply
    # follows Q's table, finds Q's stamp there, and stamps k gone before P acknowledges:
    # once memcached loses k (P's copy not landed yet), Q's copy of 2 must not answer.
    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    made: list[FastCache] = []

    def retired_meanwhile() -> None:
        os.unlink(store.stamps.path)
        made.append(make(server.location, directory, 1))
        log.set(made[0], 1, "k", 2)
        assert tier(made[0]).flush(LANDING_WAIT)

    with _still(store):  # (P moves only by following its stamps)
        blocking = store.blocking
        store.blocking = calling_first(blocking, "store_now", retired_meanwhile)
        store.behind.pause()
        try:
            log.set(older, 0, "k", 3)  # memcached takes it after Q's 2
            assert store.stamps.table_path == tier(made[0]).stamps.table_path
            server.flush()
            assert log.get(made[0], 1, "k") in (None, 3)  # memcached's last was 3, not 2
            assert log.get(older, 0, "k") in (None, 3)
        finally:
            store.blocking = blocking
            store.behind.resume()
    assert log.stale_reads() == []


def test_a_write_by_a_process_on_a_deleted_directory_hides_the_older_copy_at_once(
    server: MemcachedServer, directory: str
) -> None:
    # P, not moved yet, writes to the removed files; memcached loses the write before P
    # moves. Its table in /dev/shm, named by the removed anchor's path, was retired by Q
    # when Q made the directory's table: P's write stamps Q's table, and Q's older copy
    # misses. (Before, P stamped its own table, and Q answered its own older copy. Without
    # /dev/shm the table is removed with the directory, and that window stays:
    # tests/unit/test_write_stamps.py.)
    import shutil

    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _still(store):  # P does not move during the test
        log.set(older, 0, "k", 1)
        assert store.flush(LANDING_WAIT)
        shutil.rmtree(directory)
        newer = make(server.location, directory, 1)
        log.set(newer, 1, "k", 2)
        assert tier(newer).flush(LANDING_WAIT)
        log.set(older, 0, "k", 3)  # acknowledged; stamped and landed in the removed files
        assert store.flush(LANDING_WAIT)
        server.flush()
        log.get(newer, 1, "k")  # 2: older than P's acknowledged 3
    assert log.stale_reads() == []


@contextlib.contextmanager
def _moved_by_its_calls(store: TieredStore) -> Iterator[None]:
    """The block runs with ``store``'s process kept from moving by its maintenance thread:
    only its calls' own checks of the files move it (the test makes one due)."""
    from django_fastcache.maintenance import check_files

    with _still(store):
        store.check_files = check_files
        yield


@contextlib.contextmanager
def _made_again(
    server: MemcachedServer,
    directory: str,
    removed: str,
    before: Callable[[Log, FastCache], None] | None = None,
) -> Iterator[tuple[Log, FastCache, TieredStore, FastCache]]:
    """P (process 0), moved only by its calls' checks, runs ``before``; then ``removed``
    goes ("anchor": its stamps anchor alone; "directory": the tier's whole directory, once
    P's writes landed) and Q (process 1), started afterwards, makes it again, on the
    directory by another path (:func:`_elsewhere`: P's table is not retired, so only P's
    check of the files moves it). Yields the log, P, P's store and Q; once the block is
    done, P must be on Q's stamps table, and no read was stale."""
    import shutil

    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    with _moved_by_its_calls(store):
        if before is not None:
            before(log, older)
        if removed == "anchor":
            os.unlink(store.stamps.path)
        else:
            assert store.flush(LANDING_WAIT)  # (no writer landing while the directory goes)
            shutil.rmtree(directory)
            os.mkdir(directory)  # (the link to it must lead somewhere)
        newer = make(server.location, _elsewhere(directory), 1)
        assert os.path.exists(store.stamps.table_path)  # not retired
        yield log, older, store, newer
        assert store.stamps.table_path == tier(newer).stamps.table_path
    assert log.stale_reads() == []


def _wrote_k(log: Log, cache: FastCache) -> None:
    log.set(cache, 0, "k", 1)


def test_a_write_by_a_process_on_a_deleted_directory_moves_it_once_its_check_is_due(
    server: MemcachedServer, directory: str
) -> None:
    # As the known failure above, with P's check of the files due when it writes (its last
    # is FILES_CHECK_INTERVAL old): the write moves P first, so Q reads its stamp.
    with _made_again(server, directory, "directory", _wrote_k) as (log, older, store, newer):
        log.set(newer, 1, "k", 2)
        assert tier(newer).flush(LANDING_WAIT)
        store._files_due = 0.0  # due
        log.set(older, 0, "k", 3)
        assert store.states.reopened == 1  # the write moved P
        assert store.flush(LANDING_WAIT)
        server.flush()
        assert log.get(newer, 1, "k") == 3  # P's, landed in the directory's files


def test_a_write_by_a_process_whose_anchor_was_removed_moves_it_once_its_check_is_due(
    server: MemcachedServer, directory: str
) -> None:
    # As the known failure above, with P's check of the files due when it writes: P moves
    # to the table Q made, so its write hides Q's older entry while its own copy waits.
    with _made_again(server, directory, "anchor") as (log, older, store, newer):
        log.set(newer, 1, "k", 2)
        assert tier(newer).flush(LANDING_WAIT)
        store._files_due = 0.0  # due
        _lost_before_landing(log, server, older, 0, 3, ((1, newer), (0, older)))  # not Q's 2


def test_a_read_by_a_process_whose_anchor_was_removed_moves_it_once_its_check_is_due(
    server: MemcachedServer, directory: str
) -> None:
    # P's copy of k landed under P's table. The anchor alone is removed; Q, started
    # afterwards, stamps another table and writes k, acknowledged, its copy held back; then
    # memcached loses k. P's read from disk, its check of the files due, moves P first: its
    # slot then holds Q's stamp, which P's row does not carry (a miss, not P's 1).
    def before(log: Log, older: FastCache) -> None:
        _landed_then_lost(log, server, older, 0, "k", 1)

    with _made_again(server, directory, "anchor", before) as (log, older, store, newer):
        store._files_due = 0.0  # due
        _lost_before_landing(log, server, newer, 1, 2, ((0, older), (1, newer)))


def test_a_read_by_a_process_on_a_deleted_directory_sees_the_directory_s_outages_once_due(
    server: MemcachedServer, directory: str
) -> None:
    # P wrote k. The directory is deleted; Q, started afterwards, makes it again, marks the
    # node out and writes k during the outage (journaled, on disk only). P's read, its check
    # of the files due, moves P first: it sees the outage and answers from disk, not
    # memcached's older value. (Both threads kept off: no replay meanwhile.)
    with (
        _made_again(server, directory, "directory", _wrote_k) as (log, older, store, newer),
        _still(tier(newer)),
    ):
        tier(newer).node_failed(0)
        log.set(newer, 1, "k", 2)  # journaled
        store._files_due = 0.0  # due
        assert log.get(older, 0, "k") in (None, 2)  # not memcached's 1
        assert store.states.is_out(0)


# -- a write behind landing after a newer write -------------------------------------------------


def test_a_write_behind_landing_after_a_newer_one_is_skipped(
    server: MemcachedServer, directory: str
) -> None:
    log = Log()
    slow, fast = make(server.location, directory, 0), make(server.location, directory, 1)
    tier(slow).behind.pause()
    log.set(slow, 0, "k", 1)  # acknowledged, its disk copy held back
    log.set(fast, 1, "k", 2)  # newer, landed at once
    assert tier(fast).flush(LANDING_WAIT)
    skipped = tier(slow).behind.skipped
    tier(slow).behind.resume()
    assert tier(slow).flush(LANDING_WAIT)  # the older copy comes last...
    assert tier(slow).behind.skipped == skipped + 1  # ...and is skipped
    server.flush()
    for process, cache in ((0, slow), (1, fast)):
        assert log.get(cache, process, "k") == 2
    assert log.stale_reads() == []


def test_a_batch_checked_on_the_table_its_process_then_left_lands_nothing_older(
    server: MemcachedServer, directory: str
) -> None:
    # The writer checks a batch's stamps once, against the table the process maps then
    # (WriteBehind._still_current), and lands it after. Between the two, the anchor is
    # removed and Q, started then, makes another table (retiring P's) and writes k. The
    # batch's check passed P's write of 3 on the table it left; the landing checks each
    # write again on the table it follows to, where k's slot is Q's: P's copy is skipped,
    # and once memcached loses k, neither process answers 1 (P's older copy on disk) or
    # P's 3 over Q's 2.
    log = Log()
    older = make(server.location, directory, 0)
    store = tier(older)
    _landed_then_lost(log, server, older, 0, "k", 1)
    assert log.get(older, 0, "k") == 1  # on disk, answering
    made: list[FastCache] = []
    checked: list[bool] = []
    words_now = store.stamps.words_now

    slot = slot_of(older.wire_key("k"))
    stamped: list[int] = []

    def checked_then_moved() -> Any:
        words = words_now()  # the batch's check reads P's table, where P's 3 is current...
        checked.append(words is not None and words[slot] == stamped[0])
        os.unlink(store.stamps.path)  # ...and then the directory gets another one
        made.append(make(server.location, directory, 1))
        log.set(made[0], 1, "k", 2)
        assert tier(made[0]).flush(LANDING_WAIT)
        return words

    stamps = store.behind.stamps
    with _still(store):  # (P moves only by following its stamps)
        store.behind.pause()
        log.set(older, 0, "k", 3)  # acknowledged; memcached takes Q's 2 after it
        stamped.append(store.stamps.current(older.wire_key("k")))
        store.behind.stamps = twin(stamps, words_now=checked_then_moved)
        skipped = store.behind.skipped
        try:
            store.behind.resume()
            assert store.flush(LANDING_WAIT)
        finally:
            store.behind.stamps = stamps
        assert checked == [True]  # the batch's check let P's copy through
        assert store.behind.skipped == skipped + 1  # and its landing skipped P's copy
        server.flush()
        assert log.get(made[0], 1, "k") == 2  # Q's copy, the latest
        assert log.get(older, 0, "k") == 2
    assert log.stale_reads() == []


# -- a process killed with writes queued ----------------------------------------------------------


def _killed_with_writes_queued(location: str, directory: str, ready: Any) -> None:
    from tests.consistency.worker import configure_django

    configure_django([location], {"disk_directory": directory, "sign_values": False})
    from django.core.cache import cache

    store = cache._shared().tiered  # type: ignore[attr-defined]
    started = time.monotonic_ns()
    cache.set("k", 1, timeout=None)
    assert store.flush(LANDING_WAIT)
    first = (started, time.monotonic_ns())
    store.behind.pause()
    started = time.monotonic_ns()
    cache.set("k", 2, timeout=None)  # acknowledged; its disk copy never lands
    ready.put([first, (started, time.monotonic_ns())])
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_process_killed_with_writes_queued_leaves_misses_not_old_values(
    server: MemcachedServer, directory: str
) -> None:
    ready = SPAWN.SimpleQueue()  # written at once: the process dies right after
    process = SPAWN.Process(
        target=_killed_with_writes_queued, args=(server.location, directory, ready)
    )
    process.start()
    process.join(60)
    (first, second) = ready.get()
    assert process.exitcode == -signal.SIGKILL
    log = Log()
    log.record(Op(9, SET, "k", 1, first[0], first[1], True))
    log.record(Op(9, SET, "k", 2, second[0], second[1], True))
    cache = make(server.location, directory, 0)
    assert log.get(cache, 0, "k") == 2  # memcached has it
    server.flush()  # and loses it: the disk never got the write, its old copy must not answer
    assert log.get(cache, 0, "k") is None
    assert log.get(make(server.location, directory, 1), 1, "k") is None
    assert log.stale_reads() == []


# -- an outage starting while writes are queued -------------------------------------------------


def test_an_outage_starting_with_writes_queued_misses_until_they_land(
    server: MemcachedServer, directory: str
) -> None:
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "a", 1)
    log.set(cache, 0, "b", 1)
    assert tier(cache).flush(LANDING_WAIT)
    tier(cache).behind.pause()
    log.set(cache, 0, "a", 2)  # acknowledged, held back
    log.set(cache, 0, "b", 2)  # acknowledged, held back
    server.kill()
    log.set(other, 1, "b", 3)  # the node fails: journaled, on disk at once
    assert tier(other).states.is_out(0)
    # a's write is still queued: a misses (never 1); b's journaled write answers.
    assert log.get(other, 1, "a") is None
    assert log.get(cache, 0, "a") is None
    assert log.get(cache, 0, "b") == 3
    tier(cache).behind.resume()
    assert tier(cache).flush(LANDING_WAIT)
    # a's copy landed; b's queued copy was overtaken by the journaled write: skipped.
    assert log.get(other, 1, "a") == 2
    assert log.get(cache, 0, "b") == 3
    assert log.get(other, 1, "b") == 3
    assert log.stale_reads() == []


# -- counters across a memcached restart ---------------------------------------------------


def test_add_and_incr_count_on_across_a_memcached_restart(
    server: MemcachedServer, directory: str
) -> None:
    log = Log()
    cache = make(server.location, directory, 0)
    start = time.monotonic_ns()
    assert cache.add("hits", 0) is True
    log.record(Op(0, SET, "hits", 0, start, time.monotonic_ns(), True))
    for expected in range(1, 6):
        assert log.incr(cache, 0, "hits") == expected
    assert tier(cache).flush(LANDING_WAIT)
    server.restart()  # empty
    # add finds the count the disk still holds, as get would: it does not start again at 0.
    assert cache.add("hits", 0) is False
    assert log.incr(cache, 0, "hits") == 6
    assert log.get(cache, 0, "hits") == 6
    assert tier(cache).flush(LANDING_WAIT)
    server.restart()
    assert log.incr(make(server.location, directory, 1), 1, "hits") == 7
    assert log.get(cache, 0, "hits") == 7
    assert log.stale_reads() == []


def test_an_add_over_a_value_only_the_disk_holds_never_shows_its_own(
    server: MemcachedServer, directory: str
) -> None:
    # The add holds the key's lease while it consults the disk: another process reading
    # meanwhile finds the stub (a miss) and is answered from disk, never the add's value.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "hits", 5)
    assert tier(cache).flush(LANDING_WAIT)
    server.restart()
    seen: list[Any] = []

    def read_meanwhile() -> None:
        seen.append(log.get(other, 1, "hits"))

    client = calling_first(tier(cache).blocking, "meta_set", read_meanwhile)
    assert log.add_through(cache, 0, "hits", 0, client) is False
    assert seen == [5]
    assert log.incr(other, 1, "hits") == 6
    assert log.get(cache, 0, "hits") == 6
    assert log.stale_reads() == []


@pytest.mark.parametrize("racer", ["set", "delete"])
def test_a_write_or_delete_racing_an_adds_lease_wins(
    server: MemcachedServer, directory: str, racer: str
) -> None:
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)

    def write_meanwhile() -> None:
        if racer == "set":
            log.set(other, 1, "k", 2)
        else:
            log.delete(other, 1, "k")

    # The add's lease is taken, its store not yet sent, when the other process writes.
    added = log.add_through(
        cache, 0, "k", 1, calling_first(tier(cache).blocking, "meta_set", write_meanwhile)
    )
    # A set replaced the stub: the add is refused and the set stands. A delete removed
    # the stub: the add takes a new lease and stores (it comes after the delete).
    assert added is (racer == "delete")
    expected = 2 if racer == "set" else 1
    assert tier(cache).flush(LANDING_WAIT)
    assert tier(other).flush(LANDING_WAIT)
    for process, each in ((0, cache), (1, other)):
        assert log.get(each, process, "k") == expected
    server.restart()  # the disk answers now: the same value
    for process, each in ((0, cache), (1, other)):
        assert log.get(each, process, "k") == expected
    assert log.stale_reads() == []


def test_a_counter_whose_increments_had_not_landed_misses_rather_than_going_back(
    server: MemcachedServer, directory: str
) -> None:
    log = Log()
    cache = make(server.location, directory, 0)
    log.set(cache, 0, "hits", 10)
    assert tier(cache).flush(LANDING_WAIT)
    tier(cache).behind.pause()
    assert log.incr(cache, 0, "hits") == 11  # acknowledged, its disk copy held back
    server.restart()
    assert log.get(cache, 0, "hits") is None  # not 10
    assert log.incr(cache, 0, "hits") is None  # missing, not 11
    tier(cache).behind.resume()
    assert tier(cache).flush(LANDING_WAIT)
    # The held copy was overtaken by the failed incr's stamp: the count is lost (a miss,
    # the price of the lag), and never comes back as 10 or 11.
    assert log.get(cache, 0, "hits") is None
    assert cache.add("hits", 0) is True
    assert log.stale_reads() == []


# -- a write racing the count of a counter memcached misreads ----------------------------------


class _WriteBeforeStore(BlockingClient):
    """A blocking client of its own whose meta stores (``ms``) run ``meanwhile`` first:
    here, between the read and the store of a count the client makes itself (its own
    ``meta_line``, which a wrapper around the tier's client could not reach)."""

    meanwhile: Callable[[], None] = staticmethod(lambda: None)

    async def meta_line(self, node: int, data: bytes) -> Any:
        if data.startswith(b"ms "):
            self.meanwhile()
        return await super().meta_line(node, data)


@pytest.mark.parametrize("racer", ["set", "delete"])
def test_a_write_or_delete_racing_the_count_of_a_misread_counter_wins(
    server: MemcachedServer, directory: str, racer: str
) -> None:
    # memcached refuses a counter of 2**63 or more by mistake where an earlier item left a
    # '-' behind it (docs/async-client.md), and the tier's client counts it itself: a read,
    # then a store carrying the read's CAS. Another process's write or delete lands in
    # between: the store fails, and the increment is made again, after it.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    wire = cache.wire_key("n")
    plant_misread(server, wire, 2**63, lambda: log.set(cache, 0, "n", 2**63))
    store = tier(cache)
    client = _WriteBeforeStore(store.cluster)
    raced: list[str] = []

    def write_meanwhile() -> None:
        if not raced:
            raced.append(racer)
            if racer == "set":
                log.set(other, 1, "n", 2**63 + 100)
            else:
                log.delete(other, 1, "n")

    client.meanwhile = write_meanwhile
    start = time.monotonic_ns()
    try:
        value = run_blocking(store.incr(client, wire, 1))
    finally:
        client.close_thread_connections()
    log.record(Op(0, INCR, "n", value, start, time.monotonic_ns(), True))
    assert raced == [racer]
    expected = 2**63 + 101 if racer == "set" else None  # a delete: the incr finds it missing
    assert value == expected
    for process, each in ((0, cache), (1, other)):
        assert log.get(each, process, "n") == expected
        assert tier(each).flush(LANDING_WAIT)
    server.restart()  # the disk answers now: the count, or a miss, never an older value
    for process, each in ((0, cache), (1, other)):
        assert log.get(each, process, "n") in (None, expected)
    assert log.stale_reads() == []


# -- fork ------------------------------------------------------------------------------------------


def test_a_forked_child_writes_behind_with_a_writer_of_its_own(
    server: MemcachedServer, directory: str
) -> None:
    cache = make(server.location, directory, 0)
    store = tier(cache)
    cache.set("parent", 1)
    store.behind.pause()  # the parent's writer holds its batch lock now
    cache.set("queued", 1)  # in the parent's queue, which the child must not inherit
    pid = os.fork()
    if pid == 0:  # the child: its own writer, started on its first write
        code = 1
        try:
            cache.set("child", 2)
            landed = store.flush(10)
            entry = store.disk.get(cache.wire_key("child"))
            code = 0 if landed and entry is not None and len(store.behind) == 0 else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.behind.resume()
    assert store.flush(LANDING_WAIT)
    assert store.disk.get(cache.wire_key("queued")) is not None
    server.flush()
    assert cache.get("child") == 2
    assert cache.get("queued") == 1


def test_an_incr_meeting_a_refills_stub_counts_once_the_value_is_back(
    server: MemcachedServer, directory: str
) -> None:
    # Found by the soak: the increment met a refill's stub (memcached refuses to count
    # it), and by the time it looked, the refill had put the value back.
    cache = make(server.location, directory, 0)
    store = tier(cache)
    cache.set("n", 5)
    assert store.flush(LANDING_WAIT)
    server.flush()
    wire = cache.wire_key("n")
    lease = run_blocking(store.blocking.meta_get(wire, cas=True, vivify=30))
    assert lease is not None
    assert lease.win  # a stub: another caller's refill under way

    def refill_lands() -> None:
        run_blocking(store.blocking.meta_set(wire, b"5", flags=FLAG_INTEGER, cas=lease.cas))

    client = calling_first(store.blocking, "get", refill_lands)
    assert run_blocking(store.incr(client, wire, 1)) == 6  # type: ignore[arg-type]
    assert cache.get("n") == 6


# -- a read answered after its node went out -------------------------------------------------


def _disk_lagging(server: MemcachedServer, directory: str) -> tuple[Log, FastCache, FastCache]:
    """Two processes' caches; the first wrote n = 5, its disk copy held back (the test
    resumes its writer)."""
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    tier(cache).behind.pause()  # the disk lags: 5 is not on it yet
    log.set(cache, 0, "n", 5)
    return log, cache, other


def _refused_timed_out_incr(log: Log, other: FastCache) -> Callable[[], None]:
    """A step: ``other`` increments n, memcached counts it, the call times out, and the
    disk, not caught up, cannot count it alike (OutcomeUnknownError)."""

    def step() -> None:
        with pytest.raises(OutcomeUnknownError):
            _timed_out_incr(log, other, 1, "n")
        assert tier(other).metrics.nodes_marked_out == 1

    return step


@pytest.mark.parametrize("read", ["get_now", "get", "get_many", "get_or_set"])
def test_a_read_answered_after_its_node_went_out_is_not_served(
    server: MemcachedServer, directory: str, read: str
) -> None:
    # Found by the soak: a get sent just before memcached hung was answered once it ran
    # again, with the value of an incr that had timed out meanwhile and was then made on
    # the disk tier instead (from the disk's value: memcached's result is one no call
    # returned). Here the read's request is sent just after the incr.
    log, cache, other = _disk_lagging(server, directory)
    store, wire = tier(cache), cache.wire_key("n")
    incr_times_out = _refused_timed_out_incr(log, other)
    start = time.monotonic_ns()
    if read == "get_now":  # the sync API's flat path, on the tier's own blocking client
        real = store.blocking
        store.blocking = calling_first(real, "value_at", incr_times_out)
        try:
            value = cache.get("n")
        finally:
            store.blocking = real
    elif read in ("get", "get_many"):
        method = {"get_many": "get_many_by_node"}.get(read, read)
        client = calling_first(store.blocking, method, incr_times_out)
        if read == "get":
            found = run_blocking(store.get(client, wire))  # type: ignore[arg-type]
        else:
            found = run_blocking(store.get_many(client, [wire])).get(wire)  # type: ignore[arg-type]
        value = None if found is None else cache._decode(wire, found[0], found[1])
    else:
        client = calling_first(store.blocking, "meta_get", incr_times_out)
        value = run_blocking(
            leased_get_or_set(
                cache, client, "n", 9, None, None,  # type: ignore[arg-type]
                pause=blocking_pause, refused=object(),
            )
        )  # fmt: skip
    log.record(Op(0, SET if value == 9 else GET, "n", value, start, time.monotonic_ns(), True))
    # Not memcached's 6: the disk tier answers (it has nothing under the key's stamp), and
    # get_or_set computes its default.
    assert value == (9 if read == "get_or_set" else None)
    store.behind.resume()
    assert log.stale_reads() == []


def test_a_read_answered_before_its_node_went_out_and_came_back_is_not_served(
    server: MemcachedServer, directory: str
) -> None:
    # A read's reply can arrive after its node went out and was brought back (a hung
    # memcached answers its queued requests once it runs again): the node reads as up both
    # times the read looks, and only the outage count in the epoch it compares
    # (NodeStates.epoch) tells the read that memcached's answer may predate a write made
    # on disk meanwhile.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store, others = tier(cache), tier(other)
    log.set(cache, 0, "n", 5)
    outages_before = store.states.outages(0)

    def out_written_and_back() -> None:
        assert others.states.mark_out(0)
        log.set(other, 1, "n", 7)  # made on disk and journaled: the node is out
        # The replay deletes n from memcached (this one, or the first process's maintenance
        # thread's, whichever takes it).
        others.bring_back(0)
        assert not others.states.is_out(0), others.last_probe_error

    real = store.blocking
    answered = real.value_at

    def value_at(node: int, key: bytes, now: float) -> tuple[bytes, int] | None:
        found = answered(node, key, now)  # memcached's 5, from before the outage
        out_written_and_back()
        return found

    store.blocking = twin(real, value_at=value_at)
    try:
        value = cache.get("n")
    finally:
        store.blocking = real
    assert store.states.outages(0) == outages_before + 1
    assert value == 7  # the disk's, not the reply memcached gave before the outage
    assert log.get(cache, 0, "n") == 7
    assert log.stale_reads() == []


def test_an_incr_answered_after_its_node_went_out_is_not_served_memcached_s_count(
    server: MemcachedServer, directory: str
) -> None:
    # The same window with an incr as the reader: memcached's count would include the
    # other process's increment, whose outcome that process could not know.
    log, cache, other = _disk_lagging(server, directory)
    store, wire = tier(cache), cache.wire_key("n")
    client = calling_first(store.blocking, "meta_line", _refused_timed_out_incr(log, other))
    start = time.monotonic_ns()
    with pytest.raises(OutcomeUnknownError):  # not memcached's 7: its count includes 1's
        run_blocking(store.incr(client, wire, 1))  # type: ignore[arg-type]
    log.record(Op(0, INCR, "n", None, start, time.monotonic_ns(), False))
    assert tier(other).metrics.nodes_marked_out == 1
    store.behind.resume()
    assert log.stale_reads() == []


@pytest.mark.parametrize("failure", ["timeout", "tls"])
def test_a_timed_out_incr_read_before_its_node_was_marked_out_is_not_counted_again(
    server: MemcachedServer, directory: str, failure: str
) -> None:
    # Found by the soak: an incr that memcached counted timed out (its process stalled),
    # another process counted on top of it in memcached before the node was marked out,
    # and the timed-out one was then counted again on the disk's value. It must refuse
    # (OutcomeUnknownError: it may have taken effect) rather than count differently from
    # what memcached answered meanwhile. Likewise when its TLS session broke as the reply
    # came (a TLSError, a ConnectFailedError, from a connection the request went out on).
    error = TLSError("the TLS session broke: bad record mac") if failure == "tls" else None
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "n", 5)
    assert tier(cache).flush(LANDING_WAIT)  # the disk is up to date

    def counted_on_top() -> None:
        assert log.incr(cache, 0, "n") == 7  # 5, +1 by process 1, +1 here

    with pytest.raises(OutcomeUnknownError):
        _timed_out_incr(log, other, 1, "n", counted_on_top, error)
    assert log.get(cache, 0, "n") in (7, None)  # the node is out: the disk, by its stamps
    assert log.stale_reads() == []


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_timed_out_set_another_process_counted_on_is_not_answered_after_it(
    server: MemcachedServer, directory: str, path: str
) -> None:
    # Found by a probe: a set memcached ran but whose reply timed out, and another
    # process's incr counted on its value before the node was marked out. The set, made on
    # disk as it was sent, then answered every read: the count before the incr's, which
    # its caller had been told.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "n", 1)
    assert tier(cache).flush(LANDING_WAIT)
    counted: list[int | None] = []

    def counted_on_top() -> None:
        counted.append(log.incr(cache, 0, "n"))  # memcached holds the timed-out set's 5

    store = tier(other)
    start = time.monotonic_ns()
    if path == "async":
        hung = _AppliedThenTimedOut(store.blocking, "set", counted_on_top)
        data, flags = other._serializer.dumps(5)
        assert run_blocking(store.set(hung, other.wire_key("n"), data, flags, None))
    else:
        real = store.blocking

        def stored_then_timed_out(*args: Any) -> bool:
            real.store_now(*args)  # memcached takes it; the reply never comes in time
            counted_on_top()
            raise OperationTimeoutError("timed out: the node hung")

        store.blocking = twin(real, store_now=stored_then_timed_out)
        try:
            other.set("n", 5, timeout=None)
        finally:
            store.blocking = real
    log.record(Op(1, SET, "n", 5, start, time.monotonic_ns(), True))
    assert counted == [6]
    assert store.metrics.nodes_marked_out == 1
    assert store.metrics.journaled == 1
    assert log.get(cache, 0, "n") in (6, None)  # not 5: the incr counted on it
    assert log.stale_reads() == []


def test_a_timed_out_incr_the_disk_can_count_alike_is_counted_on_disk(
    server: MemcachedServer, directory: str
) -> None:
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "n", 5)
    assert tier(cache).flush(LANDING_WAIT)
    # memcached counted 6; the disk counts 6 from the same 5, journaled.
    assert _timed_out_incr(log, other, 1, "n") == 6
    assert log.get(cache, 0, "n") == 6
    assert tier(other).metrics.journaled == 1
    assert log.stale_reads() == []


def test_a_read_answered_after_its_node_went_out_gets_the_disk_s_value(
    server: MemcachedServer, directory: str
) -> None:
    # With the disk up to date, the disk tier's answer is the value (not a miss).
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store = tier(cache)
    log.set(cache, 0, "n", 5)
    assert store.flush(LANDING_WAIT)

    def incr_times_out() -> None:
        assert _timed_out_incr(log, other, 1, "n") == 6  # the disk counts as memcached did

    store.blocking = calling_first(real := store.blocking, "value_at", incr_times_out)
    try:
        assert log.get(cache, 0, "n") == 6  # the disk's count, made by the timed-out incr
    finally:
        store.blocking = real
    assert store.metrics.fallbacks >= 1
    assert log.stale_reads() == []


def test_get_or_set_s_lease_won_after_its_node_went_out_is_given_back(
    server: MemcachedServer, directory: str
) -> None:
    # The lease's stub must not outlive the call: once the node is back, a stub would
    # keep every reader waiting for a value nobody stores.
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store = tier(cache)
    wire = cache.wire_key("n")

    def node_goes_out() -> None:
        tier(other).node_failed(0)

    client = calling_first(store.blocking, "meta_get", node_goes_out)
    value = run_blocking(
        leased_get_or_set(
            cache, client, "n", 9, None, None,  # type: ignore[arg-type]
            pause=blocking_pause, refused=object(),
        )
    )  # fmt: skip
    assert value == 9  # computed, and stored by the disk tier (the node is out)
    assert run_blocking(store.blocking.get(wire)) is None  # no stub left in memcached


def test_an_incr_answered_after_its_node_went_out_keeps_its_count_when_the_key_is_its_own(
    server: MemcachedServer, directory: str
) -> None:
    # No other write of the key since this increment's stamp: memcached's count is its
    # alone, and the key was not journaled (no replay deletes it).
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store = tier(cache)
    cache.set("n", 5)
    wire = cache.wire_key("n")
    client = calling_first(store.blocking, "meta_line", lambda: tier(other).node_failed(0))
    assert run_blocking(store.incr(client, wire, 1)) == 6  # type: ignore[arg-type]
    assert store.metrics.journaled == 0
    assert store.flush(LANDING_WAIT)
    assert cache.get("n") == 6  # the node is out: the disk, which has the count


def test_an_incr_whose_node_went_out_before_its_stamp_counts_on_the_outage_s_write(
    server: MemcachedServer, directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process marks the node out and writes the key on disk between this
    # increment's look at the node and its stamp: memcached (still reachable from here)
    # would count on the value before that write, and the write would be lost.
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store = tier(cache)
    cache.set("n", 5)
    wire = cache.wire_key("n")
    real_current = store.stamps.current
    hooked: list[bool] = []

    def current(key: bytes) -> int:
        if not hooked:
            hooked.append(True)
            tier(other).node_failed(0)
            other.set("n", 50)  # journaled, on disk
        return real_current(key)

    monkeypatch.setattr(store, "stamps", twin(store.stamps, current=current))
    assert run_blocking(store.incr(store.blocking, wire, 1)) == 51
    assert hooked
    monkeypatch.undo()
    assert cache.get("n") == 51


def test_a_timed_out_add_read_before_its_node_was_marked_out_is_not_refused_on_disk(
    server: MemcachedServer, directory: str
) -> None:
    # memcached took the add and another process read its value; the add timed out, and
    # before it marked the node out, the other process did and wrote the key on disk. The
    # add must not then say it was refused (its value was read): OutcomeUnknownError.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    wire = cache.wire_key("n")
    data, flags = cache._serializer.dumps(7)

    def read_then_write_in_an_outage() -> None:
        assert log.get(other, 1, "n") == 7  # memcached took the add
        tier(other).node_failed(0)
        log.set(other, 1, "n", 50)  # journaled, on disk, stamped after the add

    hung = _AppliedThenTimedOut(tier(cache).blocking, "meta_set", read_then_write_in_an_outage)
    start = time.monotonic_ns()
    with pytest.raises(OutcomeUnknownError):
        run_blocking(tier(cache).add(hung, wire, data, flags, None))  # type: ignore[arg-type]
    log.record(Op(0, ADD, "n", 7, start, time.monotonic_ns(), False))
    assert log.get(cache, 0, "n") == 50
    assert log.stale_reads() == []


def test_a_timed_out_add_the_disk_can_make_alike_is_made_on_disk(
    server: MemcachedServer, directory: str
) -> None:
    cache = make(server.location, directory, 0)
    wire = cache.wire_key("n")
    data, flags = cache._serializer.dumps(7)
    hung = _AppliedThenTimedOut(tier(cache).blocking, "meta_set")
    assert run_blocking(tier(cache).add(hung, wire, data, flags, None)) is True  # type: ignore[arg-type]
    assert tier(cache).metrics.journaled == 1
    assert cache.get("n") == 7


def test_an_incr_that_could_not_connect_is_counted_on_disk_like_any_write_of_an_outage(
    server: MemcachedServer, directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A connect that times out sent nothing: the increment did not run in memcached, so it
    # is counted on the disk's latest value, even though another write of the key was
    # stamped meanwhile (which, had the increment been sent, would leave its outcome
    # unknown).
    log = Log()
    # (Timeouts no load can reach: only the connect below may fail.)
    cache = make(server.location, directory, 0, operation_timeout=30.0)
    other = make(server.location, directory, 1, operation_timeout=30.0)
    log.set(cache, 0, "n", 5)
    connect = socket.socket.connect
    connects: list[Any] = []

    def written_meanwhile_then_timed_out(sock: socket.socket, address: Any) -> None:
        monkeypatch.setattr(socket.socket, "connect", connect)
        connects.append(address)
        log.set(cache, 0, "n", 9)  # over process 0's open connection
        assert tier(cache).flush(LANDING_WAIT)
        raise TimeoutError("timed out")  # what the kernel's connect timeout raises

    monkeypatch.setattr(socket.socket, "connect", written_meanwhile_then_timed_out)
    # No probe brings the node back before the increment is journaled (it would be
    # counted in memcached instead: the same count, but not the path under test).
    with _still(tier(cache)), _still(tier(other)):
        assert log.incr(other, 1, "n") == 10
        assert len(connects) == 1  # the increment's own connect, which timed out
        assert tier(other).metrics.nodes_marked_out == 1
        assert tier(other).metrics.journaled == 1
        assert log.get(other, 1, "n") == 10
    assert log.stale_reads() == []


@pytest.mark.parametrize("call", ["incr", "touch", "delete"])
def test_a_call_tried_again_after_its_node_flapped_finds_the_disk_s_value(
    server: MemcachedServer, directory: str, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # The first attempt stamps the key and cannot connect (nothing sent); its node is
    # marked out and back before the disk is tried, so the call tries memcached again,
    # finds it empty (restarted), and must find the value the disk holds under the stamp
    # before the first attempt's, not look for one under the first attempt's stamp (where
    # nothing was ever written).
    log = Log()
    cache = make(server.location, directory, 0)
    store = tier(cache)
    log.set(cache, 0, "n", 5)
    assert store.flush(LANDING_WAIT)
    server.flush()  # memcached lost the value; the disk holds 5
    store.blocking.close_thread_connections()  # the call opens a connection
    connect, mark_out = socket.socket.connect, store.states.mark_out
    flapped: list[int] = []

    def refused(sock: socket.socket, address: Any) -> None:
        monkeypatch.setattr(socket.socket, "connect", connect)
        raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")

    def out_and_back(node: int) -> bool:
        changed = mark_out(node)
        store.states.mark_up(node)  # (as a probe that found it answering again would)
        flapped.append(node)
        return changed

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(store, "states", twin(store.states, mark_out=out_and_back))
    with _still(store):  # no probe of the maintenance thread in between
        if call == "incr":
            assert log.incr(cache, 0, "n") == 6
        elif call == "touch":
            assert cache.touch("n", None) is True
        else:
            assert cache.delete("n") is True
    assert flapped  # the first attempt did fail, and its node did flap
    monkeypatch.undo()
    assert log.get(cache, 0, "n") == {"incr": 6, "touch": 5, "delete": None}[call]
    assert log.stale_reads() == []


# -- a write of an outage between its journal and its landing --------------------------------


class _AfterJournal:
    """Stands in for a tier's journal: runs ``hook`` once, right after the first
    transaction that journals a key has committed and let the host-wide lock go (a write
    of an outage is then journaled and stamped, its disk entry not yet landed)."""

    def __init__(self, inner: Any, hook: Callable[[], None]) -> None:
        self._inner = inner
        self._hook: Callable[[], None] | None = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        with self._inner.transaction() as connection:
            yield connection
        if self._hook is not None:
            hook, self._hook = self._hook, None
            hook()


@contextlib.contextmanager
def _outage_write_held(store: TieredStore, hook: Callable[[], None]) -> Iterator[None]:
    """The block's first write of an outage through ``store`` runs ``hook`` between its
    journal and its landing."""
    journal = store.journal
    store.journal = _AfterJournal(journal, hook)  # type: ignore[assignment]
    try:
        yield
    finally:
        store.journal = journal


@pytest.mark.parametrize("write", ["set", "delete"])
def test_an_outage_write_not_yet_landed_when_its_node_comes_back_misses_until_it_lands(
    server: MemcachedServer, directory: str, write: str
) -> None:
    # The node is brought back (its journal replayed: the key deleted from memcached)
    # between the write's journal and its landing: a read then finds neither memcached's
    # value nor the disk's old one, and once the write landed it answers.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "k", 1)
    assert tier(cache).flush(LANDING_WAIT)
    during: list[Any] = []

    def node_back_and_read() -> None:
        assert tier(other).bring_back(0) == 1  # "k" replayed
        during.append(log.get(other, 1, "k"))
        during.append(log.get(cache, 0, "k"))

    with _still(tier(cache)), _still(tier(other)):  # no probe but the test's
        tier(cache).node_failed(0)  # (memcached runs: a partition, as seen from here)
        with _outage_write_held(tier(cache), node_back_and_read):
            if write == "set":
                log.set(cache, 0, "k", 2)
            else:
                log.delete(cache, 0, "k")
    assert during == [None, None]  # never 1
    assert not tier(other).states.is_out(0)
    expected = 2 if write == "set" else None
    assert log.get(other, 1, "k") == expected
    assert log.get(cache, 0, "k") == expected
    server.flush()  # memcached loses the refill: the disk still answers the same
    assert log.get(other, 1, "k") == expected
    assert log.stale_reads() == []


def test_an_outage_write_landing_after_a_newer_write_once_its_node_is_back_never_answers(
    server: MemcachedServer, directory: str
) -> None:
    # The node is back and another process writes the key in memcached before the outage
    # write lands: the landing, made only under a current stamp, is skipped, and the slot
    # stamped gone (the newer stamp could be a touch's or an incr's that answers from the
    # entry before the write): the newer write's disk copy is hidden with it.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "k", 1)
    assert tier(cache).flush(LANDING_WAIT)

    def node_back_and_write() -> None:
        assert tier(other).bring_back(0) == 1
        log.set(other, 1, "k", 3)

    with _still(tier(cache)), _still(tier(other)):
        tier(cache).node_failed(0)
        with _outage_write_held(tier(cache), node_back_and_write):
            log.set(cache, 0, "k", 2)
    assert log.get(cache, 0, "k") == 3
    assert tier(other).flush(LANDING_WAIT)
    server.flush()
    # memcached took 3 and lost it: the disk answers neither 2 (its landing was skipped)
    # nor 3 (hidden with it): a miss.
    assert log.get(cache, 0, "k") is None
    assert log.get(other, 1, "k") is None
    assert log.stale_reads() == []


@pytest.mark.parametrize("call", ["incr", "add"])
def test_a_counter_call_between_an_outage_write_s_journal_and_its_landing_misses(
    server: MemcachedServer, directory: str, call: str
) -> None:
    # Another process's incr or add of the key, journaled under the lock the write has
    # let go, finds the write's stamp with nothing under it: the key reads as missing
    # (never the value before the write): the incr finds nothing to count, the add takes,
    # and the write's overtaken landing then hides the add's value: a miss.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    log.set(cache, 0, "n", 5)
    assert tier(cache).flush(LANDING_WAIT)
    during: list[Any] = []

    def racer() -> None:
        if call == "incr":
            during.append(log.incr(other, 1, "n"))
        else:
            start = time.monotonic_ns()
            added = other.add("n", 9, timeout=None)
            if added:
                log.record(Op(1, ADD, "n", 9, start, time.monotonic_ns(), True))
            during.append(added)

    with _still(tier(cache)), _still(tier(other)):
        tier(cache).node_failed(0)
        with _outage_write_held(tier(cache), racer):
            log.set(cache, 0, "n", 7)
        if call == "incr":
            assert during == [None]  # not 6: the key misses while the write lands
            assert log.get(other, 1, "n") == 7
        else:
            assert during == [True]  # nothing answered: the add took
            assert log.get(other, 1, "n") is None  # never 5, and never 7 over 9
        assert log.get(cache, 0, "n") == log.get(other, 1, "n")
    assert log.stale_reads() == []


def test_an_outage_set_with_a_timeout_of_zero_is_stored_as_a_delete(
    server: MemcachedServer, directory: str
) -> None:
    log = Log()
    cache = make(server.location, directory, 0)
    log.set(cache, 0, "a", 1)
    assert tier(cache).flush(LANDING_WAIT)
    with _still(tier(cache)):
        tier(cache).node_failed(0)
        # Stored (and so gone at once): no key reported failed, whether it existed or not.
        assert cache.set_many({"a": 2, "b": 2}, timeout=0) == []
        assert log.get(cache, 0, "a") is None
        assert tier(cache).journal.length() == 2
    assert log.stale_reads() == []


class _Failing:
    """Stands in for a part of a tier whose ``method`` calls ``failure`` instead."""

    def __init__(self, inner: Any, method: str, failure: Callable[..., Any]) -> None:
        self._inner = inner
        self._method = method
        self._failure = failure

    def __getattr__(self, name: str) -> Any:
        return self._failure if name == self._method else getattr(self._inner, name)


def _disk_failed(*args: Any, **kwargs: Any) -> Any:
    raise DiskError("disk tier write failed: OperationalError: disk I/O error")


def _leaves_after_stamping(stamps: WriteStamps) -> WriteStamps:
    """A twin of a tier's stamps: once a write has stamped, the process has left the table
    (its directory made again) and cannot follow the new one: ``current`` says 0, ``bump``
    raises StampsUnavailable."""
    left: list[bool] = []

    def bump(key: bytes, gone: bool = False) -> int:
        if left:
            raise StampsUnavailable("the table cannot be followed")
        stamp = stamps.bump(key, gone)
        left.append(True)
        return stamp

    def current(key: bytes) -> int:
        return 0 if left else stamps.current(key)

    return twin(stamps, bump=bump, current=current)


@pytest.mark.parametrize("failure", ["landing", "stamps"])
def test_an_outage_write_whose_landing_fails_is_refused_and_hides_the_old_value(
    server: MemcachedServer, directory: str, failure: str
) -> None:
    # The write is journaled and stamped; its disk write then fails (or the process can
    # no longer stamp the table the others read): it is refused, no exception reaches
    # the caller, and the value it was to replace no longer answers.
    cache = make(server.location, directory, 0)
    store = tier(cache)
    cache.set("k", 1, timeout=None)
    assert store.flush(LANDING_WAIT)
    wire = cache.wire_key("k")
    data, flags = cache._serializer.dumps(2)
    with _still(store):
        store.node_failed(0)
        disk, stamps = store.disk, store.stamps
        if failure == "landing":
            store.disk = _Failing(disk, "land", _disk_failed)  # type: ignore[assignment]
        else:
            store.stamps = _leaves_after_stamping(stamps)
        try:
            assert store.set_now(wire, data, flags, None) is False
        finally:
            store.disk, store.stamps = disk, stamps
        assert store.journal.length() == 1
        assert cache.get("k") is None  # never 1


def _bumps_meanwhile(
    stamps: WriteStamps, meanwhile: Callable[[Callable[[], None]], None]
) -> WriteStamps:
    """A twin of a tier's stamps whose first ``bump`` is made by ``meanwhile``, which
    receives the call that makes it (the stamp then falls where ``meanwhile`` puts it)."""
    pending = [meanwhile]

    def bump(key: bytes, gone: bool = False) -> int:
        if not pending:
            return stamps.bump(key, gone)
        stamped: list[int] = []
        pending.pop()(lambda: stamped.append(stamps.bump(key, gone)))
        return stamped[0]

    return twin(stamps, bump=bump)


def _timed_out(*args: Any, **kwargs: Any) -> Any:
    raise OperationTimeoutError("timed out: the node hung")


@pytest.mark.parametrize("call", ["touch", "incr"])
def test_a_call_stamped_between_an_outage_write_s_stamp_and_its_landing_never_answers_older(
    server: MemcachedServer, directory: str, call: str
) -> None:
    # A touch or incr reads the stamp its key's value lies under, then stamps; another
    # process's outage set journals and stamps in between, and lands after the touch's
    # or incr's stamp: its landing is skipped. The touch or incr, made on disk, must not
    # then answer from the entry before the set (an acknowledged set would be undone).
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store = tier(cache)
    log.set(cache, 0, "k", 5)
    assert store.flush(LANDING_WAIT)
    wire = cache.wire_key("k")

    def outage_set_around(bump: Callable[[], None]) -> None:
        tier(other).node_failed(0)
        with _outage_write_held(tier(other), bump):  # its landing after this bump
            log.set(other, 1, "k", 7)

    stamps = store.stamps
    store.stamps = _bumps_meanwhile(stamps, outage_set_around)
    with _still(store), _still(tier(other)):
        start = time.monotonic_ns()
        try:
            if call == "touch":
                hung = _Failing(store.blocking, "meta_line", _timed_out)
                touched = run_blocking(store.touch(hung, wire, None))  # type: ignore[arg-type]
            else:
                value = run_blocking(store.incr(store.blocking, wire, 1))
                log.record(Op(0, INCR, "k", value, start, time.monotonic_ns(), True))
        finally:
            store.stamps = stamps
        if call == "touch":
            assert touched is False  # the value before the set does not count
        else:
            assert value is None  # missing: neither 6 (counted on 5) nor 8
        assert log.get(cache, 0, "k") is None  # never 5
        assert log.get(other, 1, "k") is None
    assert log.stale_reads() == []


# -- an increment memcached refused (its value not a number) --------------------------------


def _text_set(log: Log, cache: FastCache, process: int, key: str, text: str) -> None:
    start = time.monotonic_ns()
    cache.set(key, text, timeout=None)
    log.record(Op(process, SET, key, text, start, time.monotonic_ns(), True))


def _calling_after(client: BlockingClient, method: str, hook: Callable[[], None]) -> Any:
    """A twin of ``client`` that runs ``hook`` once, just after its first call of the
    coroutine method ``method`` returned."""
    original = getattr(client, method)
    pending: list[Callable[[], None]] = [hook]

    async def call(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        if pending:
            pending.pop()()
        return result

    return twin(client, **{method: call})


@pytest.mark.parametrize("when", ["before its read", "after its read", "while it waits"])
def test_a_refused_increment_s_disk_copy_never_hides_a_later_write(
    server: MemcachedServer, directory: str, when: str
) -> None:
    # An increment memcached refuses (the key holds text) stamped the key, hiding its
    # disk copy; it reads memcached's value and, when the copy holds the same and no
    # write was stamped since, queues the copy again under its own stamp. Another
    # process's write lands in memcached just before that read, just after it, or once
    # the copy waits in the queue: memcached then loses everything. The text must never
    # come back over the other write (its value, or a miss).
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store, wire = tier(cache), cache.wire_key("t")
    _text_set(log, cache, 0, "t", "first text")
    assert store.flush(LANDING_WAIT)

    def other_writes() -> None:
        _text_set(log, other, 1, "t", "other text")

    if when == "before its read":
        client = calling_first(store.blocking, "get", other_writes)
    elif when == "after its read":
        client = _calling_after(store.blocking, "get", other_writes)
    else:
        client = store.blocking
        store.behind.pause()  # the copy queued again stays queued
    with pytest.raises(ClientError, match="non-numeric"):
        run_blocking(store.incr(client, wire, 1))  # type: ignore[arg-type]
    if when == "while it waits":
        assert len(store.behind) == 1  # the copy, queued again under the increment's stamp
        other_writes()
        store.behind.resume()
    assert store.flush(LANDING_WAIT)
    assert tier(other).flush(LANDING_WAIT)
    server.restart()  # same port, empty
    for reader, process in ((cache, 0), (other, 1)):
        assert log.get(reader, process, "t") in ("other text", None)
    assert log.stale_reads() == []


def test_a_refused_increment_leaves_the_key_s_value_on_disk(
    server: MemcachedServer, directory: str
) -> None:
    # The same without another write: the copy answers again once memcached lost the key.
    log = Log()
    cache, other = make(server.location, directory, 0), make(server.location, directory, 1)
    store = tier(cache)
    _text_set(log, cache, 0, "t", "text")
    assert store.flush(LANDING_WAIT)
    with pytest.raises(TypeError):
        cache.incr("t")
    assert store.flush(LANDING_WAIT)
    server.restart()
    assert log.get(other, 1, "t") == "text"
    assert log.stale_reads() == []
