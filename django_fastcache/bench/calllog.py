"""cachebench's call log: every kept call of one worker, with when it ended, for tail analysis.

A row's P99 says how slow its slowest calls were, not when they came or what the worker
paid meanwhile. With ``--call-log DIR`` each worker also writes ``DIR/<row>.<index>.calls``:
one JSON header line (row, worker, when its operations started, and its process's resource
usage over them, warm-up included: CPU, context switches, page faults, and on Linux the
time its threads waited in the scheduler's run queue), then the kept calls as native 64-bit
integers, four per call: action (an index into ``ACTIONS``), end time and duration, in
nanoseconds of ``time.perf_counter_ns``, and the calling thread's CPU time over the call
(``time.thread_time_ns``, read just outside the timed window: a log costs each operation
two reads of that clock, about 0.3 µs each on the development machine, which the times do
not include). ``bench/call_tails.py`` reads them. Logs written before the CPU time was kept
(three integers per call, no ``fields`` in the header) read back without it.
"""

from __future__ import annotations

import json
import os
import resource
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django_fastcache.bench.stats import ACTIONS

#: Integers per call in a log: action index, end time, duration, CPU time.
FIELDS = 4
#: Integers per call in the logs written before the CPU time was kept.
_FIELDS_BEFORE_CPU = 3
SUFFIX = ".calls"
#: The resource usage fields kept, as ``resource.getrusage`` names them.
RUSAGE_FIELDS = ("ru_utime", "ru_stime", "ru_nvcsw", "ru_nivcsw", "ru_minflt", "ru_majflt")
#: From Linux's ``schedstat`` (nanoseconds; 0 elsewhere): the calling thread's time on a CPU
#: and waiting runnable in a run queue, and the same waits summed over the process's threads
#: (those alive when read: an ended thread's waits are gone with it).
SCHED_FIELDS = ("sched_run_ns", "sched_wait_ns", "sched_wait_all_ns")
USAGE_FIELDS = RUSAGE_FIELDS + SCHED_FIELDS


def _schedstat(path: str) -> tuple[float, float]:
    """A thread's time on a CPU and waiting in a run queue, ns; zeros where not readable."""
    try:
        with open(path, "rb") as file:
            on_cpu, waiting = file.read().split()[:2]
        return float(on_cpu), float(waiting)
    except (OSError, ValueError):
        return 0.0, 0.0


def usage_now() -> dict[str, float]:
    """This process's resource usage so far (every thread; the scheduler's run time and run
    queue wait of the calling thread, and the wait of all), the fields :func:`write` keeps."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    usage = {name: float(getattr(now, name)) for name in RUSAGE_FIELDS}
    usage["sched_run_ns"], usage["sched_wait_ns"] = _schedstat("/proc/thread-self/schedstat")
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        threads = []
    usage["sched_wait_all_ns"] = sum(
        _schedstat(f"/proc/self/task/{thread}/schedstat")[1] for thread in threads
    )
    return usage


def usage_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in USAGE_FIELDS}


def path_for(directory: str | Path, row: str, index: int) -> Path:
    return Path(directory) / f"{row}.{index}{SUFFIX}"


def write(
    directory: str | Path,
    row: str,
    index: int,
    started_ns: int,
    usage: dict[str, float],
    calls: array[int],
) -> Path:
    """Write one worker's log (``calls``: :data:`FIELDS` integers per call); its path."""
    if len(calls) % FIELDS:
        raise ValueError(f"a call log holds {FIELDS} integers per call, got {len(calls)}")
    os.makedirs(directory, exist_ok=True)
    header = {
        "row": row,
        "worker": index,
        "started_ns": started_ns,
        "actions": list(ACTIONS),
        "usage": usage,
        "fields": FIELDS,
        "calls": len(calls) // FIELDS,
    }
    path = path_for(directory, row, index)
    with open(path, "wb") as file:
        file.write(json.dumps(header).encode() + b"\n")
        file.write(calls.tobytes())
    return path


@dataclass
class WorkerLog:
    """One worker's log, as read back: its header's fields, and its calls by action."""

    row: str
    worker: int
    started_ns: int
    usage: dict[str, float]
    #: Per action: each kept call's end, in seconds since the worker's operations started.
    ends: dict[str, list[float]]
    #: Per action: each kept call's duration, in microseconds (in the order of ``ends``).
    durations: dict[str, list[float]]
    #: Per action: the calling thread's CPU time over each kept call, in microseconds (in
    #: the order of ``ends``; empty in a log written before it was kept).
    cpu: dict[str, list[float]]


def read(path: str | Path) -> WorkerLog:
    """Read one worker's log back; ValueError for a file that is not one."""
    with open(path, "rb") as file:
        first = file.readline()
        body = file.read()
    try:
        header: dict[str, Any] = json.loads(first)
        actions = list(header["actions"])
        count = int(header["calls"])
        fields = int(header.get("fields", _FIELDS_BEFORE_CPU))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a cachebench call log: {exc}") from None
    if fields not in (FIELDS, _FIELDS_BEFORE_CPU):
        raise ValueError(f"{path}: {fields} integers per call, not a call log this reads")
    calls = array("q")
    if len(body) != count * fields * calls.itemsize:
        raise ValueError(f"{path}: {count} calls announced, {len(body)} bytes follow")
    calls.frombytes(body)
    started = int(header["started_ns"])
    ends: dict[str, list[float]] = {action: [] for action in actions}
    durations: dict[str, list[float]] = {action: [] for action in actions}
    cpu: dict[str, list[float]] = {action: [] for action in actions}
    for offset in range(0, len(calls), fields):
        action = actions[calls[offset]]
        ends[action].append((calls[offset + 1] - started) / 1e9)
        durations[action].append(calls[offset + 2] / 1e3)
        if fields == FIELDS:
            cpu[action].append(calls[offset + 3] / 1e3)
    return WorkerLog(
        row=str(header["row"]),
        worker=int(header["worker"]),
        started_ns=started,
        usage={str(k): float(v) for k, v in header["usage"].items()},
        ends=ends,
        durations=durations,
        cpu=cpu,
    )


def read_directory(directory: str | Path) -> dict[str, list[WorkerLog]]:
    """Every log in ``directory``, by row, workers in order."""
    rows: dict[str, list[WorkerLog]] = {}
    for path in sorted(Path(directory).glob(f"*{SUFFIX}")):
        log = read(path)
        rows.setdefault(log.row, []).append(log)
    for logs in rows.values():
        logs.sort(key=lambda log: log.worker)
    return rows


__all__ = [
    "FIELDS",
    "WorkerLog",
    "path_for",
    "read",
    "read_directory",
    "usage_between",
    "usage_now",
    "write",
]
