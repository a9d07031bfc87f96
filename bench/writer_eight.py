"""The writer behind under cachebench's eight processes: what lands, what is skipped, what
it costs.

    python bench/writer_eight.py [--procs 8] [--ops 100000] [--warmup 2000]
        [--subjects fastcache,tiered] [--rounds 2]

``bench/tier_cpu.py`` measures the writer behind in one process. Under cachebench, eight
processes write the same 1,100 keys, so most of a process's writes are overtaken (by its own
later writes or another process's) before its next group commit and are skipped, and each
transaction finds its shard changed by the other processes' commits since its last. This
runs cachebench's workload (:func:`django_fastcache.bench.workload.run_ops`: 90% get, 9%
set, 1% delete, unpaced) in ``--procs`` forked processes sharing one memcached and, for the
tiered subject, one disk tier, all starting together. Each process first makes
``--warmup`` operations and waits for its writer to land them (so that opening the shards,
which the writer's first landing does, is not counted), then ``--ops`` timed ones, then
waits again for its writer.

Printed per subject and round, over all processes: writes made, landed and skipped; the
writers' CPU (their threads' clocks) per write made and per write landed; the processes'
CPU per operation (every thread); the full collections of the garbage collector during the
timed operations, over all processes (each holds the interpreter's lock for 10 to 25 ms of
CPU in a Django process); and the median over processes of each one's get and set median
and P99 latency, µs. Subjects: ``fastcache`` (disk tier off), ``tiered`` (on),
``pylibmc`` (Django's PyLibMCCache, when installed). Rounds run the subjects in turn.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import django
from django.conf import settings
from tier_cpu import thread_cpu

from django_fastcache.bench.workload import Workload, run_ops
from django_fastcache.compiled import describe
from django_fastcache.testing.servers import MemcachedServer

SUBJECTS = ("fastcache", "tiered", "pylibmc")


def _percentile(samples: Any, fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1e3


def worker(alias: str, index: int, ops: int, warmup: int, start_at: float, results: Any) -> None:
    from django.core.cache import caches

    cache = caches[alias]
    shared = getattr(cache, "_shared", None)
    tiered = None if shared is None else shared().tiered
    behind = None if tiered is None else tiered.behind
    run_ops(cache, Workload(procs=1, ops=warmup + 2, warmup=0), seed=1000 + index)
    if behind is not None:
        behind.flush(30)
    while time.time() < start_at:
        time.sleep(0.001)
    full_collections = [0]

    def count_full(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full_collections[0] += 1

    gc.callbacks.append(count_full)
    writer_before = 0.0 if behind is None else thread_cpu(behind._writer_thread)
    landed_before = 0 if behind is None else behind.landed
    skipped_before = 0 if behind is None else behind.skipped
    cpu_before = time.process_time()
    samples = run_ops(cache, Workload(procs=1, ops=ops + 1, warmup=0), seed=index)
    gc.callbacks.remove(count_full)
    writer = 0.0
    landed = skipped = 0
    if behind is not None:
        behind.flush(30)
        writer = thread_cpu(behind._writer_thread) - writer_before
        landed = behind.landed - landed_before
        skipped = behind.skipped - skipped_before
    gets, sets = samples.samples["get"], samples.samples["set"]
    results.put(
        {
            "process_cpu": time.process_time() - cpu_before,
            "writer_cpu": writer,
            "full_collections": full_collections[0],
            "writes": len(sets) + len(samples.samples["delete"]),
            "landed": landed,
            "skipped": skipped,
            "get": (_percentile(gets, 0.5), _percentile(gets, 0.99)),
            "set": (_percentile(sets, 0.5), _percentile(sets, 0.99)),
        }
    )


def run_subject(alias: str, procs: int, ops: int, warmup: int) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start_at = time.time() + 2.0 + 0.2 * procs
    processes = [
        context.Process(target=worker, args=(alias, index, ops, warmup, start_at, results))
        for index in range(procs)
    ]
    for process in processes:
        process.start()
    found = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    summed = ("process_cpu", "writer_cpu", "writes", "full_collections")
    total = {key: sum(r[key] for r in found) for key in summed}
    total.update(landed=sum(r["landed"] for r in found), skipped=sum(r["skipped"] for r in found))
    for action in ("get", "set"):
        total[action] = tuple(statistics.median(r[action][i] for r in found) for i in (0, 1))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--subjects", default="fastcache,tiered")
    args = parser.parse_args()
    subjects = [s.strip() for s in args.subjects.split(",") if s.strip()]
    for subject in subjects:
        if subject not in SUBJECTS:
            parser.error(f"unknown subject {subject!r}: one of {', '.join(SUBJECTS)}")
    if "pylibmc" in subjects:
        try:
            import pylibmc  # noqa: F401
        except ImportError:
            print("pylibmc is not installed: its subject is skipped", file=sys.stderr)
            subjects.remove("pylibmc")
    directory = tempfile.mkdtemp(prefix="fastcache-writer-eight-")
    try:
        with MemcachedServer() as server:
            caches: dict[str, Any] = {
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                "fastcache": {
                    "BACKEND": "django_fastcache.backends.FastCache",
                    "LOCATION": server.location,
                    "KEY_PREFIX": "fastcache",
                    "OPTIONS": {"disk_tier": False},
                },
                "tiered": {
                    "BACKEND": "django_fastcache.backends.FastCache",
                    "LOCATION": server.location,
                    "KEY_PREFIX": "tiered",
                    "OPTIONS": {"disk_directory": os.path.join(directory, "tiered")},
                },
                "pylibmc": {
                    "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
                    "LOCATION": server.location,
                    "KEY_PREFIX": "pylibmc",
                },
            }
            settings.configure(SECRET_KEY="writer-eight", CACHES=caches)
            django.setup()
            print(
                f"{describe()}; {args.procs} processes x {args.ops} operations "
                f"(after {args.warmup} landed), µs"
            )
            print(
                f"{'round':<6}{'subject':<11}{'writes':>8}{'landed':>8}{'skipped':>9}"
                f"{'writer/write':>14}{'writer/landed':>15}{'process/op':>12}{'full GCs':>10}"
                f"{'get med/P99':>16}{'set med/P99':>16}"
            )
            for round_number in range(1, args.rounds + 1):
                for subject in subjects:
                    found = run_subject(subject, args.procs, args.ops, args.warmup)
                    writes = max(1, found["writes"])
                    per_landed = found["writer_cpu"] / max(1, found["landed"]) * 1e6
                    print(
                        f"{round_number:<6}{subject:<11}{found['writes']:>8}{found['landed']:>8}"
                        f"{found['skipped']:>9}{found['writer_cpu'] / writes * 1e6:>14.1f}"
                        f"{per_landed:>15.1f}"
                        f"{found['process_cpu'] / (args.procs * args.ops) * 1e6:>12.1f}"
                        f"{found['full_collections']:>10}"
                        f"{found['get'][0]:>9.1f}/{found['get'][1]:<6.0f}"
                        f"{found['set'][0]:>9.1f}/{found['set'][1]:<6.0f}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
