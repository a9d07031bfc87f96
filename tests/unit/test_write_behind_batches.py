"""The writer behind lands a write once it is its minimum age old (sooner when a flush asks),
and a burst of due writes in batches one after another, without waiting out its interval;
the process's exit waits for a batch being landed, not only for the queue."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_fastcache.disk import DiskStore, writebehind
from django_fastcache.disk.stamps import WriteStamps, slot_of
from django_fastcache.disk.store import Landing
from django_fastcache.disk.writebehind import BATCH, WriteBehind

DEADLINE = 30.0
#: Longer than any test: a write this young never comes of age within one.
FOREVER = 3600.0


def wait_until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + DEADLINE
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


class WatchedWake(threading.Event):
    """The writer's wake-up event, telling how long the writer waits in it now: None when
    it is not waiting, ``math.inf`` when it waits for a write."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: float | None = None

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting = float("inf") if timeout is None else timeout
        try:
            return super().wait(timeout)
        finally:
            self.waiting = None


def make_writer(
    tmp_path: Path, min_age: float = writebehind.MIN_AGE
) -> tuple[DiskStore, WriteStamps, WriteBehind]:
    """A store of two shards, its stamps, and a writer behind them whose interval no test
    outlives: after a landing it lands again only when woken (a first write, a flush), or
    at once when more writes are due."""
    store = DiskStore(str(tmp_path / "values"), shards=2)
    stamps = WriteStamps(str(tmp_path / "stamps.anchor"), shm_root=str(tmp_path))
    return store, stamps, WriteBehind(store, stamps, interval=FOREVER, min_age=min_age)


@contextlib.contextmanager
def running_writer(
    tmp_path: Path, min_age: float = writebehind.MIN_AGE
) -> Iterator[tuple[DiskStore, WriteStamps, WriteBehind]]:
    """:func:`make_writer`'s writer, stopped (and its store closed) after the block."""
    store, stamps, writer = make_writer(tmp_path, min_age)
    try:
        yield store, stamps, writer
    finally:
        writer.stop(DEADLINE)
        store.close()


def put(writer: WriteBehind, stamps: WriteStamps, key: bytes, written_at: float) -> None:
    writer.put(key, slot_of(key), stamps.bump(key), b"v", 0, None, written_at)


def test_a_write_waits_its_minimum_age_unless_a_flush_asks_for_it(tmp_path: Path) -> None:
    with running_writer(tmp_path, min_age=FOREVER) as (store, stamps, writer):
        wake = writer._wake = WatchedWake()
        put(writer, stamps, b"young", time.time())
        # The writer waits for the write to come of age, not for another write.
        assert wait_until(lambda: wake.waiting is not None and wake.waiting > DEADLINE)
        assert wake.waiting != float("inf")
        assert (writer.landed, len(writer)) == (0, 1)
        assert writer.flush(DEADLINE)
        assert (writer.landed, len(writer)) == (1, 0)
        assert store.get(b"young") is not None


def test_until_its_first_landing_a_writer_waits_a_random_part_of_its_interval_more(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Processes started together would land together, once an interval, as long as writes
    keep coming: each writer's first landing waits a random part of the interval more than
    the minimum age, and the landings after it do not."""
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return 123.0

    monkeypatch.setattr(random, "uniform", uniform)
    with running_writer(tmp_path, min_age=FOREVER) as (store, stamps, writer):
        wake = writer._wake = WatchedWake()
        put(writer, stamps, b"first", time.time())
        assert wait_until(lambda: wake.waiting is not None and wake.waiting > DEADLINE)
        assert drawn == [(0.0, FOREVER)]
        assert FOREVER + 123.0 - DEADLINE < wake.waiting <= FOREVER + 123.0
        assert writer.flush(DEADLINE)  # the first landing
        put(writer, stamps, b"second", time.time())
        assert wait_until(lambda: wake.waiting is not None and wake.waiting > DEADLINE)
        assert wake.waiting <= FOREVER
        assert store.get(b"first") is not None
    assert len(drawn) == 1


def test_a_write_of_age_at_the_writer_s_start_does_not_wait_its_phase(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(random, "uniform", lambda _low, high: high)
    with running_writer(tmp_path) as (store, stamps, writer):
        put(writer, stamps, b"due", time.time() - 2 * writebehind.MIN_AGE)
        assert wait_until(lambda: writer.landed == 1)  # not FOREVER later
        assert store.get(b"due") is not None


def test_writes_of_age_land_without_a_flush_and_younger_ones_wait(tmp_path: Path) -> None:
    with running_writer(tmp_path, min_age=FOREVER) as (store, stamps, writer):
        put(writer, stamps, b"old", time.time() - 2 * FOREVER)
        put(writer, stamps, b"young", time.time())
        assert wait_until(lambda: writer.landed == 1)
        assert len(writer) == 1  # the young one, still queued
        assert store.get(b"old") is not None
        assert store.get(b"young") is None


def test_a_write_made_later_than_now_lands_at_once(tmp_path: Path) -> None:
    # The wall clock was set back since the write was made: its age says nothing, and the
    # queue must not wait for the clock to catch up.
    with running_writer(tmp_path, min_age=FOREVER) as (_store, stamps, writer):
        put(writer, stamps, b"k", time.time() + 2 * FOREVER)
        assert wait_until(lambda: writer.landed == 1)


def test_a_burst_of_due_writes_lands_in_batches_one_after_another(
    tmp_path: Path, monkeypatch: Any
) -> None:
    batches: list[int] = []
    keys = [b"k%d" % n for n in range(2 * BATCH + 5)]
    with running_writer(tmp_path) as (store, stamps, writer):
        land = store.land

        def counted_land(writes: list[Landing], current: Callable[[bytes], int]) -> tuple[int, int]:
            batches.append(len(writes))
            return land(writes, current)

        monkeypatch.setattr(store, "land", counted_land)
        writer.pause()  # all queued before the first batch is taken
        for key in keys:
            put(writer, stamps, key, time.time() - 10.0)
        writer.resume()
        # The writer does not wait out its interval between them (no test outlives it).
        assert wait_until(lambda: writer.landed == len(keys))
        assert batches == [BATCH, BATCH, 5]
        assert all(store.get(key) is not None for key in keys)


def test_the_exit_waits_for_a_batch_being_landed(tmp_path: Path, monkeypatch: Any) -> None:
    store, stamps, writer = make_writer(tmp_path)
    landing, go = threading.Event(), threading.Event()
    land = store.land

    def slow_land(writes: list[Landing], current: Callable[[bytes], int]) -> tuple[int, int]:
        landing.set()
        go.wait(DEADLINE)
        return land(writes, current)

    monkeypatch.setattr(store, "land", slow_land)
    monkeypatch.setattr(writebehind, "_queues", {writer.handle})
    landed_at_exit: list[int] = []
    try:
        # (Of age already: due at once, whatever the writer's phase.)
        put(writer, stamps, b"k", time.time() - 2 * writebehind.MIN_AGE)
        assert landing.wait(DEADLINE)  # the batch is taken off the queue, not landed yet
        assert len(writer) == 0

        def exiting() -> None:
            writebehind._land_at_exit()
            landed_at_exit.append(writer.landed)

        exit_thread = threading.Thread(target=exiting)
        exit_thread.start()
        # Either the exit waits (its flush is queued behind the batch) or it returned.
        assert wait_until(lambda: len(writer) == 1 or not exit_thread.is_alive())
        go.set()
        exit_thread.join(DEADLINE)
        assert landed_at_exit == [1]
    finally:
        go.set()
        writer.flush()
        store.close()


def test_stop_lands_the_queue_and_ends_the_thread_and_a_later_write_starts_another(
    tmp_path: Path,
) -> None:
    store, stamps, writer = make_writer(tmp_path)
    try:
        writer.put(b"a", slot_of(b"a"), stamps.bump(b"a"), b"v", 0, None, time.time())
        thread = writer._writer_thread
        assert thread is not None
        assert writer.stop(DEADLINE)
        assert not thread.is_alive()  # it no longer holds the writer (and its store)
        assert store.get(b"a") is not None  # landed first
        writer.put(b"b", slot_of(b"b"), stamps.bump(b"b"), b"v", 0, None, time.time())
        assert writer.flush(DEADLINE)
        assert writer._writer_thread is not thread
        assert store.get(b"b") is not None
    finally:
        writer.stop(DEADLINE)
        store.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's batch scheduling class")
def test_the_writer_runs_in_the_batch_scheduling_class_and_the_caller_does_not(
    tmp_path: Path,
) -> None:
    store, stamps, writer = make_writer(tmp_path)
    caller_policy = os.sched_getscheduler(0)
    try:
        put(writer, stamps, b"k", time.time() - 2 * writebehind.MIN_AGE)
        assert wait_until(lambda: writer.landed == 1)
        thread = writer._writer_thread
        assert thread is not None
        assert thread.native_id is not None
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == caller_policy  # the request threads keep theirs
    finally:
        writer.flush()
        store.close()


@pytest.mark.parametrize(
    "write",
    [
        (b"key", (1 << 62) - 1, b"value", 0, None, 1_700_000_000.25),
        (b"k" * 250, 5, b"", 2**32 - 1, 1_700_000_100.5, 0.0),
        (b":1:deleted", 2, None, 0, None, 123.0),
        (b"x", 7, bytes(range(256)) * 1000, 64, -1.0, 1e9),
    ],
)
def test_a_queued_write_comes_back_as_it_was_put(write: Landing) -> None:
    key, *rest = write
    assert writebehind.landing(writebehind.record(key, slot_of(key), *rest)) == write


def test_queued_writes_hold_nothing_the_garbage_collector_counts(tmp_path: Path) -> None:
    """A write waits seconds in the queue: as a tuple it counted toward the collector's
    next collection until it landed, so that a busy process collected every 700 writes and
    promoted the queue's writes to the older generations (full collections more often).
    Queued as bytes, a thousand writes leave the count where it was."""
    import gc

    with running_writer(tmp_path, min_age=FOREVER) as (_store, stamps, writer):
        writer.pause()
        stamp = stamps.bump(b"warm")
        writer.put(
            b"warm", slot_of(b"warm"), stamp, b"v" * 100, 0, None, time.time()
        )  # starts the thread
        was_enabled = gc.isenabled()
        gc.disable()  # (counts still move; no collection resets them meanwhile)
        try:
            before = gc.get_count()[0]
            for index in range(1000):
                writer.put(
                    b"k%d" % index, slot_of(b"k%d" % index), stamp, b"v" * 100, 0, 1e10, time.time()
                )
            grown = gc.get_count()[0] - before
        finally:
            if was_enabled:
                gc.enable()
        assert len(writer) == 1001
        assert grown < 100, f"the collector's count grew by {grown} over 1,000 queued writes"
        writer.resume()


def test_a_record_s_stamp_is_checked_from_its_head_alone(tmp_path: Path) -> None:
    """The writer tells an overtaken write (most of them, under several processes) from its
    record's stamp and the key's slot, put in the record by the request that found it:
    the check neither hashes the key nor reads past the head."""
    stamps = WriteStamps(str(tmp_path / "stamps.anchor"), shm_root=str(tmp_path))
    older = stamps.bump(b"key")
    latest = stamps.bump(b"key")
    words = stamps.words_now()
    assert words is not None
    key, value = b"key", b"v" * 1000
    for stamp, expected in ((older, False), (latest, True)):
        item = writebehind.record(key, slot_of(key), stamp, value, 0, None, time.time())
        head = item[: len(item) - len(key) - len(value)]
        assert writebehind.still_current(item, words) is expected
        assert writebehind.still_current(head, words) is expected
    # Another key's slot in the record: its stamp, not the key's, decides.
    other = next(k for k in (b"o%d" % i for i in range(100)) if slot_of(k) != slot_of(key))
    item = writebehind.record(key, slot_of(other), latest, value, 0, None, time.time())
    assert writebehind.still_current(item, words) is False


def test_overtaken_writes_are_skipped_and_the_latest_lands(tmp_path: Path) -> None:
    """Of a key written three times, and another deleted after its write, only the latest
    write lands; the rest count as skipped."""
    with running_writer(tmp_path, min_age=FOREVER) as (store, stamps, writer):
        for value in (b"1", b"2", b"3"):
            writer.put(b"kept", slot_of(b"kept"), stamps.bump(b"kept"), value, 0, None, time.time())
        writer.put(b"gone", slot_of(b"gone"), stamps.bump(b"gone"), b"x", 0, None, time.time())
        stamps.bump(b"gone", gone=True)
        assert writer.flush(DEADLINE)
        assert (writer.landed, writer.skipped) == (1, 3)
        found = store.get(b"kept")
        assert found is not None
        assert found[0] == b"3"
        assert store.get(b"gone") is None


def test_a_flush_queued_between_writes_leaves_each_write_whole(tmp_path: Path) -> None:
    """With a flush waiting between queued writes, the writer takes the queue apart write
    by write, lands every write with its own key, value and flags, and releases the
    flush."""
    with running_writer(tmp_path, min_age=FOREVER) as (store, stamps, writer):
        writer.pause()
        first = [(b"a", b"1", 1), (b"b", None, 0)]  # (None: a delete)
        second = [(b"c", b"3" * 700, 3)]
        stamps_of = {key: stamps.bump(key) for key, _, _ in first + second}
        for key, data, flags in first:
            writer.put(key, slot_of(key), stamps_of[key], data, flags, None, time.time())
        flushed: list[bool] = []
        flusher = threading.Thread(target=lambda: flushed.append(writer.flush(DEADLINE)))
        flusher.start()
        assert wait_until(lambda: len(writer) == 3)  # the two writes and the flush
        for key, data, flags in second:
            writer.put(key, slot_of(key), stamps_of[key], data, flags, 1e10, time.time())
        assert len(writer) == 4  # three writes and the flush
        assert writer.lag() >= 0.0
        writer.resume()
        flusher.join(DEADLINE)
        assert flushed == [True]
        assert writer.flush(DEADLINE)
        assert (writer.landed, writer.skipped, len(writer)) == (3, 0, 0)
        for key, data, flags in first + second:
            found = store.get(key)
            if data is None:
                assert found is None
            else:
                assert found is not None
                assert (found[0], found[1]) == (data, flags)


def test_writes_queued_from_several_threads_at_once_land_whole(tmp_path: Path) -> None:
    """Each write goes into the queue in one step: threads queueing at once (a threaded
    server's requests), with the interpreter switching threads as often as it can, never
    interleave one write's parts with another's."""
    threads, writes = 4, 500
    with running_writer(tmp_path, min_age=FOREVER) as (store, stamps, writer):

        def queue_writes(thread: int) -> None:
            for index in range(writes):
                key = b"t%d-%d" % (thread, index)
                data = b"%d" % index * (1 + index % 7)
                writer.put(key, slot_of(key), stamps.bump(key), data, thread, None, time.time())

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            workers = [threading.Thread(target=queue_writes, args=(n,)) for n in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(DEADLINE)
        finally:
            sys.setswitchinterval(interval)
        assert len(writer) == threads * writes
        assert writer.flush(DEADLINE)
        assert (writer.landed, writer.skipped) == (threads * writes, 0)
        for thread in range(threads):
            for index in range(writes):
                found = store.get(b"t%d-%d" % (thread, index))
                assert found is not None
                assert (found[0], found[1]) == (b"%d" % index * (1 + index % 7), thread)
