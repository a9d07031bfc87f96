"""Do the tiered row's slowest gets fall in the writers' landings?

    python bench/tail_landings.py [--procs 8] [--ops 60000] [--rounds 2]

cachebench's tiered row has a longer tail than the fastcache row. This runs cachebench's
workload (90% get, 9% set, 1% delete over 1,100 keys, unpaced) in ``--procs`` forked
processes on one memcached and one disk tier, starting together after a warm-up each
process's writer landed, and times every call; each process also records when each of its
writer's landings (:meth:`DiskStore.land`, one group commit) began and ended, on the host's
monotonic clock. Then, per round:

* the gets' median and P99, µs;
* the landings: how many, their median and longest wall time, and the share of the run's
  time during which at least one process was landing;
* the share of the slowest 1 % of gets that overlap some process's landing, against the
  share of all gets that do; and the same for their own process's landings.

A slow get overlaps landings more often than gets do overall when the landings are what
slows it: the writers' CPU (one of two vCPUs, here) and, in its own process, the
interpreter's lock. ``--untiered`` runs the fastcache row alike, for its figures.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django
from django.conf import settings

from django_fastcache.compiled import describe
from django_fastcache.testing.servers import MemcachedServer

KEYS = 1100
GET, SET, DELETE = 0, 1, 2

#: A process's findings: its index, its calls' start times, durations and kinds (ns), and
#: its landings (start, end), ns.
Found = tuple[int, "array[int]", "array[int]", "array[int]", list[tuple[int, int]]]


def worker(index: int, ops: int, start_at: float, results: Any) -> None:
    from django.core.cache import caches

    import django_fastcache.disk.store as store

    landings: list[tuple[int, int]] = []
    land = store.DiskStore.land

    def timed_land(self: Any, writes: Any, current: Any) -> Any:
        began = time.monotonic_ns()
        try:
            return land(self, writes, current)
        finally:
            landings.append((began, time.monotonic_ns()))

    store.DiskStore.land = timed_land  # type: ignore[method-assign]
    cache = caches["cache"]
    for count in range(2000):  # the warm-up: the writer's first landing opens the shards
        cache.set(str(count % KEYS).encode(), b"x" * 50)
    tiered = cache._shared().tiered
    if tiered is not None:
        tiered.behind.flush(30)
    landings.clear()
    while time.time() < start_at:
        time.sleep(0.001)
    rng = random.Random(index)
    get, set_, delete = cache.get, cache.set, cache.delete
    starts, durations, kinds = array("q"), array("q"), array("b")
    clock = time.monotonic_ns
    for count in range(ops):
        key = str(rng.randrange(KEYS)).encode()
        value = str(count).encode() * rng.randrange(1, 100)
        choice = rng.random()
        began = clock()
        if choice < 0.90:
            get(key)
            kind = GET
        elif choice < 0.99:
            set_(key, value)
            kind = SET
        else:
            delete(key)
            kind = DELETE
        starts.append(began)
        durations.append(clock() - began)
        kinds.append(kind)
    if tiered is not None:
        tiered.behind.flush(30)
    results.put((index, starts, durations, kinds, landings))


def run_round(procs: int, ops: int) -> list[Found]:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start_at = time.time() + 2.0 + 0.3 * procs
    processes = [
        context.Process(target=worker, args=(index, ops, start_at, results))
        for index in range(procs)
    ]
    for process in processes:
        process.start()
    found: list[Found] = [results.get(timeout=900) for _ in processes]
    for process in processes:
        process.join()
    return found


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, current = 0, None
    for began, ended in sorted(intervals):
        if current is None or began > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [began, ended]
        else:
            current[1] = max(current[1], ended)
    return total if current is None else total + current[1] - current[0]


def _overlapping(intervals: list[tuple[int, int]]) -> Any:
    """A test of whether [began, ended] overlaps one of ``intervals``."""
    ordered = sorted(intervals)
    starts = [began for began, _ended in ordered]
    longest = max((ended - began for began, ended in ordered), default=0)

    def overlaps(began: int, ended: int) -> bool:
        index = bisect.bisect_right(starts, ended) - 1
        while index >= 0 and ordered[index][0] >= began - longest:
            if ordered[index][1] >= began:
                return True
            index -= 1
        return False

    return overlaps


def report(found: list[Found]) -> str:
    gets: list[tuple[int, int, int]] = []  # (duration, start, process)
    landings: list[tuple[int, int]] = []
    own: dict[int, Any] = {}
    first, last = None, 0
    for index, starts, durations, kinds, process_landings in found:
        for began, took, kind in zip(starts, durations, kinds, strict=True):
            if kind == GET:
                gets.append((took, began, index))
        first = min(starts[0], first if first is not None else starts[0])
        last = max(last, starts[-1] + durations[-1])
        landings += process_landings
        own[index] = _overlapping(process_landings)
    gets.sort()
    median, p99 = gets[len(gets) // 2][0], gets[int(len(gets) * 0.99)][0]
    slowest = [g for g in gets if g[0] >= p99]
    anyone = _overlapping(landings)

    def share(selection: list[tuple[int, int, int]], test: Any) -> float:
        return sum(test(g[1], g[1] + g[0], g[2]) for g in selection) / max(1, len(selection))

    def in_any(began: int, ended: int, _process: int) -> bool:
        return bool(anyone(began, ended))

    def in_own(began: int, ended: int, process: int) -> bool:
        return bool(own[process](began, ended))

    walls = [(ended - began) / 1e3 for began, ended in landings]
    span = max(1, last - (first or 0))
    return (
        f"get median {median / 1e3:.1f} µs, P99 {p99 / 1e3:.1f} µs; "
        f"{len(landings)} landings, median {statistics.median(walls) if walls else 0:.0f} µs, "
        f"longest {max(walls, default=0):.0f} µs, some process landing "
        f"{_union_length(landings) / span:.1%} of the time\n"
        f"  gets overlapping a landing of any process: slowest 1% {share(slowest, in_any):.1%}, "
        f"all {share(gets, in_any):.1%}; of their own process: slowest 1% "
        f"{share(slowest, in_own):.1%}, all {share(gets, in_own):.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--ops", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--untiered", action="store_true", help="the fastcache row instead")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="fastcache-tail-landings-")
    try:
        with MemcachedServer() as server:
            options: dict[str, Any] = (
                {"disk_tier": False}
                if args.untiered
                else {"disk_directory": os.path.join(directory, "tier")}
            )
            settings.configure(
                SECRET_KEY="tail-landings",
                CACHES={
                    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                    "cache": {
                        "BACKEND": "django_fastcache.backends.FastCache",
                        "LOCATION": server.location,
                        "OPTIONS": options,
                    },
                },
            )
            django.setup()
            row = "fastcache" if args.untiered else "fastcache-tiered"
            print(f"{describe()}; {row}, {args.procs} processes x {args.ops} operations")
            for round_number in range(1, args.rounds + 1):
                print(f"round {round_number}: {report(run_round(args.procs, args.ops))}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
