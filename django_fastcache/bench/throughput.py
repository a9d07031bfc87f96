"""Throughput at a latency bound: the highest request rate served with P95 under 1 ms.

The method follows mutilate's as the Golang-memcache seed used it: an open-loop load at a
target rate (requests are due on a fixed schedule, whether or not the previous one was
slow), raised step by step until the bound breaks, for 100% gets and for 95% gets.

Per row and read ratio: ``procs`` load processes share the target rate. A Django cache
call blocks its process, so each load process has one request in flight; a request's time
includes the wait behind earlier ones that a slow backend causes (see :func:`run_step`),
so a backend that falls behind shows it as latency, as it would to users. Each step runs for
``step_seconds``; it passes when the P95 of those times is under the bound and the load
kept to the schedule (finished within 5% of the step's length). Rates double from
``start_rate`` until a step fails (twice: a failing step is measured again), then a few
bisection steps narrow the answer. Every part
is bounded: the number of steps, their length and the highest rate tried. The rate found
is also bounded by ``procs``: with one call in flight per process, ``procs`` / (time per
call) is the most any backend can reach.

Only the embedded servers are used: this is a loopback measurement.
"""

from __future__ import annotations

import contextlib
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from django_fastcache.bench.runner import (
    BARRIER_TIMEOUT,
    RowFailed,
    WorkerContext,
    build_cache,
    describe,
    setup_django,
)
from django_fastcache.bench.stats import percentile
from django_fastcache.bench.workload import key_for, prefill_items

# Calls each load process makes before the first step: connections, imports, caches warm.
WARMUP_CALLS = 200
# A step passes only if the load finished within this factor of the step's length.
ON_TIME = 1.05


@dataclass(frozen=True)
class ThroughputPlan:
    procs: int = 2
    keys: int = 1100
    step_seconds: float = 2.0
    start_rate: int = 1000
    max_rate: int = 1_024_000
    refine_steps: int = 3
    retries: int = 1
    bound_ns: int = 1_000_000
    quantile: float = 0.95
    read_ratios: tuple[float, ...] = (1.0, 0.95)

    def __post_init__(self) -> None:
        if self.procs < 1 or self.start_rate < 1 or self.step_seconds <= 0:
            raise ValueError("procs, start_rate and step_seconds must be positive")
        if self.max_rate < self.start_rate:
            raise ValueError("max_rate must be at least start_rate")


@dataclass(frozen=True)
class Step:
    target_rate: int
    achieved_rate: float
    p95_ns: int | None
    count: int
    on_time: bool
    passed: bool


@dataclass
class MixResult:
    read_ratio: float
    steps: list[Step] = field(default_factory=list)
    best: Step | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.read_ratio:.0%} get"


# -- the load process ---------------------------------------------------------------------


def load_main(
    config: dict[str, Any],
    settings_module: str | None,
    keys: int,
    read_ratio: float,
    index: int,
    fill_own: bool,
    barrier: Any,
    connection: Connection,
) -> None:
    """Serve step commands from the parent until told to stop."""
    try:
        setup_django(settings_module)
        cache = build_cache(config)
        if fill_own:
            # A process-local cache (locmem) sees no other process's pre-fill.
            for key, value in prefill_items(keys):
                cache.set(key, value)
        rng = random.Random(index)
        key_list = [key_for(number) for number in range(keys)]
        values = [str(number).encode() * rng.randrange(1, 100) for number in range(64)]
        for _ in range(WARMUP_CALLS):
            cache.get(rng.choice(key_list))
        connection.send(("ready",))
        while True:
            command = connection.recv()
            if command[0] == "stop":
                break
            _, rate, seconds = command
            barrier.wait(BARRIER_TIMEOUT)
            connection.send(
                ("step", *run_step(cache, rng, key_list, values, read_ratio, rate, seconds))
            )
        cache.close()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            barrier.abort()
        with contextlib.suppress(Exception):
            connection.send(("error", describe(exc)))


def run_step(
    cache: Any,
    rng: random.Random,
    key_list: Sequence[bytes],
    values: Sequence[bytes],
    read_ratio: float,
    rate: float,
    seconds: float,
) -> tuple[bytes, int, int]:
    """Issue ``rate * seconds`` requests on schedule; return (ns per request, count, elapsed).

    A request's time is its own call time plus the time it would have queued behind the
    earlier requests: the queue is replayed on the schedule from the measured call times.
    A backend slower than the schedule so accumulates waiting, as an open-loop client's
    users would see it, while this process' own late wake-ups from sleep, which are no
    part of any backend, are charged to nobody.
    """
    get, set_ = cache.get, cache.set
    timer = time.perf_counter_ns
    choose, pick = rng.random, rng.choice
    interval = 1e9 / rate
    count = max(1, int(rate * seconds))
    latencies = array("q")
    started = queue_free = timer()
    for number in range(count):
        due = started + int(number * interval)
        ahead = due - timer()
        if ahead > 0:
            time.sleep(ahead / 1e9)  # sleep, not spin: leave the CPU to the servers
        key = pick(key_list)
        if choose() < read_ratio:
            begin = timer()
            get(key)
            end = timer()
        else:
            value = pick(values)
            begin = timer()
            set_(key, value)
            end = timer()
        queue_free = max(due, queue_free) + (end - begin)
        latencies.append(queue_free - due)
    return latencies.tobytes(), count, timer() - started


# -- the parent ---------------------------------------------------------------------------


class LoadGroup:
    """``procs`` load processes for one row and read ratio, driven step by step."""

    def __init__(
        self,
        context: WorkerContext,
        config: dict[str, Any],
        settings_module: str | None,
        plan: ThroughputPlan,
        read_ratio: float,
        fill_own: bool,
    ) -> None:
        self.plan = plan
        self.barrier = context.Barrier(plan.procs)
        self.connections: list[Connection] = []
        self.processes = []
        for index in range(plan.procs):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=load_main,
                args=(
                    config,
                    settings_module,
                    plan.keys,
                    read_ratio,
                    index,
                    fill_own,
                    self.barrier,
                    child_end,
                ),
                name=f"cachebench-load-{index}",
            )
            process.start()
            child_end.close()
            self.connections.append(parent_end)
            self.processes.append(process)

    def _receive(self, timeout: float) -> list[tuple[Any, ...]]:
        messages = []
        deadline = time.monotonic() + timeout
        for index, connection in enumerate(self.connections):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                ready = connection.poll(remaining)
                message = connection.recv() if ready else None
            except (EOFError, OSError):
                raise RowFailed(f"load process {index} exited unexpectedly") from None
            if message is None:
                raise RowFailed(f"load process {index} did not answer in {timeout:.0f} s")
            if message[0] == "error":
                raise RowFailed(f"load process {index} failed: {message[1]}")
            messages.append(message)
        return messages

    def ready(self) -> None:
        self._receive(BARRIER_TIMEOUT)

    def step(self, rate: int) -> Step:
        plan = self.plan
        for connection in self.connections:
            connection.send(("step", rate / plan.procs, plan.step_seconds))
        # Generous: a saturated backend runs late; a hung one must not hang the run.
        replies = self._receive(plan.step_seconds * 10 + 30)
        latencies = array("q")
        count = 0
        elapsed = 0
        for _, packed, issued, took in replies:
            latencies.frombytes(packed)
            count += issued
            elapsed = max(elapsed, took)
        p95 = percentile(sorted(latencies), plan.quantile)
        on_time = elapsed <= plan.step_seconds * 1e9 * ON_TIME
        achieved = count / (elapsed / 1e9) if elapsed else 0.0
        passed = on_time and p95 is not None and p95 < plan.bound_ns
        return Step(rate, achieved, p95, count, on_time, passed)

    def close(self) -> None:
        for connection in self.connections:
            with contextlib.suppress(OSError, BrokenPipeError):
                connection.send(("stop",))
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for connection in self.connections:
            connection.close()


def search(measure: Callable[[int], Step], plan: ThroughputPlan) -> tuple[Step | None, list[Step]]:
    """Double the rate until a step fails, then bisect between the last pass and the fail.

    A failing step is measured again (``plan.retries`` times) before it counts: one stall
    of a shared machine must not end the search at a tenth of the real answer.
    """
    steps: list[Step] = []

    def attempt(rate: int) -> Step:
        for _ in range(plan.retries + 1):
            step = measure(rate)
            steps.append(step)
            if step.passed:
                break
        return step

    best: Step | None = None
    failed: Step | None = None
    rate = plan.start_rate
    while rate <= plan.max_rate:
        step = attempt(rate)
        if not step.passed:
            failed = step
            break
        best = step
        rate *= 2
    if best is not None and failed is not None:
        low, high = best.target_rate, failed.target_rate
        for _ in range(plan.refine_steps):
            middle = (low + high) // 2
            if middle in (low, high):
                break
            step = attempt(middle)
            if step.passed:
                best, low = step, middle
            else:
                high = middle
    return best, steps


def measure_mix(
    context: WorkerContext,
    config: dict[str, Any],
    settings_module: str | None,
    plan: ThroughputPlan,
    read_ratio: float,
    fill_own: bool,
    on_step: Callable[[Step], None] | None = None,
) -> MixResult:
    result = MixResult(read_ratio)
    group = LoadGroup(context, config, settings_module, plan, read_ratio, fill_own)
    try:
        group.ready()

        def measure(rate: int) -> Step:
            step = group.step(rate)
            if on_step is not None:
                on_step(step)
            return step

        result.best, result.steps = search(measure, plan)
    except RowFailed as exc:
        result.error = str(exc)
    finally:
        group.close()
    return result


def format_rate(step: Step | None, plan: ThroughputPlan) -> str:
    if step is None:
        return f"< {plan.start_rate}"
    return f"{step.achieved_rate:,.0f}"


def render_table(results: Sequence[tuple[str, Sequence[MixResult]]], plan: ThroughputPlan) -> str:
    """An RST simple table: per row, the rate reached and its P95, for each read ratio."""
    from django_fastcache.bench.stats import format_ns

    headings = ["Backend"]
    for ratio in plan.read_ratios:
        headings += [f"{ratio:.0%} get req/s", "P95"]
    lines_data = []
    for name, mixes in results:
        cells = [name]
        for mix in mixes:
            if mix.error is not None:
                cells += ["failed", ""]
            else:
                p95 = mix.best.p95_ns if mix.best else (mix.steps[0].p95_ns if mix.steps else None)
                cells += [format_rate(mix.best, plan), format_ns(p95).strip()]
        lines_data.append(cells)
    widths = (
        [max(len(h), *(len(r[i]) for r in lines_data)) for i, h in enumerate(headings)]
        if lines_data
        else [len(h) for h in headings]
    )
    border = " ".join("=" * w for w in widths)

    def line(cells: Sequence[str]) -> str:
        return " ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    title = f"Throughput at P{plan.quantile * 100:.0f} < {plan.bound_ns / 1e6:g} ms"
    body = [border, line(headings), border, *(line(r) for r in lines_data), border]
    return "\n".join([title, "-" * len(title), "", *body])
