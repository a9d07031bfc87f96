"""The writer behind lands a burst at once, in batches, instead of waiting out its interval."""

from __future__ import annotations

import time
from pathlib import Path

from django_fastcache.disk import DiskStore
from django_fastcache.disk.stamps import WriteStamps
from django_fastcache.disk.writebehind import BATCH, WriteBehind

DEADLINE = 30.0


def test_a_burst_of_a_batch_lands_before_the_interval_ends(tmp_path: Path) -> None:
    store = DiskStore(str(tmp_path / "values"), shards=2)
    stamps = WriteStamps(str(tmp_path / "stamps.state"))
    # An interval no test outlives: only the burst can make the writer land again.
    writer = WriteBehind(store, stamps, interval=3600.0)
    try:

        def put(key: bytes) -> None:
            writer.put(key, stamps.bump(key), b"v", 0, None, time.time())

        put(b"first")  # wakes the idle writer, which lands it, then waits the interval
        deadline = time.monotonic() + DEADLINE
        while writer.landed < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.landed == 1
        keys = [b"k%d" % n for n in range(BATCH + 1)]
        for key in keys:
            put(key)
        deadline = time.monotonic() + DEADLINE
        while writer.landed < 1 + len(keys) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.landed == 1 + len(keys)
        assert all(store.get(key) is not None for key in keys)
    finally:
        writer.flush()
        store.close()
