"""Two builds' cachebench rows side by side: single-row runs in turns, ratios per pair.

    python bench/paired_rows.py BEFORE AFTER [--pairs 8] [--backends fastcache-tiered]
        [-- more cachebench options]

On this project's 2-vCPU development machine one row's get median moves by as much as
±15 % from one run to the next (the fastcache row's went from 66 to 99 µs in one evening),
so two builds benchmarked in separate runs differ by more than most changes do. This runs
the same rows with each build in turn, ``--pairs`` times, so that the two runs of a pair
share the machine's state, and prints, per row, action and statistic, the median over the
pairs of AFTER / BEFORE, each pair's ratio, and in how many pairs AFTER was lower. The
builds take turns going first (BEFORE in odd pairs, AFTER in even ones). What noise alone
gives: one compiled build against a copy of itself, tiered row, 8 pairs (4 in a fixed
order, 4 taking turns), P99 ratios 0.84 to 1.15 and median ratios 0.84 to 1.11.

BEFORE and AFTER are trees holding ``example_project/`` and the package: checkouts, or the
compiled trees ``scripts/compiled`` makes. Each run is ``python example_project/manage.py
cachebench --backends ... --no-plot --no-progress`` from the tree, with the tree first on
``PYTHONPATH``; a run that fails stops the comparison, with its output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

STATISTICS = ("median", "p99")


def run(tree: str, backends: str, extra: list[str], output: str) -> dict[str, dict[str, float]]:
    """One cachebench run from ``tree``: {"row action statistic": nanoseconds}."""
    command = [
        sys.executable,
        "example_project/manage.py",
        "cachebench",
        "--backends",
        backends,
        "--no-plot",
        "--no-progress",
        "--output-dir",
        output,
        *extra,
    ]
    environment = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"cachebench failed in {tree}:\n{done.stdout}\n{done.stderr}")
    with open(os.path.join(output, "results.json")) as file:
        rows = json.load(file)["rows"]
    figures: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["status"] != "ok":
            sys.exit(f"row {row['name']} did not run in {tree}: {row['status']}")
        for action, values in row["actions"].items():
            for name in STATISTICS:
                figures.setdefault(row["name"], {})[f"{action} {name}"] = values[f"{name}_ns"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the tree of the build compared against")
    parser.add_argument("after", help="the tree of the build compared")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--backends", default="fastcache-tiered")
    argv = sys.argv[1:]
    # Everything after "--" goes to cachebench.
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    ratios: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="fastcache-paired-") as directory:
        for pair in range(1, args.pairs + 1):
            # The two builds take turns going first, so that whatever going first or second
            # does falls on both alike.
            turns = [("before", args.before), ("after", args.after)]
            if pair % 2 == 0:
                turns.reverse()
            figures = {
                label: run(tree, args.backends, extra, os.path.join(directory, f"{pair}-{label}"))
                for label, tree in turns
            }
            before, after = figures["before"], figures["after"]
            for row, figures in after.items():
                for key, value in figures.items():
                    ratios.setdefault((row, key), []).append(value / before[row][key])
            print(f"pair {pair}/{args.pairs} done", file=sys.stderr)
    print(f"after / before, median of {args.pairs} pairs (each pair's ratio; pairs lower)")
    for (row, key), values in ratios.items():
        lower = sum(value < 1 for value in values)
        each = " ".join(f"{value:.2f}" for value in values)
        print(f"{row:18} {key:16} {statistics.median(values):6.3f}  ({each}; {lower} lower)")


if __name__ == "__main__":
    main()
