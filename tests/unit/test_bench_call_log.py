"""cachebench's call log: what a worker logs, the file it writes, and what call_tails reads."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from array import array
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from django_fastcache.bench import calllog
from django_fastcache.bench.stats import ACTIONS
from django_fastcache.bench.workload import Workload, run_ops

ROOT = Path(__file__).resolve().parents[2]


class _DictCache:
    def __init__(self) -> None:
        self.data: dict[bytes, Any] = {}

    def get(self, key: bytes) -> Any:
        return self.data.get(key)

    def set(self, key: bytes, value: Any) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None


def _bench_module(name: str) -> ModuleType:
    """One of the scripts in bench/, loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _call_tails() -> ModuleType:
    return _bench_module("call_tails")


def test_the_log_holds_every_kept_call_as_its_samples_do() -> None:
    workload = Workload(procs=1, ops=3000)
    calls = array("q")
    measured = run_ops(_DictCache(), workload, seed=1, calls=calls)
    assert len(calls) == calllog.FIELDS * workload.kept_per_worker
    logged: dict[str, list[int]] = {action: [] for action in ACTIONS}
    ends = []
    cpu_times = []
    for offset in range(0, len(calls), calllog.FIELDS):
        action, end, duration, cpu = calls[offset : offset + calllog.FIELDS]
        logged[ACTIONS[action]].append(duration)
        ends.append(end)
        cpu_times.append(cpu)
    # The same calls, in the same order, with the durations the samples hold.
    assert {action: list(measured.samples[action]) for action in ACTIONS} == logged
    # The thread's CPU clock, read around each call: never negative, and the calls into a
    # dict (microseconds at most) used some of it in all.
    assert min(cpu_times) >= 0
    assert sum(cpu_times) > 0
    assert ends == sorted(ends)
    assert measured.started_ns < ends[0]
    assert ends[-1] <= measured.finished_ns


def test_without_a_log_nothing_is_logged_and_the_samples_are_the_same() -> None:
    workload = Workload(procs=1, ops=2000)
    plain = run_ops(_DictCache(), workload, seed=2)
    logged = run_ops(_DictCache(), workload, seed=2, calls=array("q"))
    assert {a: len(v) for a, v in plain.samples.items()} == {
        a: len(v) for a, v in logged.samples.items()
    }
    assert plain.misses == logged.misses


def test_a_written_log_reads_back(tmp_path: Path) -> None:
    started = 1_000_000_000
    # get 100 µs ending at 0.5 s (20 µs of CPU), set 2 ms at 1.25 s (40 µs), delete 30 µs
    # at 2 s (10 µs).
    calls = array("q", [0, started + 500_000_000, 100_000, 20_000])
    calls.extend([1, started + 1_250_000_000, 2_000_000, 40_000])
    calls.extend([2, started + 2_000_000_000, 30_000, 10_000])
    usage = {name: 1.0 for name in calllog.USAGE_FIELDS}
    path = calllog.write(tmp_path, "fastcache-tiered", 3, started, usage, calls)
    assert path == tmp_path / "fastcache-tiered.3.calls"
    log = calllog.read(path)
    assert (log.row, log.worker, log.started_ns, log.usage) == (
        "fastcache-tiered",
        3,
        started,
        usage,
    )
    assert log.ends == {"get": [0.5], "set": [1.25], "delete": [2.0]}
    assert log.durations == {"get": [100.0], "set": [2000.0], "delete": [30.0]}
    assert log.cpu == {"get": [20.0], "set": [40.0], "delete": [10.0]}
    assert calllog.read_directory(tmp_path) == {"fastcache-tiered": [log]}


def test_a_log_written_before_cpu_times_were_kept_reads_back_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = {"row": "old", "worker": 0, "started_ns": 0, "actions": list(ACTIONS)}
    # (The resource usage such a log holds: no scheduler figures.)
    header.update(usage={name: 0.001 for name in calllog.RUSAGE_FIELDS}, calls=2)
    body = array("q", [0, 500_000_000, 100_000, 1, 600_000_000, 200_000]).tobytes()
    (tmp_path / "old.0.calls").write_bytes(json.dumps(header).encode() + b"\n" + body)
    log = calllog.read(tmp_path / "old.0.calls")
    assert log.durations == {"get": [100.0], "set": [200.0], "delete": []}
    assert log.cpu == {"get": [], "set": [], "delete": []}
    assert _call_tails().main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "old: 1 get calls from 1 workers" in out
    assert "CPU µs" not in out
    assert "run queue" not in out


def test_a_log_of_a_wrong_length_is_refused_on_both_sides(tmp_path: Path) -> None:
    usage = {name: 0.0 for name in calllog.USAGE_FIELDS}
    with pytest.raises(ValueError, match="4 integers per call"):
        calllog.write(tmp_path, "row", 0, 0, usage, array("q", [0, 1, 2]))
    path = calllog.write(tmp_path, "row", 0, 0, usage, array("q", [0, 1, 2, 3]))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="1 calls announced"):
        calllog.read(path)
    path.write_bytes(b"not json\n")
    with pytest.raises(ValueError, match="not a cachebench call log"):
        calllog.read(path)
    # A header announcing a layout this code does not know.
    header = {"row": "row", "worker": 0, "started_ns": 0, "actions": list(ACTIONS)}
    header.update(usage={}, calls=1, fields=5)
    path.write_bytes(json.dumps(header).encode() + b"\n" + array("q", range(5)).tobytes())
    with pytest.raises(ValueError, match="5 integers per call, not a call log this reads"):
        calllog.read(path)


def test_call_tails_prints_quantiles_usage_and_where_slow_calls_fall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = 0
    calls = array("q")
    # 1,000 gets of 100 µs (30 µs of CPU), spread over two seconds, and ten of 3 ms (200 µs
    # of CPU), all in the first tenth of a second (of the second second).
    for n in range(1000):
        calls.extend([0, 2_000_000 * n, 100_000, 30_000])
    for n in range(10):
        calls.extend([0, 1_000_000_000 + 5_000_000 * n, 3_000_000, 200_000])
    usage = {name: 0.0 for name in calllog.USAGE_FIELDS}
    usage.update(ru_utime=0.0202, ru_nivcsw=101.0)
    calllog.write(tmp_path, "tiered", 0, started, usage, calls)
    assert _call_tails().main([str(tmp_path), "--threshold", "1000"]) == 0
    out = capsys.readouterr().out
    assert "tiered: 1,010 get calls from 1 workers" in out
    # P50 and P99 are 100 µs, P99.9 and the maximum 3 ms; 10 of 1,010 over 1 and 2 ms.
    numbers = out.splitlines()[2].split()
    assert numbers[:6] == ["100.0", "100.0", "100.0", "100.0", "3000.0", "3000.0"]
    assert numbers[6:] == ["0.99%", "0.99%", "0.00%"]
    # The same quantiles of the CPU times, and their mean.
    cpu_line = out.splitlines()[3].split()
    assert cpu_line[:2] == ["CPU", "µs"]
    assert cpu_line[2:9] == ["30.0", "30.0", "30.0", "30.0", "200.0", "200.0", "mean"]
    assert cpu_line[9] == "31.7"
    assert "CPU user 20.0 µs" in out
    assert "100 preemptions" in out
    assert "run queue" not in out  # no scheduler figures in this log
    # Every slow call in the first tenth: 10 of the 110 calls there (50 of each second's).
    tenths = out.split("by tenth of each second:")[1].splitlines()[0].split()
    assert tenths[0] == "9.09"
    assert set(tenths[1:]) == {"0.00"}
    seconds = out.split("by second of the run:")[1].splitlines()[0].split()
    assert seconds[:2] == ["0.00", "1.96"]
    assert set(seconds[2:]) == {"-"}


def test_call_tails_prints_the_run_queue_wait_per_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = array("q")
    for n in range(100):
        calls.extend([0, 1_000_000 * n, 100_000, 30_000])
    usage = {name: 0.0 for name in calllog.USAGE_FIELDS}
    # 100 calls: 3 ms on a CPU, 1 ms waiting for one (25 %), 1.5 ms over all threads.
    usage.update(sched_run_ns=3e6, sched_wait_ns=1e6, sched_wait_all_ns=1.5e6)
    calllog.write(tmp_path, "tiered", 0, 0, usage, calls)
    assert _call_tails().main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the request thread waited 10.0 µs per call (25 % of" in out
    assert "all threads 15.0 µs" in out


def test_tier_targets_reports_each_rows_cpu_and_run_queue_wait_per_call(tmp_path: Path) -> None:
    calls = array("q", [0, 1, 2, 3] * 200)
    for worker, (cpu, wait) in enumerate(((0.004, 10e6), (0.006, 30e6))):
        usage = {name: 0.0 for name in calllog.USAGE_FIELDS}
        usage.update(ru_utime=cpu, ru_stime=0.002, sched_wait_ns=wait)
        calllog.write(tmp_path, "tiered", worker, 0, usage, calls)
    usage = {name: 0.0 for name in calllog.USAGE_FIELDS}
    usage.update(ru_utime=0.001)
    calllog.write(tmp_path, "memcached", 0, 0, usage, calls)
    targets = _bench_module("tier_targets")
    # 400 tiered calls: 14 ms of CPU and 40 ms of waits; 200 memcached calls, 1 ms.
    assert targets.load_per_call(str(tmp_path)) == "memcached 5.0 / 0.0, tiered 35.0 / 100.0"


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux schedstat")
def test_usage_counts_the_calling_threads_time_on_a_cpu() -> None:
    before = calllog.usage_now()
    deadline = time.process_time() + 0.02
    while time.process_time() < deadline:
        pass
    used = calllog.usage_between(before, calllog.usage_now())
    assert set(used) == set(calllog.USAGE_FIELDS)
    assert used["sched_run_ns"] >= 0.015e9
    assert used["sched_wait_ns"] >= 0
    assert used["sched_wait_all_ns"] >= 0


def test_call_tails_refuses_a_directory_without_logs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _call_tails().main([str(tmp_path)])
