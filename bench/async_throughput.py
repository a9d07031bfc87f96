"""Async get throughput: FastCache's asyncio client against emcache, with and without autobatching.

    python bench/async_throughput.py [--seconds 2] [--rounds 3] [--tasks 32] [--connections 4]

Starts its own memcached processes on loopback (one, and four for the multi-node runs), stores
100-byte values under a few hundred keys, then runs ``--tasks`` tasks on uvloop (stock asyncio
with ``--asyncio``), each doing gets of those keys one after the other for ``--seconds``. Each
client and node count is measured once per round, the rounds interleaved (the machine's noise
hits every client alike), and the best round of each is kept. Prints gets per second (wall)
and the process's CPU time per get, then the ratios the project's targets are stated in.

emcache comes with the ``bench`` extra; without it, only FastCache is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from django_fastcache.client import Client
from django_fastcache.testing.servers import MemcachedServer

VALUE = b"v" * 100
KEYS = [b"bench:async:%d" % i for i in range(512)]

#: A configured client for one run: (get, close), built on the run's own event loop.
Opened = tuple[Callable[[bytes], Awaitable[Any]], Callable[[], Awaitable[None]]]


@dataclass(frozen=True)
class Config:
    name: str
    library: str  # "fastcache" or "emcache"
    autobatching: bool


CONFIGS = (
    Config("fastcache", "fastcache", False),
    Config("fastcache-autobatching", "fastcache", True),
    Config("emcache", "emcache", False),
    Config("emcache-autobatching", "emcache", True),
)


async def open_fastcache(
    servers: Sequence[MemcachedServer], connections: int, autobatching: bool
) -> Opened:
    client = Client(
        [s.location for s in servers],
        max_connections=connections,
        timeout=5.0,
        autobatching=autobatching,
    )
    return client.get, client.aclose


async def open_emcache(
    servers: Sequence[MemcachedServer], connections: int, autobatching: bool
) -> Opened:
    import emcache

    client = await emcache.create_client(
        [emcache.MemcachedHostAddress(s.host, s.port) for s in servers],
        max_connections=connections,
        timeout=5.0,
        autobatching=autobatching,
    )
    return client.get, client.close


OPENERS = {"fastcache": open_fastcache, "emcache": open_emcache}


async def one_run(
    config: Config,
    servers: Sequence[MemcachedServer],
    *,
    tasks: int,
    seconds: float,
    connections: int,
) -> tuple[float, float]:
    """Gets per second and CPU seconds per get, for one client on ``servers``."""
    get, close = await OPENERS[config.library](servers, connections, config.autobatching)
    try:
        stop = False
        counts = [0] * tasks

        async def worker(number: int) -> None:
            # Each task walks its own stride of the keys, so a loop iteration's gets
            # spread over the nodes the way independent requests would.
            index = number
            done = 0
            while not stop:
                item = await get(KEYS[index % len(KEYS)])
                if item is None:
                    raise RuntimeError("a benchmark key is missing")
                index += tasks
                done += 1
            counts[number] = done

        # A short warm-up opens the connections before the clock starts.
        warmup = time.perf_counter() + min(0.2, seconds / 4)
        while time.perf_counter() < warmup:
            await asyncio.gather(*[get(KEYS[i]) for i in range(tasks)])
        began, cpu = time.perf_counter(), time.process_time()
        workers = [asyncio.ensure_future(worker(n)) for n in range(tasks)]
        await asyncio.sleep(seconds)
        stop = True
        await asyncio.gather(*workers)
        elapsed, cpu_used = time.perf_counter() - began, time.process_time() - cpu
        total = sum(counts)
        return total / elapsed, cpu_used / total
    finally:
        await close()


async def fill(server: MemcachedServer) -> None:
    """Every key on the server: the clients place keys over nodes each in their own way."""
    client = Client([server.location], timeout=5.0)
    try:
        failed = await client.set_many([(key, VALUE, 0) for key in KEYS])
        if failed:
            raise RuntimeError(f"could not store {len(failed)} benchmark keys")
    finally:
        await client.aclose()


def available(config: Config) -> bool:
    if config.library != "emcache":
        return True
    try:
        import emcache  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved; the best is kept")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--connections", type=int, default=4, help="per node, every client")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--clients", nargs="+", default=[c.name for c in CONFIGS], choices=[c.name for c in CONFIGS]
    )
    parser.add_argument("--asyncio", action="store_true", help="stock asyncio, not uvloop")
    args = parser.parse_args()
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    if not args.asyncio:
        import uvloop

        run = uvloop.run
    configs = [c for c in CONFIGS if c.name in args.clients]
    for config in configs:
        if not available(config):
            print(f"{config.name}: not installed (pip install 'django-fastcache[bench]'), skipped")
    configs = [c for c in configs if available(c)]

    best: dict[tuple[str, int], tuple[float, float]] = {}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(MemcachedServer()) for _ in range(max(args.nodes))]
        for server in servers:
            run(fill(server))
        for number in range(args.rounds):
            for count in args.nodes:
                for config in configs:
                    try:
                        rate, cpu = run(
                            one_run(
                                config,
                                servers[:count],
                                tasks=args.tasks,
                                seconds=args.seconds,
                                connections=args.connections,
                            )
                        )
                    except Exception as exc:  # a timeout on a loaded machine: the round is lost
                        print(f"round {number}, {count} node(s), {config.name}: failed: {exc!r}")
                        continue
                    print(
                        f"round {number}, {count} node(s), {config.name}: {rate:,.0f} gets/s,"
                        f" {cpu * 1e6:.1f} µs CPU per get",
                        flush=True,
                    )
                    key = (config.name, count)
                    if key not in best or rate > best[key][0]:
                        best[key] = (rate, cpu)

    print(f"\nbest of {args.rounds}, {args.tasks} tasks, {args.seconds:g} s per run:")
    header = "| client | " + " | ".join(f"{n} node{'s' if n > 1 else ''}" for n in args.nodes)
    print(header + " |")
    print("|---" * (len(args.nodes) + 1) + "|")
    for config in configs:
        cells = []
        for count in args.nodes:
            if (config.name, count) not in best:
                cells.append("every run failed")
                continue
            rate, cpu = best[(config.name, count)]
            cells.append(f"{rate / 1000:.1f}k ({cpu * 1e6:.1f} µs CPU)")
        print(f"| {config.name} | " + " | ".join(cells) + " |")

    def ratio(a: tuple[str, int], b: tuple[str, int]) -> str:
        if a not in best or b not in best:
            return "n/a"
        return f"{best[a][0] / best[b][0]:.2f}x"

    low, high = min(args.nodes), max(args.nodes)
    print("\ntargets:")
    print(
        "  fastcache-autobatching / emcache-autobatching, 1 node (>= 1.0x):",
        ratio(("fastcache-autobatching", low), ("emcache-autobatching", low)),
    )
    for name in ("fastcache", "fastcache-autobatching"):
        print(f"  {name}, {high} nodes / 1 node (>= 0.95x):", ratio((name, high), (name, low)))
    for count in args.nodes:
        print(
            f"  fastcache / emcache, no autobatching, {count} node(s) (>= 1.2x):",
            ratio(("fastcache", count), ("emcache", count)),
        )


if __name__ == "__main__":
    main()
