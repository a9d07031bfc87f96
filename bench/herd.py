"""A hot key expiring under load: how often each backend's get_or_set recomputes it.

    python bench/herd.py [--workers 8] [--threads 4] [--seconds 8] [--ttl 1] [--compute 0.1]

Starts its own memcached and redis on loopback. For each backend in turn, ``workers``
forked processes of ``threads`` threads each call ``cache.get_or_set(KEY, expensive,
timeout=ttl)`` in a loop for ``seconds``, with no pause between calls. ``expensive`` takes
``compute`` seconds and counts its runs by appending a byte to a file (so every process
counts). The key expires every ``ttl`` seconds (memcached's clock ticks once a second), so
each backend sees about ``seconds / ttl`` expiries.

Prints, per backend: how many times ``expensive`` ran, how many runs that is per expiry
(the herd), how many get_or_set calls were served, and the P50/P99/max latency the
callers saw (a caller that recomputes, or waits for another's computation, sees at least
``compute``).

FastCache runs with its defaults (disk tier on, stampede protection on, protocol auto), and
once more over memcached alone; PyLibMCCache, PyMemcacheCache and django-redis run
Django's own get_or_set (get, compute on a miss, add, get).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from array import array
from typing import Any

import django
from django.conf import settings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_fastcache.testing.servers import MemcachedServer, RedisServer

KEY = "hot-key"
VALUE = {"rendered": "x" * 1000}
FORK = multiprocessing.get_context("fork")

BACKENDS = {
    "FastCache (defaults: disk tier on)": "fastcache",
    "FastCache (memcached only)": "fastcache-memcached",
    "PyLibMCCache": "pylibmc",
    "PyMemcacheCache": "pymemcache",
    "django-redis": "redis",
}


def configure(memcached: str, redis: str, disk_directory: str) -> None:
    settings.configure(
        SECRET_KEY="herd-bench",
        CACHES={
            "fastcache": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": memcached,
                "OPTIONS": {"disk_directory": disk_directory},
            },
            "fastcache-memcached": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": memcached,
                "OPTIONS": {"disk_tier": False},
            },
            "pylibmc": {
                "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
                "LOCATION": memcached,
            },
            "pymemcache": {
                "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                "LOCATION": memcached,
            },
            "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis},
        },
    )
    django.setup()


def worker(alias: str, args: argparse.Namespace, counter: str, start: Any, out: Any) -> None:
    """One forked process: ``threads`` callers, their latencies sent back as one array."""
    from django.core.cache import caches

    def expensive() -> Any:
        fd = os.open(counter, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        time.sleep(args.compute)
        return VALUE

    latencies = array("d")
    lock = threading.Lock()
    failures: list[str] = []

    def caller() -> None:
        cache = caches[alias]  # Django's caches are per thread
        mine = array("d")
        start.wait(60)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            try:
                cache.get_or_set(KEY, expensive, timeout=args.ttl)
            except Exception as exc:  # counted, not hidden
                failures.append(repr(exc))
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=caller) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((latencies.tobytes(), failures[:3], len(failures)))


def run_backend(alias: str, args: argparse.Namespace, directory: str) -> dict[str, Any]:
    counter = os.path.join(directory, f"{alias}.calls")
    open(counter, "wb").close()
    start = FORK.Barrier(args.workers * args.threads)
    out = FORK.Queue()
    processes = [
        FORK.Process(target=worker, args=(alias, args, counter, start, out))
        for _ in range(args.workers)
    ]
    for process in processes:
        process.start()
    latencies = array("d")
    failures: list[str] = []
    failed = 0
    for _ in processes:
        data, examples, count = out.get(timeout=args.seconds + 120)
        latencies.frombytes(data)
        failures += examples
        failed += count
    for process in processes:
        process.join()
    ordered = sorted(latencies)
    return {
        "runs": os.path.getsize(counter),
        "calls": len(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
        "failed": failed,
        "failures": failures[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8, help="processes")
    parser.add_argument("--threads", type=int, default=4, help="callers per process")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each run")
    parser.add_argument("--ttl", type=int, default=1, help="the key's timeout, seconds")
    parser.add_argument("--compute", type=float, default=0.1, help="seconds per computation")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="fastcache-herd-")
    with MemcachedServer() as memcached, RedisServer(directory) as redis:
        configure(memcached.location, redis.location, os.path.join(directory, "disk"))
        results = {}
        for name, alias in BACKENDS.items():
            memcached.flush()
            redis.flush()
            results[name] = run_backend(alias, args, directory)
    shutil.rmtree(directory, ignore_errors=True)

    expiries = args.seconds / args.ttl
    callers = args.workers * args.threads
    print(
        f"{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}"
        f" · Django {django.get_version()}"
    )
    print(
        f"{callers} callers ({args.workers} processes x {args.threads} threads), "
        f"{args.seconds:g} s, key timeout {args.ttl} s (~{expiries:g} expiries), "
        f"computation {args.compute * 1000:g} ms"
    )
    print()
    print(
        "| backend | expensive() ran | per expiry | get_or_set calls | P50 ms | P99 ms | max ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in results.items():
        print(
            f"| {name} | {row['runs']} | {row['runs'] / expiries:.1f} | {row['calls']} "
            f"| {row['p50'] * 1000:.2f} | {row['p99'] * 1000:.1f} | {row['max'] * 1000:.1f} |"
        )
    for name, row in results.items():
        if row["failed"]:
            print(f"{name}: {row['failed']} calls raised, e.g. {row['failures']}")


if __name__ == "__main__":
    main()
