"""Two cachebench rows within a run, next to each row against itself across runs.

Whether a ratio target can tell the rows apart on this machine.

    python bench/row_noise.py [TREE] [--runs 8] [--rows fastcache,fastcache-tiered]
        [-- more cachebench options]

Runs cachebench ``--runs`` times with the two rows, in the order given in odd runs and
reversed in even ones, and prints, per action statistic:

* ``B / A within``: the second row against the first in each run (what a target reads);
* ``A / A across`` and ``B / B across``: each row against itself in the run before (the
  same code, two runs apart by one row's length plus a server's start).

When a row's ratio to itself crosses a target as often as the two rows' ratio does, one
run cannot say which side of the target the rows are on. TREE is as for
``bench/tier_targets.py`` (the default: this checkout).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paired_rows

KEYS = ("get median", "get p99", "set median", "set p99", "delete median", "delete p99")


def line(label: str, values: list[float]) -> str:
    cells = " ".join(f"{value:5.2f}" for value in values)
    spread = f"{min(values):.2f} to {max(values):.2f}, median {statistics.median(values):.2f}"
    return f"  {label:14} {cells}   ({spread})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "tree", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--rows", default="fastcache,fastcache-tiered")
    argv = sys.argv[1:]
    # Everything after "--" goes to cachebench.
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    first, second = (name.strip() for name in args.rows.split(","))
    if args.runs < 2:
        parser.error("--runs must be at least 2: a row is compared with its run before")
    runs: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="fastcache-row-noise-") as directory:
        for number in range(1, args.runs + 1):
            order = (first, second) if number % 2 else (second, first)
            output = os.path.join(directory, str(number))
            runs.append(paired_rows.run(args.tree, ",".join(order), extra, output))
            print(f"run {number}/{args.runs} done ({', '.join(order)})", file=sys.stderr)
    print(f"A = {first}, B = {second}; {args.runs} runs, odd runs A first, even runs B first")
    for key in KEYS:
        print(f"{key}:")
        print(line("B / A within", [run[second][key] / run[first][key] for run in runs]))
        for label, row in (("A / A across", first), ("B / B across", second)):
            across = [
                later[row][key] / earlier[row][key] for earlier, later in itertools.pairwise(runs)
            ]
            print(line(label, across))


if __name__ == "__main__":
    main()
