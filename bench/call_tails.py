"""The shape of each row's tail, from cachebench's call logs: where its slow calls fall.

    python example_project/manage.py cachebench --backends fastcache,fastcache-tiered \\
        --call-log /tmp/calls
    python bench/call_tails.py /tmp/calls [--action get] [--threshold 500]

A P99 is one point of a distribution that moves by a third from one run to the next on the
development machine. The call logs (``--call-log``, :mod:`django_fastcache.bench.calllog`)
keep every kept call's end and duration, and each worker's resource usage; this prints, per
row (in the order of the logs' names):

* the action's quantiles from the median to P99.9, its maximum, and the share of calls over
  1, 2 and 5 ms: whether a tail is wider from P90 up (every call waits a little longer) or
  only at its end (a few stalls); and the same quantiles of the calling thread's CPU time
  over each call (logs written before it was kept show none): what the calls cost, apart
  from what they waited for;
* the workers' CPU per kept call (user and system, every thread of the process, over all
  their operations: the warm-up's add about 1 %), context switches (voluntary: waits;
  involuntary: preemptions) and minor page faults per thousand kept calls; and, where
  Linux keeps them (logs from before they were kept show none), the time the request thread
  spent waiting runnable in the scheduler's run queue per kept call, with its share of the
  thread's wall time (on a CPU or waiting for one), and the wait of all the process's
  threads: a row whose calls wait longer for a CPU, at the same CPU per call, competes
  harder for it;
* the share of slow calls (over ``--threshold`` µs; by default the row's own P99) by tenth
  of a second within each second since the worker started, and by whole second of the run:
  work done once a second (the disk tier's landings) shows in the first, a burst of the
  machine's in the second.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from django_fastcache.bench.calllog import WorkerLog, read_directory

QUANTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
#: Shares of calls over these durations, µs.
OVER = (1000.0, 2000.0, 5000.0)
SECONDS_SHOWN = 12


def quantile(ordered: list[float], percent: float) -> float:
    """cachebench's own percentile: ``sorted(v)[int(len(v) * p) - 1]``."""
    return ordered[max(0, int(len(ordered) * percent / 100.0) - 1)]


def shares(flags: list[bool], groups: list[int], size: int) -> list[float | None]:
    """Per group 0..size-1, the percentage of ``flags`` set (None for an empty group)."""
    counts = [0] * size
    totals = [0] * size
    for flag, group in zip(flags, groups):
        if 0 <= group < size:
            totals[group] += 1
            counts[group] += flag
    return [None if not total else 100.0 * count / total for count, total in zip(counts, totals)]


def describe_row(name: str, logs: list[WorkerLog], action: str, threshold: float | None) -> str:
    ends = [end for log in logs for end in log.ends.get(action, [])]
    durations = [d for log in logs for d in log.durations.get(action, [])]
    if not durations:
        return f"{name}: no {action} calls logged"
    ordered = sorted(durations)
    calls = sum(len(values) for log in logs for values in log.durations.values())
    lines = [f"{name}: {len(durations):,} {action} calls from {len(logs)} workers"]
    lines.append(
        "  µs     "
        + "  ".join(f"P{q:g}".rjust(8) for q in QUANTILES)
        + "       max  "
        + "  ".join(f">{limit / 1000:g}ms" for limit in OVER)
    )
    over = "  ".join(
        f"{100.0 * sum(d > limit for d in durations) / len(durations):5.2f}%" for limit in OVER
    )
    lines.append(
        "         "
        + "  ".join(f"{quantile(ordered, q):8.1f}" for q in QUANTILES)
        + f"  {ordered[-1]:8.1f}  {over}"
    )
    cpu = sorted(c for log in logs for c in log.cpu.get(action, []))
    if cpu:
        lines.append(
            "  CPU µs "
            + "  ".join(f"{quantile(cpu, q):8.1f}" for q in QUANTILES)
            + f"  {cpu[-1]:8.1f}  mean {sum(cpu) / len(cpu):.1f}"
        )
    usage = {key: sum(log.usage.get(key, 0.0) for log in logs) for key in logs[0].usage}
    lines.append(
        f"  per call (all actions, {calls:,}): CPU user {usage['ru_utime'] / calls * 1e6:.1f} µs, "
        f"system {usage['ru_stime'] / calls * 1e6:.1f} µs; per 1,000 calls: "
        f"{usage['ru_nvcsw'] / calls * 1000:.0f} waits, "
        f"{usage['ru_nivcsw'] / calls * 1000:.0f} preemptions, "
        f"{usage['ru_minflt'] / calls * 1000:.1f} minor faults"
    )
    if usage.get("sched_run_ns"):
        waited = usage["sched_wait_ns"]
        lines.append(
            f"  run queue: the request thread waited {waited / calls / 1e3:.1f} µs per call "
            f"({100.0 * waited / (waited + usage['sched_run_ns']):.0f} % of its time on or "
            f"waiting for a CPU); all threads {usage['sched_wait_all_ns'] / calls / 1e3:.1f} µs"
        )
    limit = quantile(ordered, 99.0) if threshold is None else threshold
    slow = [d > limit for d in durations]
    tenths = shares(slow, [int(end % 1.0 * 10) for end in ends], 10)
    seconds = shares(slow, [int(end) for end in ends], SECONDS_SHOWN)
    shown = "  ".join("  -  " if s is None else f"{s:5.2f}" for s in tenths)
    lines.append(f"  % over {limit:.0f} µs by tenth of each second: {shown}")
    shown = "  ".join("  -  " if s is None else f"{s:5.2f}" for s in seconds)
    lines.append(f"  % over {limit:.0f} µs by second of the run:    {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the --call-log directory of a cachebench run")
    parser.add_argument("--action", default="get", choices=("get", "set", "delete"))
    parser.add_argument(
        "--threshold",
        type=float,
        help="µs over which a call counts as slow (default: each row's own P99)",
    )
    args = parser.parse_args(argv)
    rows = read_directory(args.directory)
    if not rows:
        parser.error(f"no call logs in {args.directory} (cachebench --call-log writes them)")
    for name, logs in rows.items():
        print(describe_row(name, logs, args.action, args.threshold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
