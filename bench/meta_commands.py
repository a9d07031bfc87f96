"""The meta commands against their classic counterparts: CPU and wall time per call.

    python bench/meta_commands.py [--rounds 7] [--calls 2000] [--no-pin]

Starts its own memcached on loopback and drives the BlockingClient (one caller, one
connection). Each pair is a classic command and the meta command that does the same work:
get / meta_get (hit and miss), set / meta_set, incr / meta_arithmetic, get_many /
meta_get_many of 100 keys of which half exist (classic: one ``get`` line per 100 keys;
meta: 100 quiet ``mg`` lines and an ``mn``). A round runs every case once in a fresh
shuffled order; the best round of each case is kept. 100-byte values.

CPU is the process's ``time.process_time_ns``; wall is ``time.perf_counter_ns``. By
default the process and memcached share one CPU, as in bench/cpu_per_call.py, so that the
figures repeat on this 2-vCPU VM.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.testing.servers import MemcachedServer

VALUE = b"x" * 100
MANY = 100


def cases(client: BlockingClient) -> dict[str, Callable[[], Coroutine[Any, Any, object]]]:
    many = [b"many-%d" % i for i in range(MANY)]
    for key in many[::2]:
        run_blocking(client.set(key, VALUE))
    run_blocking(client.set(b"hit", VALUE))
    run_blocking(client.set(b"counter", b"0"))
    return {
        "get hit": lambda: client.get(b"hit"),
        "meta_get hit": lambda: client.meta_get(b"hit"),
        "get miss": lambda: client.get(b"miss"),
        "meta_get miss": lambda: client.meta_get(b"miss"),
        "set": lambda: client.set(b"written", VALUE),
        "meta_set": lambda: client.meta_set(b"written", VALUE),
        "incr": lambda: client.incr(b"counter"),
        "meta_arithmetic": lambda: client.meta_arithmetic(b"counter"),
        f"get_many {MANY}": lambda: client.get_many(many),
        f"meta_get_many {MANY}": lambda: client.meta_get_many(many),
    }


def pin_to_one_cpu(server: MemcachedServer) -> None:
    """This process and every thread of memcached on one CPU."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    assert server.process is not None
    for thread in os.listdir(f"/proc/{server.process.pid}/task"):
        os.sched_setaffinity(int(thread), {cpu})


def timed(call: Callable[[], Coroutine[Any, Any, object]], calls: int) -> tuple[int, int]:
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(calls):
        run_blocking(call())
    return time.perf_counter_ns() - wall, time.process_time_ns() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--no-pin", action="store_true", help="leave the CPUs unpinned")
    options = parser.parse_args()
    server = MemcachedServer().start()
    try:
        if not options.no_pin:
            pin_to_one_cpu(server)
        client = BlockingClient(Cluster([server.location], ClientSettings()))
        table = cases(client)
        best: dict[str, tuple[int, int]] = {}
        for _ in range(options.rounds):
            order = list(table)
            random.shuffle(order)
            for name in order:
                wall, cpu = timed(table[name], options.calls)
                previous = best.get(name)
                if previous is None or cpu < previous[1]:
                    best[name] = (wall, cpu)
        client.close_thread_connections()
    finally:
        server.stop()
    print(
        f"{options.rounds} rounds x {options.calls} calls, best round per case;"
        f" {'one CPU' if not options.no_pin else 'unpinned'}"
    )
    print(f"{'case':<22} {'wall us':>9} {'CPU us':>9} {'CPU x classic':>14}")
    names = list(table)
    for classic, meta in zip(names[::2], names[1::2]):
        for name in (classic, meta):
            wall, cpu = best[name]
            ratio = cpu / best[classic][1]
            print(
                f"{name:<22} {wall / options.calls / 1000:>9.1f}"
                f" {cpu / options.calls / 1000:>9.1f} {ratio:>14.2f}"
            )


if __name__ == "__main__":
    main()
