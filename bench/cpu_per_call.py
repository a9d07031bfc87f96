"""CPU and wall time per call: FastCache against every Python memcached client, one caller.

    python bench/cpu_per_call.py [--rounds 7] [--calls 2000] [--only get,set] [--json FILE]

Starts its own memcached on loopback. Each case is one operation on one client, run
``--calls`` times in a row; a round runs every case once, in a fresh shuffled order, so that
machine noise falls on all of them alike; the best round of each case is kept. Two figures
per call:

* **CPU**: the process's CPU time (``time.process_time_ns``, every thread of the process).
  Under eight processes on two vCPUs (cachebench's default) this is what a call costs,
  since every microsecond of client CPU is paid again in the run queue.
* **wall**: ``time.perf_counter_ns``, what one caller on an idle machine waits.

By default the benchmark and memcached are pinned to one CPU (``--no-pin`` to leave them
free). Left free on this 2-vCPU VM, each case settled into one of two modes at random,
2-3x apart, depending on whether memcached ran on the idle vCPU (whose wake-up the VM makes
slow); on one CPU the figures repeat, and every round trip is paid for as under cachebench's
eight busy processes, where no CPU is idle.

``--baseline REV`` adds FastCache as it was at git revision REV (say, the last release)
to the same run, for before/after figures side by side: its package is extracted from
git under another name (``fastcache_baseline``) and imported beside the current one.

Operations: get (hit), get (miss), set, add (of a key that exists: a NOT_STORED round
trip), delete (of a missing key), incr, touch (of a key that exists; the Django backends
only), incr_miss and touch_miss (of a key never written, a new one each call; the Django
backends only), get_many of 10 keys, set_many of 10 keys; 100-byte values. Subjects: the raw
clients (FastCache's ``BlockingClient`` and async ``Client``, pylibmc, pymemcache,
meta-memcache's ``CacheClient``) and the Django backends (FastCache with the disk tier off
and on, and with its values unsealed; PyLibMCCache, PyMemcacheCache), sync, and async for
FastCache with the tier off and on and for PyLibMCCache (whose async calls run their sync
twins in a thread).
Ratios are printed against pylibmc (raw) and PyLibMCCache (Django).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import io
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django
from django.conf import settings

from django_fastcache.testing.servers import MemcachedServer

VALUE = b"x" * 100
TEXT_VALUE = "x" * 100
MANY = 10
OPERATIONS = (
    "get",
    "get_miss",
    "set",
    "add",
    "delete",
    "incr",
    "touch",
    "incr_miss",
    "touch_miss",
    "get_many",
    "set_many",
)


@dataclass
class Case:
    subject: str
    operation: str
    #: Runs the operation ``calls`` times; returns (wall ns, CPU ns) for all of them.
    run: Callable[[int], tuple[int, int]]


def timed_sync(call: Callable[[], object]) -> Callable[[int], tuple[int, int]]:
    def run(calls: int) -> tuple[int, int]:
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        for _ in range(calls):
            call()
        return time.perf_counter_ns() - wall, time.process_time_ns() - cpu

    return run


def timed_async(
    loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[object]]
) -> Callable[[int], tuple[int, int]]:
    async def loop_body(calls: int) -> tuple[int, int]:
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        for _ in range(calls):
            await call()
        return time.perf_counter_ns() - wall, time.process_time_ns() - cpu

    def run(calls: int) -> tuple[int, int]:
        return loop.run_until_complete(loop_body(calls))

    return run


def pin_to_one_cpu(server: MemcachedServer) -> int:
    """Pin this process and every thread of the memcached process to one CPU."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    assert server.process is not None
    for thread in os.listdir(f"/proc/{server.process.pid}/task"):
        os.sched_setaffinity(int(thread), {cpu})
    return cpu


BASELINE_PACKAGE = "fastcache_baseline"


def install_baseline(revision: str, directory: str, repository: str) -> str:
    """Extract the package at ``revision`` of the git ``repository`` as
    :data:`BASELINE_PACKAGE` into ``directory`` and put it on sys.path; returns the
    revision's short name."""
    archive = subprocess.run(
        ["git", "-C", repository, "archive", revision, "django_fastcache"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    root = os.path.join(directory, BASELINE_PACKAGE)
    os.rename(os.path.join(directory, "django_fastcache"), root)
    # Its absolute imports name the package: point them at the copy.
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as file:
                    text = file.read()
                with open(path, "w") as file:
                    file.write(text.replace("django_fastcache", BASELINE_PACKAGE))
    sys.path.insert(0, directory)
    return subprocess.run(
        ["git", "-C", repository, "rev-parse", "--short", revision],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def configure_django(location: str, disk_directory: str, baseline: str | None) -> None:
    memcached = {"LOCATION": location}
    extra = {}
    if baseline is not None:
        extra[f"FastCache @{baseline}"] = {
            "BACKEND": f"{BASELINE_PACKAGE}.backends.FastCache",
            "OPTIONS": {"disk_tier": False},
            **memcached,
        }
    settings.configure(
        SECRET_KEY="cpu-per-call",
        CACHES={
            **extra,
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "FastCache": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "OPTIONS": {"disk_tier": False},
                **memcached,
            },
            # Values unsealed (sign_values off): what sealing costs, side by side.
            "FastCache unsealed": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "OPTIONS": {"disk_tier": False, "sign_values": False},
                **memcached,
            },
            "FastCache tiered": {
                "BACKEND": "django_fastcache.backends.FastCache",
                "OPTIONS": {"disk_directory": disk_directory},
                **memcached,
            },
            "PyLibMCCache": {
                "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
                **memcached,
            },
            "PyMemcacheCache": {
                "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                **memcached,
            },
        },
    )
    django.setup()


def incr_missing(cache: Any, key: str) -> None:
    try:
        cache.incr(key)
    except ValueError:
        pass
    else:
        raise AssertionError(f"{key!r} was expected missing")


async def aincr_missing(cache: Any, key: str) -> None:
    try:
        await cache.aincr(key)
    except ValueError:
        pass
    else:
        raise AssertionError(f"{key!r} was expected missing")


#: The Django backends measured through the async API too (Django's own run each async
#: call's sync twin in a thread).
ASYNC_SUBJECTS = ("FastCache", "FastCache tiered", "PyLibMCCache")


def django_cases(loop: asyncio.AbstractEventLoop) -> list[Case]:
    from django.core.cache import caches

    keys = [f"k{i}" for i in range(MANY)]
    mapping = dict.fromkeys(keys, TEXT_VALUE)
    cases: list[Case] = []
    names = [name for name in settings.CACHES if name != "default"]
    for name in names:
        cache = caches[name]
        # Each backend its own keys: one's values are not readable by the others.
        cache.key_prefix = name.replace(" ", "-")
        cache.set_many(mapping)
        cache.set("counter", 1)
        fresh = itertools.count()
        sync: dict[str, Callable[[], object]] = {
            "get": lambda c=cache: c.get("k0"),
            "get_miss": lambda c=cache: c.get("absent"),
            "set": lambda c=cache: c.set("k1", TEXT_VALUE),
            "add": lambda c=cache: c.add("k2", TEXT_VALUE),
            "delete": lambda c=cache: c.delete("absent"),
            "touch": lambda c=cache: c.touch("k3", 300),
            "incr": lambda c=cache: c.incr("counter"),
            # A key never written, a new one each call (Django raises ValueError).
            "incr_miss": lambda c=cache, n=fresh: incr_missing(c, f"never{next(n)}"),
            "touch_miss": lambda c=cache, n=fresh: c.touch(f"never{next(n)}", 300),
            "get_many": lambda c=cache: c.get_many(keys),
            "set_many": lambda c=cache: c.set_many(mapping),
        }
        for operation, call in sync.items():
            cases.append(Case(f"django {name}", operation, timed_sync(call)))
        if name in ASYNC_SUBJECTS or name.startswith("FastCache @"):
            asynchronous: dict[str, Callable[[], Awaitable[object]]] = {
                "get": lambda c=cache: c.aget("k0"),
                "get_miss": lambda c=cache: c.aget("absent"),
                "set": lambda c=cache: c.aset("k1", TEXT_VALUE),
                "add": lambda c=cache: c.aadd("k2", TEXT_VALUE),
                "delete": lambda c=cache: c.adelete("absent"),
                "touch": lambda c=cache: c.atouch("k3", 300),
                "incr": lambda c=cache: c.aincr("counter"),
                "incr_miss": lambda c=cache, n=fresh: aincr_missing(c, f"anever{next(n)}"),
                "touch_miss": lambda c=cache, n=fresh: c.atouch(f"anever{next(n)}", 300),
                "get_many": lambda c=cache: c.aget_many(keys),
                "set_many": lambda c=cache: c.aset_many(mapping),
            }
            for operation, acall in asynchronous.items():
                cases.append(Case(f"django {name} async", operation, timed_async(loop, acall)))
    return cases


def raw_cases(
    server: MemcachedServer, loop: asyncio.AbstractEventLoop, baseline: str | None
) -> list[Case]:
    import pylibmc
    import pymemcache

    from django_fastcache.bridge import run_blocking
    from django_fastcache.client import Client
    from django_fastcache.client.blocking import BlockingClient

    keys = [b"raw%d" % i for i in range(MANY)]
    triples = [(key, VALUE, 0) for key in keys]
    location = server.location
    cases: list[Case] = []

    def add(subject: str, calls: dict[str, Callable[[], object]]) -> None:
        cases.extend(Case(subject, op, timed_sync(call)) for op, call in calls.items())

    fast_async = Client([location])
    fast = BlockingClient(fast_async.cluster)
    run_blocking(fast.set_many(triples))
    run_blocking(fast.set(b"counter", b"1"))
    # The single-key commands as the plain calls the backend's sync path uses; the
    # multi-key ones as coroutines run by the sync bridge.
    add(
        "raw FastCache BlockingClient",
        {
            "get": lambda: fast.get_now(b"raw0"),
            "get_miss": lambda: fast.get_now(b"absent"),
            "set": lambda: fast.store_now(b"set", b"raw1", VALUE, 0, 0),
            "add": lambda: fast.store_now(b"add", b"raw2", VALUE, 0, 0),
            "delete": lambda: fast.delete_now(b"absent"),
            "incr": lambda: fast.incr_now(b"counter", 1),
            "get_many": lambda: run_blocking(fast.get_many(keys)),
            "set_many": lambda: run_blocking(fast.set_many(triples)),
        },
    )
    asynchronous: dict[str, Callable[[], Awaitable[object]]] = {
        "get": lambda: fast_async.get(b"raw0"),
        "get_miss": lambda: fast_async.get(b"absent"),
        "set": lambda: fast_async.set(b"raw1", VALUE),
        "add": lambda: fast_async.add(b"raw2", VALUE),
        "delete": lambda: fast_async.delete(b"absent"),
        "incr": lambda: fast_async.incr(b"counter"),
        "get_many": lambda: fast_async.get_many(keys),
        "set_many": lambda: fast_async.set_many(triples),
    }
    cases.extend(
        Case("raw FastCache Client (async)", op, timed_async(loop, call))
        for op, call in asynchronous.items()
    )

    mc = pylibmc.Client([location])
    mapping = dict(zip(keys, [VALUE] * MANY))
    add(
        "raw pylibmc",
        {
            "get": lambda: mc.get(b"raw0"),
            "get_miss": lambda: mc.get(b"absent"),
            "set": lambda: mc.set(b"raw1", VALUE),
            "add": lambda: mc.add(b"raw2", VALUE),
            "delete": lambda: mc.delete(b"absent"),
            "incr": lambda: mc.incr(b"counter"),
            "get_many": lambda: mc.get_multi(keys),
            "set_many": lambda: mc.set_multi(mapping),
        },
    )
    pm = pymemcache.Client((server.host, server.port), no_delay=True)
    add(
        "raw pymemcache",
        {
            "get": lambda: pm.get(b"raw0"),
            "get_miss": lambda: pm.get(b"absent"),
            "set": lambda: pm.set(b"raw1", VALUE, noreply=False),
            "add": lambda: pm.add(b"raw2", VALUE, noreply=False),
            "delete": lambda: pm.delete(b"absent", noreply=False),
            "incr": lambda: pm.incr(b"counter", 1),
            "get_many": lambda: pm.get_many(keys),
            "set_many": lambda: pm.set_many(mapping, noreply=False),
        },
    )
    cases.extend(meta_memcache_cases(server, keys))
    if baseline is not None:
        cases.extend(baseline_raw_cases(location, baseline, keys, triples))
    return cases


def baseline_raw_cases(
    location: str, baseline: str, keys: list[bytes], triples: list[tuple[bytes, bytes, int]]
) -> list[Case]:
    """The baseline's BlockingClient, through the sync bridge (it had no plain calls)."""
    bridge = importlib.import_module(f"{BASELINE_PACKAGE}.bridge")
    client_module = importlib.import_module(f"{BASELINE_PACKAGE}.client")
    blocking_module = importlib.import_module(f"{BASELINE_PACKAGE}.client.blocking")
    run = bridge.run_blocking
    old = blocking_module.BlockingClient(client_module.Client([location]).cluster)
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: run(old.get(b"raw0")),
        "get_miss": lambda: run(old.get(b"absent")),
        "set": lambda: run(old.set(b"raw1", VALUE)),
        "add": lambda: run(old.add(b"raw2", VALUE)),
        "delete": lambda: run(old.delete(b"absent")),
        "incr": lambda: run(old.incr(b"counter")),
        "get_many": lambda: run(old.get_many(keys)),
        "set_many": lambda: run(old.set_many(triples)),
    }
    subject = f"raw FastCache BlockingClient @{baseline}"
    return [Case(subject, op, timed_sync(call)) for op, call in calls.items()]


def meta_memcache_cases(server: MemcachedServer, byte_keys: list[bytes]) -> list[Case]:
    try:
        from meta_memcache import (
            CacheClient,
            ServerAddress,
            SetMode,
            connection_pool_factory_builder,
        )
    except ImportError:
        print("meta-memcache is not installed: its rows are left out (pip install meta-memcache)")
        return []
    client = CacheClient.cache_client_from_servers(
        servers=[ServerAddress(host=server.host, port=server.port)],
        connection_pool_factory_fn=connection_pool_factory_builder(),
    )
    keys = [key.decode() for key in byte_keys]
    for key in keys:
        client.set(key, VALUE, ttl=0)
    client.set("mcounter", 1, ttl=0)
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: client.get("raw0"),
        "get_miss": lambda: client.get("absent"),
        "set": lambda: client.set("raw1", VALUE, ttl=0),
        "add": lambda: client.set("raw2", VALUE, ttl=0, set_mode=SetMode.ADD),
        "delete": lambda: client.delete("absent"),
        "incr": lambda: client.delta_and_get("mcounter", 1),
        "get_many": lambda: client.multi_get(keys),
        # meta-memcache has no multi-set: ten sets in a row.
        "set_many": lambda: [client.set(key, VALUE, ttl=0) for key in keys],
    }
    return [Case("raw meta-memcache CacheClient", op, timed_sync(c)) for op, c in calls.items()]


def measure(
    cases: list[Case], rounds: int, calls: int
) -> dict[tuple[str, str], tuple[float, float]]:
    best: dict[tuple[str, str], tuple[float, float]] = {}
    order = list(cases)
    shuffler = random.Random(0)
    for case in cases:  # warm-up: connections opened, code paths taken once
        case.run(50)
    for round_number in range(rounds):
        shuffler.shuffle(order)
        for case in order:
            wall, cpu = case.run(calls)
            key = (case.subject, case.operation)
            previous = best.get(key, (float("inf"), float("inf")))
            best[key] = (
                min(previous[0], wall / calls / 1000),
                min(previous[1], cpu / calls / 1000),
            )
        print(f"round {round_number + 1}/{rounds} done", file=sys.stderr)
    return best


REFERENCES = {
    "raw FastCache BlockingClient": "raw pylibmc",
    "raw FastCache Client (async)": "raw pylibmc",
    "raw pymemcache": "raw pylibmc",
    "raw meta-memcache CacheClient": "raw pylibmc",
    "django FastCache": "django PyLibMCCache",
    "django FastCache tiered": "django PyLibMCCache",
    "django FastCache unsealed": "django PyLibMCCache",
    "django PyMemcacheCache": "django PyLibMCCache",
    "django FastCache async": "django PyLibMCCache async",
    "django FastCache tiered async": "django PyLibMCCache async",
}


def reference_of(subject: str) -> str | None:
    if "@" in subject:  # the baseline, against the same reference as today's FastCache
        if subject.startswith("raw"):
            return "raw pylibmc"
        return "django PyLibMCCache async" if subject.endswith("async") else "django PyLibMCCache"
    return REFERENCES.get(subject)


def _subject_order(subject: str) -> tuple[int, str]:
    # References first, then FastCache, then the other peers.
    rank = 0 if subject in REFERENCES.values() else 1 if "FastCache" in subject else 2
    return (subject.startswith("django"), rank, subject)  # type: ignore[return-value]


def report(best: dict[tuple[str, str], tuple[float, float]]) -> None:
    subjects = sorted(dict.fromkeys(subject for subject, _ in best), key=_subject_order)
    operations = [op for op in OPERATIONS if any(o == op for _, o in best)]
    width = max(len(s) for s in subjects)
    header = " " * width + "".join(f"{op:>17}" for op in operations)
    for figure, title in ((1, "CPU"), (0, "wall")):
        print(f"\n{title} µs per call, best round (x the reference: pylibmc / PyLibMCCache)")
        print(header)
        for subject in subjects:
            cells = []
            reference = reference_of(subject)
            for op in operations:
                mine = best.get((subject, op))
                if mine is None:
                    cells.append(f"{'':>17}")
                    continue
                ref = best.get((reference, op)) if reference else None
                ratio = f" ({mine[figure] / ref[figure]:.2f}x)" if ref else ""
                cells.append(f"{mine[figure]:8.1f}{ratio:<9}".rjust(17))
            print(f"{subject:<{width}}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--only", help="comma-separated operations, e.g. get,set")
    parser.add_argument("--subjects", help="comma-separated substrings of subject names")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the benchmark and memcached on any CPU"
    )
    parser.add_argument("--baseline", metavar="REV", help="also FastCache at git revision REV")
    parser.add_argument(
        "--baseline-repo",
        default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        help="the git checkout REV is taken from (default: this script's)",
    )
    args = parser.parse_args()

    import uvloop

    with MemcachedServer() as server, tempfile.TemporaryDirectory() as directory:
        pinned = "not pinned" if args.no_pin else f"pinned to CPU {pin_to_one_cpu(server)}"
        baseline = None
        if args.baseline:
            baseline = install_baseline(
                args.baseline, os.path.join(directory, "baseline"), args.baseline_repo
            )
        configure_django(server.location, directory, baseline)
        loop = uvloop.new_event_loop()
        cases = raw_cases(server, loop, baseline) + django_cases(loop)
        if args.only:
            wanted = set(args.only.split(","))
            cases = [case for case in cases if case.operation in wanted]
        if args.subjects:
            parts = args.subjects.split(",")
            cases = [c for c in cases if any(p in c.subject for p in parts)]
        best = measure(cases, args.rounds, args.calls)
    from django_fastcache import compiled

    print(
        f"{platform.node()} · {platform.machine()} · {os.cpu_count()} CPUs · "
        f"Python {platform.python_version()} · Django {django.get_version()} · "
        f"FastCache {compiled.describe()}"
    )
    print(
        f"best of {args.rounds} interleaved rounds (shuffled) of {args.calls} calls, "
        f"100-byte values, memcached on loopback, one caller, {pinned} with memcached"
    )
    report(best)
    if args.json:
        rows: list[dict[str, Any]] = [
            {"subject": s, "operation": o, "wall_us": w, "cpu_us": c}
            for (s, o), (w, c) in best.items()
        ]
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
