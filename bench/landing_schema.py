"""What a landing would cost in a table of the disk tier's own, against diskcache's rows.

    python bench/landing_schema.py [--procs 8] [--rounds 3] [--seconds 8] [--interval 0.5]
        [--draws 200] [--schemas tier,own-indexed,own-plain]

The writer behind lands its writes into diskcache's ``Cache`` table (a unique index on the
key, indexes on the expiry and store times, triggers that keep the shard's count and size),
which it shares with diskcache's own calls. A table of the tier's own would need fewer, at
the price of a new disk format. This measures the bound of that lever, on SQLite alone:

* ``--procs`` processes start together and, every ``--interval`` seconds, each land
  ``--draws`` keys drawn from cachebench's 1,100 (values of cachebench's sizes, with the
  tier's header) into 8 shards, one transaction per shard, in step: the shape of
  cachebench's tiered row, whose eight writers land together;
* ``tier``: the statements ``DiskStore.land`` runs (its multi-row upserts) on shards made
  by diskcache with ``DiskStore``'s settings (synchronous off, no culling in a write);
  ``own-indexed``: a table keyed by the key (``WITHOUT ROWID``) with the store time
  indexed, which culling by age would need;
  ``own-plain``: the key and value alone, no index but the key (no culling order);
* each landing's CPU (``time.thread_time``) is kept, each process's first (which opens its
  shards) left out; rounds run the schemas in turns, reversed every other round; the
  median landing per round is printed.

The stamp checks and encoding that come before a landing's statements are the same for
every schema and are not run here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import diskcache

from django_fastcache.disk import store

KEYS = 1100
SHARDS = 8
# The pragmas the tier's shards run with (diskcache's, and synchronous off: DiskStore).
PRAGMAS = ("journal_mode=wal", "synchronous=0", "mmap_size=67108864", "cache_size=8192")

OWN_TABLES = {
    "own-indexed": (
        "CREATE TABLE IF NOT EXISTS Entry (key BLOB PRIMARY KEY, store_time REAL,"
        " expire_time REAL, value BLOB) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS Entry_store_time ON Entry(store_time)",
    ),
    "own-plain": (
        "CREATE TABLE IF NOT EXISTS Entry (key BLOB PRIMARY KEY, expire_time REAL, value BLOB)"
        " WITHOUT ROWID",
    ),
}


def own_upsert(schema: str, rows: int) -> str:
    if schema == "own-plain":
        return (
            "INSERT INTO Entry(key, expire_time, value) VALUES "
            + ",".join(["(?, ?, ?)"] * rows)
            + " ON CONFLICT(key) DO UPDATE SET expire_time = excluded.expire_time,"
            " value = excluded.value"
        )
    return (
        "INSERT INTO Entry(key, store_time, expire_time, value) VALUES "
        + ",".join(["(?, ?, ?, ?)"] * rows)
        + " ON CONFLICT(key) DO UPDATE SET store_time = excluded.store_time,"
        " expire_time = excluded.expire_time, value = excluded.value"
    )


OWN_UPSERTS = {
    schema: {rows: own_upsert(schema, rows) for rows in store._UPSERT_SIZES}
    for schema in OWN_TABLES
}


def connect(schema: str, directory: str, index: int) -> sqlite3.Connection:
    path = os.path.join(directory, f"{index:03d}")
    if schema == "tier":
        # diskcache makes the shard (its table, indexes and triggers), as the tier's does.
        diskcache.Cache(
            path, eviction_policy="least-recently-stored", sqlite_synchronous=0, cull_limit=0
        ).close()
        name = "cache.db"
    else:
        os.makedirs(path, exist_ok=True)
        name = "own.db"
    con = sqlite3.connect(os.path.join(path, name), timeout=60, isolation_level=None)
    for pragma in PRAGMAS:
        con.execute("PRAGMA " + pragma)
    for statement in OWN_TABLES.get(schema, ()):
        con.execute(statement)
    return con


def land(schema: str, cons: list[sqlite3.Connection], by_shard: dict[int, list[Any]]) -> None:
    now = time.time()
    for index, rows in by_shard.items():
        con = cons[index]
        con.execute("BEGIN IMMEDIATE")
        if schema == "tier":
            store._upsert_all(con, [(key, now, None, now, value) for key, value in rows])
        else:
            statements = OWN_UPSERTS[schema]
            first, left = 0, len(rows)
            for size in store._UPSERT_SIZES:
                while left >= size:
                    chunk = rows[first : first + size]
                    if schema == "own-plain":
                        fields = [f for key, value in chunk for f in (key, None, value)]
                    else:
                        fields = [f for key, value in chunk for f in (key, now, None, value)]
                    con.execute(statements[size], fields)
                    first += size
                    left -= size
        con.execute("COMMIT")


def batch(draws: int) -> dict[int, list[tuple[bytes, bytes]]]:
    by_shard: dict[int, list[tuple[bytes, bytes]]] = {}
    for key in {str(random.randrange(KEYS)).encode() for _ in range(draws)}:
        data = str(random.randrange(100_000)).encode() * random.randrange(1, 100)
        value = store._encode(data, 0, time.time(), 1)
        by_shard.setdefault(zlib.adler32(key) % SHARDS, []).append((key, value))
    return by_shard


def worker(schema: str, directory: str, seed: int, start: float, args: Any, out: Any) -> None:
    random.seed(seed)
    cons = [connect(schema, directory, index) for index in range(SHARDS)]
    costs: list[float] = []
    due = start
    while True:
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        if time.time() > start + args.seconds:
            break
        by_shard = batch(args.draws)
        began = time.thread_time()
        land(schema, cons, by_shard)
        costs.append(time.thread_time() - began)
        due += args.interval
    for con in cons:
        con.close()
    out.put(costs[1:])  # the first opened the shards


def run(schema: str, args: Any) -> float:
    directory = tempfile.mkdtemp(prefix="fastcache-landing-")
    try:
        cons = [connect(schema, directory, index) for index in range(SHARDS)]
        prefill: dict[int, list[tuple[bytes, bytes]]] = {}
        for number in range(KEYS):
            key = str(number).encode()
            prefill.setdefault(zlib.adler32(key) % SHARDS, []).append((key, key))
        land(schema, cons, prefill)
        for con in cons:
            con.close()
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        start = time.time() + 1.0
        processes = [
            context.Process(target=worker, args=(schema, directory, seed, start, args, out))
            for seed in range(args.procs)
        ]
        for process in processes:
            process.start()
        costs = [cost for _ in processes for cost in out.get()]
        for process in processes:
            process.join()
        return statistics.median(costs) * 1000
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--schemas", default="tier,own-indexed,own-plain")
    args = parser.parse_args()
    schemas = [name.strip() for name in args.schemas.split(",")]
    for name in schemas:
        if name != "tier" and name not in OWN_TABLES:
            parser.error(f"unknown schema {name!r}")
    medians: dict[str, list[float]] = {name: [] for name in schemas}
    for number in range(args.rounds):
        for name in schemas if number % 2 == 0 else schemas[::-1]:
            medians[name].append(run(name, args))
    print(
        f"CPU per landing, ms (median landing of each round; {args.procs} processes in step, "
        f"{args.draws} draws of {KEYS} keys every {args.interval} s, {SHARDS} shards)"
    )
    base = statistics.median(medians[schemas[0]])
    for name in schemas:
        cells = " ".join(f"{value:6.2f}" for value in medians[name])
        ratio = statistics.median(medians[name]) / base
        print(f"  {name:12} {cells}   median {statistics.median(medians[name]):.2f} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
