"""The disk tier's directory belongs to this user alone (its values are unpickled)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from django_fastcache.disk import DiskStore


def test_the_values_directory_is_created_for_this_user_only(tmp_path: Path) -> None:
    directory = tmp_path / "tier" / "values"
    store = DiskStore(str(directory))
    try:
        store.set(b"k", b"v", 0, None)
        entry = store.get(b"k")
        assert entry is not None
        assert entry.data == b"v"
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    finally:
        store.close()


def _files(directory: Path) -> list[str]:
    """diskcache's files of its own (values too large for the database)."""
    return [name for _path, _dirs, names in os.walk(directory) for name in names if ".val" in name]


def test_writes_behind_replace_and_delete_rows_that_hold_files(tmp_path: Path) -> None:
    store = DiskStore(str(tmp_path / "values"), shards=2)
    stamps: dict[bytes, int] = {}
    large = b"L" * 2**16
    try:
        stamps.update({b"a": 1, b"b": 3, b"c": 5})
        landed = store.land(
            [
                (b"a", 1, large, 0, None, 1.0),
                (b"b", 3, large, 0, None, 1.0),
                (b"c", 5, b"s", 0, None, 1.0),
            ],
            stamps.__getitem__,
        )
        assert landed == (3, 0)
        assert len(_files(tmp_path)) == 2
        held = store.get(b"a")  # read from its file
        assert held is not None
        assert (held.data, held.stamp) == (large, 1)
        # A small value over a row that holds a file, and a delete of one: the files go.
        stamps.update({b"a": 7, b"b": 8, b"c": 10})
        landed = store.land(
            [
                (b"a", 7, b"small", 0, None, 2.0),
                (b"b", 8, None, 0, None, 2.0),
                (b"c", 10, None, 0, None, 2.0),
            ],
            stamps.__getitem__,
        )
        assert landed == (3, 0)
        entry = store.get(b"a")
        assert entry is not None
        assert (entry.data, entry.stamp) == (b"small", 7)
        assert store.get(b"b") is None
        assert store.get(b"c") is None
        assert _files(tmp_path) == []
    finally:
        store.close()


def test_writes_behind_overtaken_are_skipped(tmp_path: Path) -> None:
    store = DiskStore(str(tmp_path / "values"), shards=2)
    try:
        stamps = {b"a": 9, b"b": 11}
        landed = store.land(
            [
                (b"a", 1, b"old", 0, None, 1.0),  # overtaken by stamp 9
                (b"b", 3, b"first", 0, None, 1.0),  # written again in the batch
                (b"b", 11, b"second", 0, None, 1.0),
                (b"a", 5, b"L" * 2**16, 0, None, 1.0),  # large, overtaken too
            ],
            stamps.__getitem__,
        )
        assert landed == (1, 3)
        assert store.get(b"a") is None
        entry = store.get(b"b")
        assert entry is not None
        assert entry.data == b"second"
    finally:
        store.close()


def test_a_batch_overtaken_before_it_lands_takes_no_shard_lock(tmp_path: Path) -> None:
    """Writes overtaken before their batch lands (most are, when processes write the same
    keys) are skipped before any shard's lock is asked for: a batch of them neither waits
    for a lock another process holds nor takes one."""
    import sqlite3

    store = DiskStore(str(tmp_path / "values"), shards=1, lock_wait=0.0)
    try:
        store.set(b"k", b"v", 0, None)  # the shard's database made
        (database,) = tmp_path.glob("values/*/cache.db")
        other = sqlite3.connect(database, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's group commit, say
            landed = store.land(
                [(b"a", 1, b"old", 0, None, 1.0), (b"b", 3, None, 0, None, 1.0)],
                {b"a": 9, b"b": 11}.__getitem__,
            )
            assert landed == (0, 2)
        finally:
            other.close()
    finally:
        store.close()


class _CountingConnection:
    """A shard's SQLite connection, counting the cursors made through it."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self.cursors = 0

    def cursor(self) -> Any:
        self.cursors += 1
        return self._connection.cursor()

    def execute(self, *args: Any) -> Any:
        self.cursors += 1  # (the connection makes one for the statement)
        return self._connection.execute(*args)

    def executemany(self, *args: Any) -> Any:
        self.cursors += 1
        return self._connection.executemany(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def test_landings_make_one_cursor_per_shard_not_one_per_statement(tmp_path: Path) -> None:
    """A connection tracks each cursor it makes by a weak reference until it next sweeps
    them (every 200 cursors), long enough for the garbage collector to promote them: a
    statement per cursor brought a worker full collections it had no other cause for."""
    store = DiskStore(str(tmp_path / "values"), shards=2)
    try:
        store.set(b"k", b"v", 0, None)  # this thread's connections made
        shards = store._shards_now()
        counting = [_CountingConnection(shard._con) for shard in shards]
        for shard, connection in zip(shards, counting):
            shard._local.con = connection
        values = {b"k%d" % n: 2 * n + 1 for n in range(40)}
        stamps = dict(values)
        for landing in range(20):
            gone = b"gone%d" % landing
            stamps[gone] = 7
            writes = [(key, stamp, b"v%d" % landing, 0, None, 1.0) for key, stamp in values.items()]
            assert store.land([*writes, (gone, 7, None, 0, None, 1.0)], stamps.__getitem__) == (
                41,
                0,
            )
        assert [connection.cursors for connection in counting] == [1, 1]
    finally:
        store.close()


@pytest.mark.parametrize("policy", ["least-recently-stored", "least-recently-used"])
def test_reads_answer_alike_whatever_the_eviction_policy(tmp_path: Path, policy: str) -> None:
    """Reads run their SQL straight where diskcache's get records no access, and through
    diskcache's get where it does: the same answers, expiry included."""
    store = DiskStore(str(tmp_path / "values"), eviction_policy=policy)
    try:
        store.set(b"kept", b"v", 3, None, stamp=7, written_at=5.0)
        store.set(b"expired", b"v", 0, 0.001)
        store.set(b"large", b"L" * 2**16, 0, 60)
        entry = store.get(b"kept")
        assert entry is not None
        assert (entry.data, entry.flags, entry.written_at, entry.expire_at, entry.stamp) == (
            b"v",
            3,
            5.0,
            None,
            7,
        )
        large = store.get(b"large")
        assert large is not None
        assert large.data == b"L" * 2**16
        assert large.expire_at is not None
        time.sleep(0.01)  # past the expiry of "expired" (a real clock: diskcache reads it)
        assert store.get(b"expired") is None
        assert store.get(b"absent") is None
    finally:
        store.close()


def test_keys_go_to_the_shard_diskcache_places_them_in(tmp_path: Path) -> None:
    """The tier's own placement of a key is FanoutCache's, which its whole-cache
    operations rely on."""
    store = DiskStore(str(tmp_path / "values"), shards=8)
    try:
        fanout = store._cache()
        keys = [b"", b"k", b"\xff" * 300, *(b"key-%d" % i for i in range(200))]
        assert [store.shard_of(k) for k in keys] == [fanout._hash(k) % 8 for k in keys]
        assert len({store.shard_of(k) for k in keys}) == 8
    finally:
        store.close()


@pytest.mark.parametrize("count", [1, 63, 64, 65, 127, 200])
def test_a_batch_lands_every_row_whatever_its_size(tmp_path: Path, count: int) -> None:
    """A batch's values land in upserts of up to 64 rows each, the rest in smaller ones:
    every row lands once, with its own value, stamp and expiry, and the rows that hold a
    file (here the second, whatever the batch) go to diskcache's own calls."""
    store = DiskStore(str(tmp_path / "values"), shards=1)
    keys = [b"k%d" % n for n in range(count)]
    stamps = {key: 2 * n + 1 for n, key in enumerate(keys)}
    try:
        if count > 1:  # a row holding a file, replaced by a small value below
            assert store.land([(keys[1], 1, b"L" * 2**16, 0, None, 1.0)], {keys[1]: 1}.get) == (
                1,
                0,
            )
        expire_at = time.time() + 3600
        landed = store.land(
            [(key, stamps[key], b"v" + key, 7, expire_at, 2.0) for key in keys],
            stamps.__getitem__,
        )
        assert landed == (count, 0)
        for key in keys:
            entry = store.get(key)
            assert entry is not None
            assert (entry.data, entry.flags, entry.stamp, entry.written_at) == (
                b"v" + key,
                7,
                stamps[key],
                2.0,
            )
            assert entry.expire_at == pytest.approx(expire_at, abs=1.0)
        assert _files(tmp_path) == []
    finally:
        store.close()


def test_a_shard_that_cannot_be_written_loses_only_its_own_writes(tmp_path: Path) -> None:
    """One shard's group commit fails (its lock held elsewhere, for good): the writes of
    the other shards land all the same, and the error counts both."""
    import sqlite3

    from django_fastcache.disk.stamps import WriteStamps, slot_of
    from django_fastcache.disk.store import LandingError
    from django_fastcache.disk.writebehind import WriteBehind

    store = DiskStore(str(tmp_path / "values"), shards=2, timeout=0.001, lock_wait=0.0)
    stamps = WriteStamps(str(tmp_path / "stamps.anchor"), shm_root=str(tmp_path))
    keys = [b"k%d" % n for n in range(40)]
    locked = [key for key in keys if store.shard_of(key) == 0]
    free = [key for key in keys if store.shard_of(key) == 1]
    assert locked
    assert free
    stamp = {key: stamps.bump(key) for key in keys}
    try:
        store.set(locked[0], b"before", 0, None)  # the locked shard's database made
        database = tmp_path / "values" / "000" / "cache.db"
        other = sqlite3.connect(database, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's transaction, stuck
            with pytest.raises(LandingError) as raised:
                store.land(
                    [(key, stamp[key], b"new", 0, None, 1.0) for key in keys], stamps.current
                )
            assert (raised.value.landed, raised.value.skipped, raised.value.failed) == (
                len(free),
                0,
                len(locked),
            )
            assert "write behind failed" in str(raised.value)
            # The writer behind counts the same way: the free shard's writes landed.
            failures: list[int] = []
            writer = WriteBehind(
                store, stamps, on_failure=lambda _error, lost: failures.append(lost)
            )
            writer.pause()  # one batch
            for key in keys:
                writer.put(key, slot_of(key), stamp[key], b"newer", 0, None, 2.0)
            writer.resume()
            assert writer.flush()
            assert (writer.landed, writer.skipped, writer.failed) == (len(free), 0, len(locked))
            assert failures == [len(locked)]
            writer.stop()
        finally:
            other.close()
        for key in free:
            entry = store.get(key)
            assert entry is not None
            assert entry.data == b"newer"
        held = store.get(locked[0])
        assert held is not None
        assert held.data == b"before"
    finally:
        store.close()


def test_a_store_configured_with_other_shards_keeps_to_the_directorys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A deploy changing disk_shards: the new processes must find the entries the old ones
    # wrote (and refuse an add over them), so they keep the directory's number, and say so.
    old = DiskStore(str(tmp_path), shards=8)
    keys = [b"key-%d" % n for n in range(40)]
    for key in keys:
        old.set(key, b"v" + key, 0, None)
    new = DiskStore(str(tmp_path), shards=16)
    fresh = DiskStore(str(tmp_path / "fresh"), shards=16)
    try:
        found = {key: entry.data for key in keys if (entry := new.get(key)) is not None}
        assert found == {key: b"v" + key for key in keys}
        assert "was made with 8 shards" in caplog.text
        assert "disk_shards=16 is not applied" in caplog.text
        assert (tmp_path / "shards").read_text() == "8\n"
        assert fresh.get(b"k") is None
        assert (tmp_path / "fresh" / "shards").read_text() == "16\n"
    finally:
        for store in (old, new, fresh):
            store.close()


def test_two_threads_opening_the_shards_at_once_open_them_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maintenance thread opens the shards ahead of the requests; a request that needs
    them meanwhile waits for those, rather than opening a second set of its own."""
    import threading

    import diskcache

    from django_fastcache.disk import store as store_module

    made: list[object] = []
    second_started = threading.Event()
    real = diskcache.FanoutCache

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(threading.current_thread())
        if len(made) == 1:
            assert second_started.wait(10)
            # The second thread is now waiting for this open, or (were the open not
            # serialized) making one of its own: give it the time to.
            second.join(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(store_module.diskcache, "FanoutCache", counted)
    store = DiskStore(str(tmp_path / "disk"))
    opened: list[tuple[Any, ...]] = []

    def open_second() -> None:
        second_started.set()
        opened.append(store._shards_now())

    second = threading.Thread(target=open_second)
    first = threading.Thread(target=lambda: opened.append(store._shards_now()))
    try:
        first.start()
        assert wait_for(lambda: len(made) == 1)
        second.start()
        first.join(20)
        second.join(20)
        assert len(made) == 1
        assert len(opened) == 2
        assert opened[0] is opened[1]
    finally:
        store.close()


def wait_for(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
