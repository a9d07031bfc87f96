"""A request thread beside the writer behind: how landing rows slows the process's requests.

    python bench/writer_beside_requests.py [--rows 600] [--rounds 5] [--load 3]

The writer behind lands its batches in a thread of the request process, and a thread that
needs the interpreter's lock waits while the writer holds it. One process, its own
memcached: the main thread makes gets in a loop for a second and times each; beside it a
thread lands ``--rows`` rows per transaction, again and again (far more often than the
writer behind does: this measures the interference, not its share), either

* ``none``: nothing (the baseline),
* ``per-row``: ``executemany`` of a one-row upsert (one SQLite step per row, the lock taken
  back after each),
* ``multi-row``: the writer's own upserts of up to 64 rows (``_upsert_all``).

``--load N`` starts N busy loops (processes) first, so that the CPUs are taken, as under
cachebench's eight processes on two vCPUs. Rounds interleave the modes; the median round
of each figure is printed: gets per second, median, P90, P99 and max latency in µs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import diskcache

from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.disk.store import _Row, _upsert, _upsert_all, as_blob
from django_fastcache.testing.servers import MemcachedServer

MODES = ("none", "per-row", "multi-row")


def _busy() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load", type=int, default=3, help="busy processes started first")
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for hog in hogs:
        hog.start()
    server = MemcachedServer()
    server.start()
    try:
        client = BlockingClient(Cluster([server.location], ClientSettings()))
        client.store_now(b"set", b"k", b"v" * 100, 0, 0, True)
        cache = diskcache.Cache(tempfile.mkdtemp(), statistics=False, cull_limit=0)
        rng = random.Random(0)
        now = time.time()
        rows: list[_Row] = [
            (as_blob(b":1:%d" % n), now, None, now, as_blob(b"x" * rng.randrange(20, 300)))
            for n in range(args.rows)
        ]
        mode = ["none"]
        stop = threading.Event()

        def writer() -> None:
            con = cache._con  # the writer thread's own connection
            per_row = _upsert(1)
            while not stop.is_set():
                if mode[0] == "none":
                    time.sleep(0.01)
                    continue
                con.execute("BEGIN IMMEDIATE")
                if mode[0] == "per-row":
                    con.executemany(per_row, rows)
                else:
                    _upsert_all(con, rows)
                con.execute("COMMIT")
                time.sleep(0.002)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        figures: dict[str, list[tuple[float, ...]]] = {m: [] for m in MODES}
        for _round in range(args.rounds):
            for name in MODES:
                mode[0] = name
                time.sleep(0.05)
                latencies = []
                end = time.monotonic() + 1.0
                clock = time.perf_counter_ns
                while time.monotonic() < end:
                    began = clock()
                    client.value_now(b"k", True)
                    latencies.append(clock() - began)
                latencies.sort()
                n = len(latencies)
                figures[name].append(
                    (
                        n,
                        latencies[n // 2] / 1e3,
                        latencies[n * 9 // 10] / 1e3,
                        latencies[n * 99 // 100] / 1e3,
                        latencies[-1] / 1e3,
                    )
                )
        stop.set()
        thread.join()
    finally:
        server.stop()
        for hog in hogs:
            hog.terminate()
    print(f"{args.rows} rows per transaction, {args.load} busy processes, median of rounds")
    print(f"{'':10}{'gets/s':>10}{'median':>10}{'P90':>10}{'P99':>10}{'max':>10}")
    for name in MODES:
        row = [statistics.median(r[i] for r in figures[name]) for i in range(5)]
        print(f"{name:10}{row[0]:10.0f}" + "".join(f"{v:10.1f}" for v in row[1:]))


if __name__ == "__main__":
    main()
