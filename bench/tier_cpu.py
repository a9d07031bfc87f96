"""CPU per operation of the disk tier, under cachebench's workload at cachebench's pace.

    python bench/tier_cpu.py [--rate 3000] [--seconds 3] [--rounds 5] [--subjects ...]

Runs cachebench's operation mix (90% get, 9% set, 1% delete over 1,100 keys, values of 1 to
100 copies of the count) in one process, paced at ``--rate`` operations per second, the
rate one of cachebench's eight workers reaches on two vCPUs. The pace matters for the disk
tier: the writer behind lands what gathered in one interval, so its batch sizes (and its
CPU per write) depend on how fast writes come.

Per subject and round, three figures, in CPU µs (``time.thread_time`` and the process's
total), so that machine noise, which stretches wall time, moves them little:

* the calling thread's CPU per get, per set and per delete;
* the writer behind's CPU per write (set or delete), read from its thread's CPU clock;
* the whole process's CPU per operation (every thread), the pacing sleeps included alike.

Subjects: ``fastcache`` (disk tier off), ``tiered`` (memcached up), ``outage`` (memcached
unreachable: the disk tier answers), ``diskcache`` (DiskCache's DjangoCache). Rounds run
the subjects in a fresh shuffled order; the median round of each figure is printed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django
from django.conf import settings

from django_fastcache.testing.servers import MemcachedServer, free_port

SUBJECTS = ("fastcache", "tiered", "outage", "diskcache")
KEYS = 1100


def configure(location: str, directory: str) -> None:
    settings.configure(
        SECRET_KEY="tier-cpu",
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "fastcache": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": location,
                # Each subject its own keys: the others' sets and deletes on the same
                # memcached would otherwise turn the tiered subject's hits into misses.
                "KEY_PREFIX": "fastcache",
                "OPTIONS": {"disk_tier": False},
            },
            "tiered": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": location,
                "KEY_PREFIX": "tiered",
                "OPTIONS": {"disk_directory": os.path.join(directory, "tiered")},
            },
            "outage": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": f"127.0.0.1:{free_port()}",
                "OPTIONS": {"disk_directory": os.path.join(directory, "outage")},
            },
            "diskcache": {
                "BACKEND": "diskcache.DjangoCache",
                "LOCATION": os.path.join(directory, "diskcache"),
            },
        },
    )
    django.setup()


def thread_cpu(thread: Any) -> float:
    """Seconds of CPU the thread ``thread`` used (0 if none)."""
    if thread is None or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, ProcessLookupError):
        return 0.0


def _writer(cache: Any) -> Any:
    shared = getattr(cache, "_shared", None)
    tiered = None if shared is None else shared().tiered
    return None if tiered is None else tiered.behind


def run_round(
    cache: Any, rate: float, seconds: float, seed: int, interval: float | None = None
) -> dict[str, float]:
    rng = random.Random(seed)
    get, set_, delete = cache.get, cache.set, cache.delete
    cpu = {"get": 0.0, "set": 0.0, "delete": 0.0}
    count = {"get": 0, "set": 0, "delete": 0}
    writer = _writer(cache)
    if writer is not None:
        if interval is not None:
            writer.interval = interval
        writer.flush(5.0)
    writer_thread = None if writer is None else writer._writer_thread
    writer_before = thread_cpu(writer_thread)
    process_before = time.process_time()
    ops = int(rate * seconds)
    start = time.monotonic()
    thread_time = time.thread_time
    for n in range(ops):
        if n % 10 == 0:
            lag = start + n / rate - time.monotonic()
            if lag > 0:
                time.sleep(lag)
        key = str(rng.randrange(KEYS)).encode()
        value = str(n).encode() * rng.randrange(1, 100)
        choice = rng.random()
        if choice < 0.90:
            action = "get"
            before = thread_time()
            get(key)
        elif choice < 0.99:
            action = "set"
            before = thread_time()
            set_(key, value)
        else:
            action = "delete"
            before = thread_time()
            delete(key)
        cpu[action] += thread_time() - before
        count[action] += 1
    process = time.process_time() - process_before
    if writer is not None and writer._writer_thread is not writer_thread:  # started meanwhile
        writer_thread, writer_before = writer._writer_thread, 0.0
    writes = count["set"] + count["delete"]
    result = {action: cpu[action] / max(1, count[action]) * 1e6 for action in cpu}
    result["writer/write"] = (thread_cpu(writer_thread) - writer_before) / writes * 1e6
    result["process/op"] = process / ops * 1e6
    result["late s"] = max(0.0, time.monotonic() - start - seconds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=3000.0, help="operations per second")
    parser.add_argument("--seconds", type=float, default=3.0, help="per subject and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--subjects", default=",".join(SUBJECTS))
    parser.add_argument(
        "--write-interval", type=float, help="the writer behind's interval (default: its own)"
    )
    args = parser.parse_args()
    subjects = args.subjects.split(",")
    directory = tempfile.mkdtemp(prefix="fastcache-tier-cpu-")
    try:
        server = MemcachedServer()
        with server:
            configure(server.location, directory)
            from django.core.cache import caches

            for name in subjects:  # pre-fill, as cachebench does
                cache = caches[name]
                for index in range(KEYS):
                    key = str(index).encode()
                    cache.set(key, key)
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in subjects}
            order = list(subjects)
            shuffler = random.Random(0)
            for number in range(args.rounds):
                shuffler.shuffle(order)
                for name in order:
                    rounds[name].append(
                        run_round(
                            caches[name], args.rate, args.seconds, number, args.write_interval
                        )
                    )
                print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    figures = ("get", "set", "delete", "writer/write", "process/op", "late s")
    print(f"CPU µs, median of {args.rounds} rounds at {args.rate:.0f} ops/s")
    print(f"{'':12}" + "".join(f"{f:>14}" for f in figures))
    for name in subjects:
        row = [statistics.median(r[f] for r in rounds[name]) for f in figures]
        print(f"{name:12}" + "".join(f"{v:14.1f}" for v in row))


if __name__ == "__main__":
    main()
