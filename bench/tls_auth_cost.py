"""What TLS and ASCII authentication cost: per call, and per new connection.

    python bench/tls_auth_cost.py [--rounds 7] [--calls 2000] [--connects 200]

Starts three memcached processes on loopback: plain, with TLS (``-Z``, certificates made
on the spot) and with authentication (``-Y``). For each, with the blocking client and the
asyncio client (one caller, calls in sequence):

* a ``get`` hit and a ``set`` of 100 bytes: CPU (``time.process_time``) and wall time per
  call, best round of ``--rounds``, the rounds interleaved so machine noise falls on all
  cases alike;
* opening a connection and making its first request (blocking client): wall time per
  connection, which is where the TLS handshake and the authentication round trip go.

Ratios are against the plain server. Figures depend on the machine: quote the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.testing.certificates import make_certificates
from django_fastcache.testing.servers import MemcachedServer, ServerTLS

VALUE = b"x" * 100
USER, PASSWORD = "bench", "bench-password"
Servers = dict[str, tuple[MemcachedServer, dict[str, Any]]]


def measure(function: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        function()
    return (
        (time.process_time() - cpu) / calls * 1e6,
        (time.perf_counter() - wall) / calls * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--connects", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fastcache-bench-tls-") as directory:
        certificates = make_certificates(directory, server_names=("localhost",))
        tls = ServerTLS(certificates.server_cert, certificates.server_key)
        servers: Servers = {
            "plain": (MemcachedServer(), {}),
            "tls": (MemcachedServer(tls=tls), {"ssl": {"ca_file": certificates.ca_file}}),
            "auth": (
                MemcachedServer(users={USER: PASSWORD}),
                {"username": USER, "password": PASSWORD},
            ),
        }
        for server, _options in servers.values():
            server.start()
        try:
            run(args, servers)
        finally:
            for server, _options in servers.values():
                server.stop()


def run(
    args: argparse.Namespace, servers: dict[str, tuple[MemcachedServer, dict[str, Any]]]
) -> None:
    cases: dict[str, Callable[[], tuple[float, float]]] = {}
    loop = asyncio.new_event_loop()
    for name, (server, options) in servers.items():
        # By name, so that the certificate (made for "localhost") checks out.
        location = f"localhost:{server.port}"
        client = Client([location], timeout=5.0, **options)
        blocking = BlockingClient(client.cluster)
        run_blocking(blocking.set(b"key", VALUE))

        def sync_get(blocking: BlockingClient = blocking) -> tuple[float, float]:
            return measure(lambda: run_blocking(blocking.get(b"key")), args.calls)

        def sync_set(blocking: BlockingClient = blocking) -> tuple[float, float]:
            return measure(lambda: run_blocking(blocking.set(b"key", VALUE)), args.calls)

        def async_get(client: Client = client) -> tuple[float, float]:
            async def calls() -> None:
                for _ in range(args.calls):
                    await client.get(b"key")

            cpu, wall = time.process_time(), time.perf_counter()
            loop.run_until_complete(calls())
            return (
                (time.process_time() - cpu) / args.calls * 1e6,
                (time.perf_counter() - wall) / args.calls * 1e6,
            )

        def connect(blocking: BlockingClient = blocking) -> tuple[float, float]:
            def once() -> None:
                blocking.close_thread_connections()
                run_blocking(blocking.get(b"key"))

            return measure(once, args.connects)

        cases[f"{name} blocking get"] = sync_get
        cases[f"{name} blocking set"] = sync_set
        cases[f"{name} async get"] = async_get
        cases[f"{name} connect + first get"] = connect

    best: dict[str, tuple[float, float]] = {}
    for _round in range(args.rounds):
        order = list(cases)
        random.shuffle(order)
        for case in order:
            cpu, wall = cases[case]()
            old = best.get(case)
            best[case] = (cpu, wall) if old is None else (min(old[0], cpu), min(old[1], wall))
    loop.close()

    print(f"best of {args.rounds} interleaved rounds; {args.calls} calls per case")
    print(f"{'case':<34}{'CPU µs':>9}{'wall µs':>10}{'CPU x plain':>12}{'wall x plain':>13}")
    for case in cases:
        cpu, wall = best[case]
        plain_cpu, plain_wall = best["plain" + case[case.index(" ") :]]
        print(
            f"{case:<34}{cpu:>9.1f}{wall:>10.1f}{cpu / plain_cpu:>12.2f}{wall / plain_wall:>13.2f}"
        )


if __name__ == "__main__":
    main()
