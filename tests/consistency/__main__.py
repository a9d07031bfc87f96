"""``python -m tests.consistency [--seconds N] [--processes P] [--seed S] [--faults F,...]``:
a soak run.

Runs the workers under chaos for N seconds (at least one of each fault asked for: by
default a kill, a stop and a restart of memcached; ``partition`` and ``cleaner`` are the
machine's faults, see the runner; then more at random), checks every read, prints a
summary and the stale reads found, and exits with status 1 if there were any (or if any
call raised).
"""

from __future__ import annotations

import argparse
import sys

from .runner import CLEANER, EVENT_KINDS, PARTITION, run

FAULTS = (*EVENT_KINDS, PARTITION, CLEANER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.consistency", description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0, help="how long (default 600)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (>= 4)")
    parser.add_argument("--keys", type=int, default=20, help="size of the key space")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's randomness")
    parser.add_argument("--directory", default=None, help="keep the logs and disk tier here")
    parser.add_argument(
        "--faults",
        default=",".join(EVENT_KINDS),
        help=f"comma-separated faults to inject, of {', '.join(FAULTS)} "
        f"(default {','.join(EVENT_KINDS)})",
    )
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.faults.split(",") if kind]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown or not kinds:
        parser.error(f"--faults: unknown {unknown}, choose among {', '.join(FAULTS)}")
    result = run(
        args.seconds,
        processes=args.processes,
        keys=args.keys,
        seed=args.seed,
        directory=args.directory,
        kinds=kinds,
        log=lambda line: print(line, flush=True),
    )
    print(result.report(limit=20))
    return 1 if result.violations or result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
