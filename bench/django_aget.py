"""Django-level ``aget`` under concurrency, with autobatching and pipelining on and off.

    python bench/django_aget.py [--seconds 2] [--rounds 3] [--tasks 32] [--nodes 1 4]

Starts its own memcached processes on loopback, stores 100-byte values under a few hundred
keys through the backend, then runs ``--tasks`` tasks on uvloop (stock asyncio with
``--asyncio``), each calling ``cache.aget`` on those keys one after the other for
``--seconds``. The backend runs without its disk tier (``--disk-tier`` to add it). Every
setting and node count is measured once per round, the rounds interleaved, and the best
round of each is kept. Prints gets per second (wall) and the process's CPU time per get,
then each setting's rate as a ratio of the default's (autobatching and pipelining on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Coroutine
from typing import Any

import django
from django.conf import settings

from django_fastcache.testing.servers import MemcachedServer

KEYS = [f"bench:aget:{i}" for i in range(512)]
VALUE = "v" * 100

#: (label, autobatching, pipelining)
SETTINGS = (
    ("autobatching+pipelining", True, True),
    ("pipelining only", False, True),
    ("autobatching only", True, False),
    ("neither", False, False),
)


async def one_run(cache: Any, tasks: int, seconds: float) -> tuple[float, float]:
    """Gets per second and CPU seconds per get."""
    try:
        stop = False
        counts = [0] * tasks

        async def worker(number: int) -> None:
            index, done = number, 0
            while not stop:
                if await cache.aget(KEYS[index % len(KEYS)]) is None:
                    raise RuntimeError("a benchmark key is missing")
                index += tasks
                done += 1
            counts[number] = done

        warmup = time.perf_counter() + min(0.2, seconds / 4)
        while time.perf_counter() < warmup:
            await asyncio.gather(*[cache.aget(KEYS[i]) for i in range(tasks)])
        began, cpu = time.perf_counter(), time.process_time()
        workers = [asyncio.ensure_future(worker(n)) for n in range(tasks)]
        await asyncio.sleep(seconds)
        stop = True
        await asyncio.gather(*workers)
        elapsed, cpu_used = time.perf_counter() - began, time.process_time() - cpu
        total = sum(counts)
        return total / elapsed, cpu_used / total
    finally:
        await cache.client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved; the best is kept")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--connections", type=int, default=4, help="max_connections")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--disk-tier", action="store_true", help="with the disk tier behind")
    parser.add_argument("--asyncio", action="store_true", help="stock asyncio, not uvloop")
    args = parser.parse_args()
    settings.configure(SECRET_KEY="bench", USE_TZ=True)
    django.setup()
    from django_fastcache.backends import FastCache

    run: Any = asyncio.run
    if not args.asyncio:
        import uvloop

        run = uvloop.run

    best: dict[tuple[str, int], tuple[float, float]] = {}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(MemcachedServer()) for _ in range(max(args.nodes))]
        directory = stack.enter_context(tempfile.TemporaryDirectory())

        def make(count: int, autobatching: bool, pipelining: bool) -> Any:
            options: dict[str, Any] = {
                "max_connections": args.connections,
                "operation_timeout": 5.0,
                "autobatching": autobatching,
                "pipelining": pipelining,
                "disk_tier": args.disk_tier,
            }
            if args.disk_tier:
                options["disk_directory"] = f"{directory}/{count}"
            locations = [s.location for s in servers[:count]]
            return FastCache(locations, {"TIMEOUT": None, "OPTIONS": options})

        for count in args.nodes:
            cache = make(count, True, True)
            cache.set_many(dict.fromkeys(KEYS, VALUE))
        for number in range(args.rounds):
            for count in args.nodes:
                for label, autobatching, pipelining in SETTINGS:
                    work: Coroutine[Any, Any, tuple[float, float]] = one_run(
                        make(count, autobatching, pipelining), args.tasks, args.seconds
                    )
                    try:
                        rate, cpu = run(work)
                    except Exception as exc:  # a timeout on a loaded machine: the round is lost
                        print(f"round {number}, {count} node(s), {label}: failed: {exc!r}")
                        continue
                    print(
                        f"round {number}, {count} node(s), {label}: {rate:,.0f} gets/s,"
                        f" {cpu * 1e6:.1f} µs CPU per get",
                        flush=True,
                    )
                    key = (label, count)
                    if key not in best or rate > best[key][0]:
                        best[key] = (rate, cpu)

    tier = "with the disk tier" if args.disk_tier else "memcached only"
    print(f"\nbest of {args.rounds}, {args.tasks} tasks, {args.seconds:g} s per run, {tier}:")
    print("| autobatching, pipelining | " + " | ".join(f"{n} node(s)" for n in args.nodes) + " |")
    print("|---" * (len(args.nodes) + 1) + "|")
    for label, _, _ in SETTINGS:
        cells = []
        for count in args.nodes:
            if (label, count) not in best:
                cells.append("every run failed")
                continue
            rate, cpu = best[(label, count)]
            default = best.get((SETTINGS[0][0], count))
            ratio = f", {rate / default[0]:.2f}x" if default else ""
            cells.append(f"{rate / 1000:.1f}k ({cpu * 1e6:.1f} µs CPU{ratio})")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
