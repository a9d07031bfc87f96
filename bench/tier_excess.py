"""What the disk tier adds to each operation, measured side by side in one process.

    python bench/tier_excess.py [--ops 20000] [--block 200] [--subjects fastcache,tiered]

cachebench's rows run one after another, minutes apart, and on a shared 2-vCPU machine the
machine moves more between two rows than the tier costs. Here the subjects take turns in
one process, in blocks of ``--block`` operations of cachebench's mix (90% get, 9% set, 1%
delete over 1,100 keys, values of 1 to 100 copies of the count), paced as one of
cachebench's workers is (a short sleep every 10 operations, so that the CPU's caches cool
between operations as they do there; a tight loop hides most of the tier's cost). Each
subject has its own keys and its own connection, kept for its whole block.

Printed per subject and operation: the median wall time of a call and its mean CPU time
(``time.thread_time_ns`` around the call: the calling thread only, so the writer behind's
landings are not in it), then what each subject costs more than the first, per call.

Subjects: ``fastcache`` (disk tier off), ``tiered`` (disk tier on), ``no-copies`` (disk
tier on, its queue held at zero: the request path's stamps and checks, no disk copies),
``pylibmc`` (Django's PyLibMCCache, when installed).
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
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django
from django.conf import settings

from django_fastcache.compiled import describe
from django_fastcache.testing.servers import MemcachedServer

SUBJECTS = ("fastcache", "tiered", "no-copies", "pylibmc")
ACTIONS = ("get", "set", "delete")
KEYS = 1100
#: Per subject and action: the calls' wall times and CPU times, ns.
Samples = dict[str, dict[str, tuple[list[int], list[int]]]]


def configure(location: str, directory: str, subjects: list[str]) -> None:
    caches: dict[str, Any] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
    for name in subjects:
        if name == "pylibmc":
            backend = "django.core.cache.backends.memcached.PyLibMCCache"
            options: dict[str, Any] = {}
        elif name == "fastcache":
            backend, options = "django_fastcache.backends.FastCache", {"disk_tier": False}
        else:
            backend = "django_fastcache.backends.FastCache"
            options = {"disk_directory": os.path.join(directory, name)}
        caches[name] = {
            "BACKEND": backend,
            "LOCATION": location,
            "KEY_PREFIX": name,  # each its own keys
            "OPTIONS": options,
        }
    settings.configure(SECRET_KEY="tier-excess", CACHES=caches)
    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20000, help="operations per subject")
    parser.add_argument("--block", type=int, default=200, help="operations per turn")
    parser.add_argument("--subjects", default="fastcache,tiered")
    args = parser.parse_args()
    subjects = args.subjects.split(",")
    unknown = set(subjects) - set(SUBJECTS)
    if unknown:
        parser.error(f"unknown subjects {sorted(unknown)}; choose from {', '.join(SUBJECTS)}")
    directory = tempfile.mkdtemp(prefix="fastcache-tier-excess-")
    try:
        with MemcachedServer() as server:
            configure(server.location, directory, subjects)
            report(run(subjects, args.ops, args.block), subjects)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run(subjects: list[str], ops: int, block: int) -> Samples:
    from django.core.cache import caches

    for name in subjects:  # pre-fill, as cachebench does
        cache = caches[name]
        for index in range(KEYS):
            cache.set(str(index).encode(), str(index).encode())
        if name == "no-copies":
            cache._shared().tiered.behind.max_queue = 0  # type: ignore[attr-defined]
    samples: Samples = {name: {action: ([], []) for action in ACTIONS} for name in subjects}
    draws = {name: random.Random(0) for name in subjects}  # the same operations for each
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    done = 0
    while done < ops:
        for name in subjects:
            cache, draw, taken = caches[name], draws[name], samples[name]
            calls: dict[str, Callable[..., Any]] = {
                "get": cache.get,
                "set": cache.set,
                "delete": cache.delete,
            }
            for count in range(done, done + block):
                key = str(draw.randrange(KEYS)).encode()
                value = str(count).encode() * draw.randrange(1, 100)
                choice = draw.random()
                action = "get" if choice < 0.90 else "set" if choice < 0.99 else "delete"
                arguments = (key, value) if action == "set" else (key,)
                started_cpu = cpu()
                started = wall()
                calls[action](*arguments)
                ended = wall()
                taken[action][1].append(cpu() - started_cpu)
                taken[action][0].append(ended - started)
                if count % 10 == 0:
                    time.sleep(0.002)
        done += block
    return samples


def report(samples: Samples, subjects: list[str]) -> None:
    print(f"{describe()}; per call, µs: median wall time / mean CPU time of the calling thread")
    print(f"{'':22}" + "".join(f"{action:>20}" for action in ACTIONS))
    for name in subjects:
        cells = []
        for action in ACTIONS:
            walls, cpus = samples[name][action]
            cells.append(
                f"{statistics.median(walls) / 1000:.1f} / {statistics.mean(cpus) / 1000:.1f}"
            )
        print(f"{name:22}" + "".join(f"{cell:>20}" for cell in cells))
    base = subjects[0]
    for name in subjects[1:]:
        cells = []
        for action in ACTIONS:
            more = statistics.mean(samples[name][action][1]) - statistics.mean(
                samples[base][action][1]
            )
            ratio = statistics.median(samples[name][action][0]) / statistics.median(
                samples[base][action][0]
            )
            cells.append(f"{more / 1000:+.1f} CPU, {ratio:.2f}x")
        print(f"{name + ' - ' + base:22}" + "".join(f"{cell:>20}" for cell in cells))


if __name__ == "__main__":
    main()
