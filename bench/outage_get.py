"""CPU per get while memcached is out (the disk tier answers), beside DiskCache's DjangoCache.

    python bench/outage_get.py [--rounds 9] [--ops 4000]

cachebench's ``fastcache-outage`` row against its ``diskcache`` row, in one process: the
same 1,100 bytes keys, pre-filled alike, read in the same random order, the two caches
interleaved round by round, the best round of each kept (machine noise only ever adds).
Two workloads, each a figure in CPU µs per get (``time.thread_time``):

* ``gets``: gets only (what a read costs with everything warm);
* ``mixed``: a set after every nine gets, as cachebench's mix has them; only the gets are
  timed (a write between reads costs each tier's next read some of its caches).

For instructions per get, free of the machine's noise, ``--only SUBJECT --calls N`` makes
N gets of one subject (after the same fill, a get of every key and 500 more) and times
nothing: run it under callgrind with two values of N and divide the difference of the main
thread's totals by the difference of the Ns::

    valgrind --tool=callgrind --separate-threads=yes \\
        python bench/outage_get.py --only outage --calls 1000

The ratio outage / diskcache is what cachebench's get median is held to (<= 1.2). The
``outage`` cache keeps copies of the entries it read in memory (``disk_read_copies``, on
by default); ``no-copies`` is the same cache without them, every get a SQLite read.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django
from django.conf import settings

from django_fastcache.testing.servers import free_port

KEYS = 1100
SUBJECTS = ("outage", "no-copies", "diskcache")


def configure(directory: str) -> None:
    settings.configure(
        SECRET_KEY="outage-get",
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "outage": {  # nothing listens there: the node is out from the first call
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": f"127.0.0.1:{free_port()}",
                "OPTIONS": {"disk_directory": os.path.join(directory, "outage")},
            },
            "no-copies": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "LOCATION": f"127.0.0.1:{free_port()}",
                "OPTIONS": {
                    "disk_directory": os.path.join(directory, "no-copies"),
                    "disk_read_copies": 0,
                },
            },
            "diskcache": {
                "BACKEND": "diskcache.DjangoCache",
                "LOCATION": os.path.join(directory, "diskcache"),
            },
        },
        LOGGING_CONFIG=None,
    )
    django.setup()


def per_get(cache: Any, ops: list[tuple[bytes, bytes | None]]) -> float:
    """CPU µs per get over ``ops`` (a value: a set, untimed)."""
    get, set_ = cache.get, cache.set
    clock = time.thread_time
    spent = 0.0
    gets = 0
    for key, value in ops:
        if value is not None:
            set_(key, value)
            continue
        before = clock()
        get(key)
        spent += clock() - before
        gets += 1
    return spent / gets * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=4000)
    parser.add_argument("--only", choices=SUBJECTS, help="gets of this subject, untimed")
    parser.add_argument("--calls", type=int, default=1000, help="with --only: how many")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="fastcache-outage-get-")
    try:
        configure(directory)
        from django.core.cache import caches

        from django_fastcache import compiled

        if args.only:
            cache = caches[args.only]
            for index in range(KEYS):
                key = str(index).encode()
                cache.set(key, key)
            rng = random.Random(0)
            get = cache.get
            for index in range(KEYS):
                get(str(index).encode())
            for _ in range(500 + args.calls):
                get(str(rng.randrange(KEYS)).encode())
            return

        for name in SUBJECTS:
            for index in range(KEYS):
                key = str(index).encode()
                caches[name].set(key, key)
        rng = random.Random(0)
        keys = [str(rng.randrange(KEYS)).encode() for _ in range(args.ops)]
        workloads: dict[str, list[tuple[bytes, bytes | None]]] = {
            "gets": [(key, None) for key in keys],
            "mixed": [
                (key, str(n).encode() * rng.randrange(1, 100) if n % 10 == 9 else None)
                for n, key in enumerate(keys)
            ],
        }
        best = {(w, s): float("inf") for w in workloads for s in SUBJECTS}
        for _round in range(args.rounds):
            for workload, ops in workloads.items():
                for name in SUBJECTS:
                    figure = per_get(caches[name], ops)
                    best[workload, name] = min(best[workload, name], figure)
        print(f"CPU µs per get, best of {args.rounds} rounds ({compiled.describe()})")
        print(
            f"{'':8}"
            + "".join(f"{name:>12}" for name in SUBJECTS)
            + "".join(f"{name + '/disk':>17}" for name in SUBJECTS[:2])
        )
        for workload in workloads:
            figures = [best[workload, name] for name in SUBJECTS]
            disk = figures[-1]
            print(
                f"{workload:8}"
                + "".join(f"{figure:12.2f}" for figure in figures)
                + "".join(f"{figure / disk:17.2f}" for figure in figures[:2])
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
