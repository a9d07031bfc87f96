"""``python -m tests.consistency [--seconds N] [--processes P] [--seed S]``: a soak run.

Runs the workers under chaos for N seconds (at least one kill, stop and restart of
memcached, then more at random), checks every read, prints a summary and the stale reads
found, and exits with status 1 if there were any (or if any call raised).
"""

from __future__ import annotations

import argparse
import sys

from .runner import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.consistency", description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0, help="how long (default 600)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (>= 4)")
    parser.add_argument("--keys", type=int, default=20, help="size of the key space")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's randomness")
    parser.add_argument("--directory", default=None, help="keep the logs and disk tier here")
    args = parser.parse_args(argv)
    result = run(
        args.seconds,
        processes=args.processes,
        keys=args.keys,
        seed=args.seed,
        directory=args.directory,
        log=lambda line: print(line, flush=True),
    )
    print(result.report(limit=20))
    return 1 if result.violations or result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
