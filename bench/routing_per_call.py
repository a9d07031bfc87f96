"""CPU per routing decision: ``Cluster.node_index(key)`` and ``Cluster.group(keys)``.

    python bench/routing_per_call.py [--rounds 7] [--calls 20000] [--json FILE]

No server is needed: routing is pure computation. For each placement mode and 1, 2, 4 and
8 nodes, one case times ``--calls`` lookups of distinct typical keys (``:1:user:<n>``,
about 12 bytes) in a row; ``group`` times one call over 100 keys. A round runs every case
once, in a fresh shuffled order; the best round of each case is kept. Figures are
nanoseconds of process CPU time (``time.process_time_ns``) per key.

Run it from a compiled tree (``scripts/compiled``) to measure the build users get: the
cluster module is compiled there, the placement modes stay pure Python.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_fastcache import compiled
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.placement import PLACEMENTS

NODE_COUNTS = (1, 2, 4, 8)


def node_index_case(cluster: Cluster, keys: list[bytes]) -> Callable[[], int]:
    def run() -> int:
        node_index = cluster.node_index
        began = time.process_time_ns()
        for key in keys:
            node_index(key)
        return time.process_time_ns() - began

    return run


def group_case(cluster: Cluster, keys: list[bytes], repeat: int) -> Callable[[], int]:
    def run() -> int:
        began = time.process_time_ns()
        for _ in range(repeat):
            cluster.group(keys)
        return time.process_time_ns() - began

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    keys = [b":1:user:%d" % n for n in range(args.calls)]
    batch = keys[:100]
    repeat = max(1, args.calls // 100)
    cases: dict[tuple[str, int, str], tuple[Callable[[], int], int]] = {}
    for mode in args.placements.split(","):
        for count in NODE_COUNTS:
            servers = [f"10.0.0.{n + 1}:11211" for n in range(count)]
            cluster = Cluster(servers, ClientSettings(placement=mode))
            calls = args.calls if mode != "emcache" else max(1, args.calls // 20)
            cases[(mode, count, "node_index")] = (node_index_case(cluster, keys[:calls]), calls)
            cases[(mode, count, "group(100)")] = (
                group_case(cluster, batch, max(1, repeat // (20 if mode == "emcache" else 1))),
                100 * max(1, repeat // (20 if mode == "emcache" else 1)),
            )
    best: dict[tuple[str, int, str], float] = {}
    order = list(cases)
    for _ in range(args.rounds):
        random.shuffle(order)
        for case in order:
            run, count = cases[case]
            per_key = run() / count
            best[case] = min(best.get(case, per_key), per_key)
    print(f"routing, CPU ns per key, best of {args.rounds} rounds, FastCache {compiled.describe()}")
    print(f"{'placement':<16}{'operation':<12}" + "".join(f"{n:>8} node" for n in NODE_COUNTS))
    for mode in args.placements.split(","):
        for operation in ("node_index", "group(100)"):
            figures = "".join(f"{best[(mode, n, operation)]:>13.0f}" for n in NODE_COUNTS)
            print(f"{mode:<16}{operation:<12}{figures}")
    if args.json:
        with open(args.json, "w") as output:
            json.dump({f"{m}/{n}/{o}": v for (m, n, o), v in best.items()}, output, indent=1)


if __name__ == "__main__":
    main()
