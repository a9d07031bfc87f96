"""The writer behind lands a burst at once, in batches, instead of waiting out its interval
(even when two puts race past BATCH); the process's exit waits for a batch being landed,
not only for the queue."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_fastcache.disk import DiskStore, writebehind
from django_fastcache.disk.stamps import WriteStamps
from django_fastcache.disk.store import Landing
from django_fastcache.disk.writebehind import BATCH, WriteBehind

DEADLINE = 30.0


def wait_until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + DEADLINE
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


class WatchedWake(threading.Event):
    """The writer's wake-up event, telling which wait the writer is in: "idle" (for a
    write) or "interval" (letting writes gather), None when in neither."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: str | None = None

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting = "idle" if timeout is None else "interval"
        try:
            return super().wait(timeout)
        finally:
            self.waiting = None


def make_writer(tmp_path: Path) -> tuple[DiskStore, WriteStamps, WriteBehind]:
    """A store of two shards, its stamps, and a writer behind them whose interval no test
    outlives: it lands again only when woken (a first write, a burst, a flush)."""
    store = DiskStore(str(tmp_path / "values"), shards=2)
    stamps = WriteStamps(str(tmp_path / "stamps.anchor"), shm_root=str(tmp_path))
    return store, stamps, WriteBehind(store, stamps, interval=3600.0)


def start_idle(writer: WriteBehind) -> WatchedWake:
    """Start ``writer``'s thread with nothing queued; back once it waits, idle, with no
    wake-up pending (a first put's own wake-up may otherwise come after the writer took
    the write, and cut its first interval short)."""
    wake = writer._wake = WatchedWake()
    writer._notify()
    assert wait_until(lambda: wake.waiting == "idle" and not wake.is_set())
    return wake


class RacingQueue(collections.deque[Any]):
    """A queue on which the put that finds BATCH - 1 writes queued is overtaken, between its
    len() and its append, by another thread's whole put: neither sees BATCH queued."""

    def __init__(self) -> None:
        super().__init__()
        self.other_put: Callable[[], None] | None = None

    def __len__(self) -> int:
        length = super().__len__()
        other, self.other_put = self.other_put, None
        if length == BATCH - 1 and other is not None:
            other()  # the other thread's put: it reads BATCH - 1 too, and appends
            return length  # what this put had read before it
        self.other_put = other
        return length


def test_a_burst_of_a_batch_lands_before_the_interval_ends(tmp_path: Path) -> None:
    store, stamps, writer = make_writer(tmp_path)
    wake = start_idle(writer)
    try:

        def put(key: bytes) -> None:
            writer.put(key, stamps.bump(key), b"v", 0, None, time.time())

        put(b"first")  # wakes the idle writer, which lands it, then waits the interval
        assert wait_until(lambda: writer.landed == 1 and wake.waiting == "interval")
        keys = [b"k%d" % n for n in range(BATCH + 1)]
        for key in keys:
            put(key)
        assert wait_until(lambda: writer.landed == 1 + len(keys))
        assert all(store.get(key) is not None for key in keys)
    finally:
        writer.flush()
        store.close()


def test_a_burst_wakes_the_writer_when_two_puts_race_past_a_batch(tmp_path: Path) -> None:
    store, stamps, writer = make_writer(tmp_path)  # only a burst lands again
    queue = writer._queue = RacingQueue()
    wake = start_idle(writer)
    try:

        def put(key: bytes) -> None:
            writer.put(key, stamps.bump(key), b"v", 0, None, time.time())

        put(b"first")
        assert wait_until(lambda: writer.landed == 1 and wake.waiting == "interval")
        keys = [b"k%d" % n for n in range(BATCH + 100)]
        queue.other_put = lambda: put(b"other")
        for key in keys:
            put(key)
        assert queue.other_put is None  # the race was played
        assert wait_until(lambda: writer.landed >= 1 + len(keys))
    finally:
        writer.flush()
        store.close()


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
        writer.put(b"k", stamps.bump(b"k"), b"v", 0, None, time.time())
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
        writer.put(b"a", stamps.bump(b"a"), b"v", 0, None, time.time())
        thread = writer._writer_thread
        assert thread is not None
        assert writer.stop(DEADLINE)
        assert not thread.is_alive()  # it no longer holds the writer (and its store)
        assert store.get(b"a") is not None  # landed first
        writer.put(b"b", stamps.bump(b"b"), b"v", 0, None, time.time())
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
        writer.put(b"k", stamps.bump(b"k"), b"v", 0, None, time.time())
        assert wait_until(lambda: writer.landed == 1)
        thread = writer._writer_thread
        assert thread is not None
        assert thread.native_id is not None
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == caller_policy  # the request threads keep theirs
    finally:
        writer.flush()
        store.close()
