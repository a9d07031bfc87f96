"""The disk tier's cachebench targets, over several runs: which hold, in how many runs.

    python bench/tier_targets.py [TREE] [--runs 3] [-- more cachebench options]

The tier's targets compare rows of one cachebench run: the fastcache-tiered row against
the fastcache row (the same client, tier off) and against the memcached row
(PyLibMCCache), and the fastcache-outage row against diskcache's. On this project's 2-vCPU
development machine the ratios of one build move by up to 0.4 between runs an hour
apart, so one run says little: this runs the five rows ``--runs`` times, in three orders
in turn (each row first, middle and last once in three runs), and prints each target's
ratio per run, misses marked with ``*``, and in how many runs it held, then each run's
medians and P99s. A row that fails (an error in any operation) stops the script.

``--call-logs DIR``: each run also writes cachebench's call logs to ``DIR/run<N>``, and the
report ends with what each row's workers paid per call in each run: CPU (every thread), and
the time the request thread waited for a CPU (Linux). Under eight processes on two vCPUs the
waits are most of a call's time, and a row's tail follows the CPU all the rows' calls take.

TREE holds ``example_project/`` and the package: a checkout, or the compiled tree that
``scripts/compiled`` makes (the default: this checkout). Each run is ``python
example_project/manage.py cachebench --backends ... --no-plot --no-progress`` from the
tree, with the tree first on ``PYTHONPATH`` (``bench/paired_rows.py``'s runner).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paired_rows

from django_fastcache.bench import calllog

TIERED, FASTCACHE, MEMCACHED = "fastcache-tiered", "fastcache", "memcached"
OUTAGE, DISKCACHE = "fastcache-outage", "diskcache"
#: The orders the runs take in turn.
ORDERS = (
    (FASTCACHE, MEMCACHED, TIERED, DISKCACHE, OUTAGE),
    (OUTAGE, TIERED, DISKCACHE, FASTCACHE, MEMCACHED),
    (MEMCACHED, DISKCACHE, FASTCACHE, OUTAGE, TIERED),
)
#: (label, row, baseline row, "action statistic", the most the ratio may be).
TARGETS = (
    ("tiered / fastcache get median", TIERED, FASTCACHE, "get median", 1.05),
    ("tiered / fastcache get P99", TIERED, FASTCACHE, "get p99", 1.3),
    ("tiered / fastcache set median", TIERED, FASTCACHE, "set median", 1.2),
    ("tiered / fastcache set P99", TIERED, FASTCACHE, "set p99", 1.5),
    ("tiered / fastcache delete median", TIERED, FASTCACHE, "delete median", 1.2),
    ("tiered / fastcache delete P99", TIERED, FASTCACHE, "delete p99", 1.5),
    ("tiered / memcached get median", TIERED, MEMCACHED, "get median", 1.0),
    ("tiered / memcached get P99", TIERED, MEMCACHED, "get p99", 1.0),
    ("tiered / memcached set median", TIERED, MEMCACHED, "set median", 1.0),
    ("tiered / memcached set P99", TIERED, MEMCACHED, "set p99", 1.0),
    ("outage / diskcache get median", OUTAGE, DISKCACHE, "get median", 1.2),
)
#: The rows whose medians and P99s are printed per run and action.
SHOWN_ROWS = (FASTCACHE, TIERED, MEMCACHED)

Figures = dict[str, dict[str, float]]


def ratios(figures: Figures) -> list[float]:
    return [figures[row][key] / figures[base][key] for _label, row, base, key, _most in TARGETS]


def report(runs: list[tuple[tuple[str, ...], Figures]]) -> str:
    lines = [
        "target                            most  "
        + "  ".join(f"run {number:<2}" for number in range(1, len(runs) + 1))
        + "  held in"
    ]
    each_run = [ratios(figures) for _order, figures in runs]
    for index, (label, _row, _base, _key, most) in enumerate(TARGETS):
        values = [run_ratios[index] for run_ratios in each_run]
        cells = "  ".join(f"{value:5.2f}{'*' if value > most else ' '}" for value in values)
        held = sum(value <= most for value in values)
        lines.append(f"{label:33} {most:4.2f}  {cells}  {held} of {len(values)}")
    every = sum(all(value <= target[4] for value, target in zip(r, TARGETS)) for r in each_run)
    lines.append(f"runs that meet every target: {every} of {len(runs)}")
    lines.append("")
    lines.append("medians / P99s, µs")
    for number, (order, figures) in enumerate(runs, 1):
        lines.append(f"run {number} ({', '.join(order)}):")
        for action in ("get", "set", "delete"):
            cells = ", ".join(
                f"{row} {figures[row][f'{action} median'] / 1000:.1f} / "
                f"{figures[row][f'{action} p99'] / 1000:.1f}"
                for row in SHOWN_ROWS
            )
            lines.append(f"  {action}: {cells}")
        lines.append(
            f"  get: {OUTAGE} {figures[OUTAGE]['get median'] / 1000:.1f}, "
            f"{DISKCACHE} {figures[DISKCACHE]['get median'] / 1000:.1f} (medians)"
        )
    return "\n".join(lines)


def load_per_call(directory: str) -> str:
    """Per row of one run's call logs: CPU per call (every thread) and the request thread's
    run-queue wait per call, µs."""
    cells = []
    for row, logs in calllog.read_directory(directory).items():
        calls = sum(len(durations) for log in logs for durations in log.durations.values())
        usage = {key: sum(log.usage.get(key, 0.0) for log in logs) for key in logs[0].usage}
        cpu = (usage["ru_utime"] + usage["ru_stime"]) / calls * 1e6
        wait = usage.get("sched_wait_ns", 0.0) / calls / 1e3
        cells.append(f"{row} {cpu:.1f} / {wait:.1f}")
    return ", ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "tree", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--call-logs",
        metavar="DIR",
        help="write each run's call logs to DIR/run<N> and report each row's CPU and "
        "run-queue wait per call",
    )
    argv = sys.argv[1:]
    # Everything after "--" goes to cachebench.
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    runs: list[tuple[tuple[str, ...], Figures]] = []
    with tempfile.TemporaryDirectory(prefix="fastcache-targets-") as directory:
        for number in range(1, args.runs + 1):
            order = ORDERS[(number - 1) % len(ORDERS)]
            output = os.path.join(directory, str(number))
            options = list(extra)
            if args.call_logs:
                options += ["--call-log", os.path.join(args.call_logs, f"run{number}")]
            runs.append((order, paired_rows.run(args.tree, ",".join(order), options, output)))
            print(f"run {number}/{args.runs} done", file=sys.stderr)
    print(report(runs))
    if args.call_logs:
        print("")
        print("CPU per call (every thread) / run-queue wait of the request thread, µs")
        for number in range(1, args.runs + 1):
            loads = load_per_call(os.path.join(args.call_logs, f"run{number}"))
            print(f"run {number}: {loads}")


if __name__ == "__main__":
    main()
