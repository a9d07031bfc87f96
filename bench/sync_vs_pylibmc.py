"""Per-call latency of FastCache against Django's memcached backends, side by side.

    python bench/sync_vs_pylibmc.py [--rounds 10] [--calls 4000]

Starts its own memcached on loopback, then measures, in interleaved rounds (each round
runs every case once, in a shuffled order, so machine noise hits all of them alike):

* sync ``get`` and ``set`` for FastCache (memcached alone, and with its disk tier),
  PyLibMCCache and PyMemcacheCache;
* ``aget`` for FastCache (native) and PyLibMCCache (Django's thread hop), on a uvloop loop;
* when emcache is installed, its native ``get`` on the same loop, for reference.

Prints the best round of each case (µs per call) and the ratios the targets are set in.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import django
from django.conf import settings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_fastcache.testing.servers import MemcachedServer

VALUE = "x" * 100


def configure(location: str, disk_directory: str) -> None:
    settings.configure(
        SECRET_KEY="sync-vs-pylibmc",
        CACHES={
            "fastcache": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": location,
                "OPTIONS": {"disk_tier": False},
            },
            "fastcache-tiered": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": location,
                "OPTIONS": {"disk_directory": disk_directory},
            },
            "pylibmc": {
                "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
                "LOCATION": location,
            },
            "pymemcache": {
                "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                "LOCATION": location,
            },
        },
    )
    django.setup()


def time_sync(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    return (time.perf_counter_ns() - start) / calls / 1000


def time_async(
    loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[object]], calls: int
) -> float:
    async def run() -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            await call()
        return (time.perf_counter_ns() - start) / calls / 1000

    return loop.run_until_complete(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()

    import uvloop

    with MemcachedServer() as server:
        configure(server.location, tempfile.mkdtemp(prefix="fastcache-bench-"))
        from django.core.cache import caches

        names = ("fastcache", "fastcache-tiered", "pylibmc", "pymemcache")
        backends = {name: caches[name] for name in names}
        for cache in backends.values():
            cache.set("bench-key", VALUE)
        loop = uvloop.new_event_loop()
        cases: dict[str, Callable[[], float]] = {}
        for name, cache in backends.items():
            cases[f"{name} get"] = lambda c=cache: time_sync(lambda: c.get("bench-key"), args.calls)
        for name, cache in backends.items():
            cases[f"{name} set"] = lambda c=cache: time_sync(
                lambda: c.set("bench-key", VALUE), args.calls
            )
        for name in ("fastcache", "pylibmc"):
            cache = backends[name]
            cases[f"{name} aget"] = lambda c=cache: time_async(
                loop, lambda: c.aget("bench-key"), args.calls
            )
        try:
            import emcache

            emcache_client = loop.run_until_complete(
                emcache.create_client([emcache.MemcachedHostAddress(server.host, server.port)])
            )
            cases["emcache get (native async)"] = lambda: time_async(
                loop, lambda: emcache_client.get(b":1:bench-key"), args.calls
            )
        except ImportError:
            print("emcache is not installed: its row is left out (pip install emcache)")

        best = dict.fromkeys(cases, float("inf"))
        order = list(cases)
        shuffler = random.Random(0)
        for _ in range(args.rounds):
            # A fresh order each round, so that no case always runs first (or right after
            # the event loop's cases) and carries what the previous one left behind.
            shuffler.shuffle(order)
            for name in order:
                best[name] = min(best[name], cases[name]())

    print(
        f"{platform.node()} · {platform.machine()} · {os.cpu_count()} CPUs · "
        f"Python {platform.python_version()} · Django {django.get_version()}"
    )
    print(
        f"best of {args.rounds} interleaved rounds (shuffled order) of {args.calls} calls, "
        f"100-byte value, memcached on loopback, timer perf_counter_ns\n"
    )
    width = max(len(name) for name in best)
    for name, micros in best.items():
        print(f"{name:<{width}}  {micros:8.1f} µs")
    print()

    def ratio(a: str, b: str) -> None:
        print(f"{a} / {b} = {best[a] / best[b]:.2f}")

    ratio("fastcache get", "pylibmc get")
    ratio("fastcache set", "pylibmc set")
    ratio("fastcache get", "pymemcache get")
    ratio("fastcache-tiered get", "fastcache get")
    ratio("fastcache-tiered set", "fastcache set")
    ratio("fastcache aget", "pylibmc aget")
    if "emcache get (native async)" in best:
        ratio("fastcache aget", "emcache get (native async)")


if __name__ == "__main__":
    main()
