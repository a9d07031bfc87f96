"""Async gets when there are more tasks than connections: every call may wait for one.

    python bench/async_contention.py [--tasks 32] [--calls 500] [--connections 4] [--rounds 3]

Starts its own memcached on loopback and runs ``--tasks`` tasks on uvloop (stock asyncio
with ``--asyncio``), each doing ``--calls`` gets of one 100-byte value through one
``Client`` with ``--connections`` connections. Prints, per round, gets per second (wall)
and the process's CPU time per get. The waits for a connection are the pool's acquire
path, which cancellation safety depends on.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from django_fastcache.client import Client
from django_fastcache.testing.servers import MemcachedServer


async def one_round(location: str, tasks: int, calls: int, connections: int) -> tuple[float, float]:
    client = Client([location], max_connections=connections, timeout=5.0)
    try:
        await client.set(b"k", b"v" * 100)

        async def worker() -> None:
            for _ in range(calls):
                await client.get(b"k")

        began, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*[worker() for _ in range(tasks)])
        total = tasks * calls
        return total / (time.perf_counter() - began), (time.process_time() - cpu) / total
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--asyncio", action="store_true", help="stock asyncio, not uvloop")
    args = parser.parse_args()
    runner = asyncio.run
    if not args.asyncio:
        import uvloop

        runner = uvloop.run
    server = MemcachedServer()
    server.start()
    try:
        for number in range(args.rounds):
            rate, cpu = runner(one_round(server.location, args.tasks, args.calls, args.connections))
            print(f"round {number}: {rate:,.0f} gets/s, {cpu * 1e6:.1f} µs CPU per get")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
