"""One worker's operation loop and the pre-fill: DiskCache's benchmark workload, call for call.

The random calls are made in the order the original made them (key, value length, choice)
so that a worker seeded with its index draws the same operations as the original did.
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django_fastcache.bench.stats import ACTIONS

# How often a worker reports its progress: rare enough to cost nothing per call.
PROGRESS_EVERY = 1000


@dataclass(frozen=True)
class Workload:
    """What every worker runs. The defaults are the original benchmark's."""

    procs: int = 8
    ops: int = 100_000
    keys: int = 1100
    warmup: int = 1000
    get_ratio: float = 0.90
    set_ratio: float = 0.09

    def __post_init__(self) -> None:
        if self.procs < 1:
            raise ValueError("procs must be at least 1")
        if self.keys < 1:
            raise ValueError("keys must be at least 1")
        if self.warmup < 0:
            raise ValueError("warmup must not be negative")
        if self.ops <= self.warmup + 1:
            raise ValueError(
                f"ops ({self.ops}) must exceed warmup + 1 ({self.warmup + 1}): "
                "samples with count <= warmup are discarded"
            )

    @property
    def kept_per_worker(self) -> int:
        """Samples kept by one worker: counts run from 0, those above ``warmup`` are kept."""
        return self.ops - self.warmup - 1

    @property
    def kept_total(self) -> int:
        return self.kept_per_worker * self.procs

    def differences_from_original(self) -> list[str]:
        spec = Workload()
        notes = []
        for name in ("procs", "ops", "keys", "warmup", "get_ratio", "set_ratio"):
            ours, theirs = getattr(self, name), getattr(spec, name)
            if ours != theirs:
                notes.append(f"{name} = {ours} (original: {theirs})")
        return notes


def key_for(index: int) -> bytes:
    return str(index).encode()


def prefill_items(keys: int) -> Iterator[tuple[bytes, bytes]]:
    """Every key, with the key itself as its value, as the original pre-fill stores them."""
    for index in range(keys):
        key = key_for(index)
        yield key, key


@dataclass
class WorkerSamples:
    """What one worker measured: ns per kept call by action, and the misses among them."""

    samples: dict[str, array[int]] = field(
        default_factory=lambda: {action: array("q") for action in ACTIONS}
    )
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACTIONS, 0))
    started_ns: int = 0
    finished_ns: int = 0


def run_ops(
    cache: Any,
    workload: Workload,
    seed: int,
    on_progress: Callable[[int], None] | None = None,
    calls: array[int] | None = None,
) -> WorkerSamples:
    """Run ``workload.ops`` operations on ``cache`` and time each call on its own.

    A miss is a get that returned None, or a set or delete that returned False.
    ``calls``: where each kept call is also logged, as four integers (its action's index
    in ``ACTIONS``, its end and its duration, and the thread's CPU time over it, in ns), for
    ``--call-log``. The CPU clock is read only then, outside the timed window.
    """
    rng = random.Random(seed)  # the same stream as random.seed(seed) in the original
    randrange, choose = rng.randrange, rng.random
    get, set_, delete = cache.get, cache.set, cache.delete
    timer = time.perf_counter_ns
    # Read around each call only for a call log (a system call each, not timed); a no-op
    # builtin otherwise, which costs the loop next to nothing.
    cpu = int if calls is None else time.thread_time_ns
    keys, warmup = workload.keys, workload.warmup
    get_cut = workload.get_ratio
    set_cut = workload.get_ratio + workload.set_ratio
    result = WorkerSamples()
    kept_get, kept_set, kept_delete = (result.samples[action] for action in ACTIONS)
    miss_get = miss_set = miss_delete = 0
    log = None if calls is None else calls.extend

    result.started_ns = timer()
    for count in range(workload.ops):
        key = str(randrange(keys)).encode()
        value = str(count).encode() * randrange(1, 100)
        choice = choose()
        if choice < get_cut:
            cpu_start = cpu()
            start = timer()
            outcome = get(key)
            end = timer()
            cpu_used = cpu() - cpu_start
            if count > warmup:
                kept_get.append(end - start)
                if log is not None:
                    log((0, end, end - start, cpu_used))
                miss_get += outcome is None
        elif choice < set_cut:
            cpu_start = cpu()
            start = timer()
            outcome = set_(key, value)
            end = timer()
            cpu_used = cpu() - cpu_start
            if count > warmup:
                kept_set.append(end - start)
                if log is not None:
                    log((1, end, end - start, cpu_used))
                miss_set += outcome is False
        else:
            cpu_start = cpu()
            start = timer()
            outcome = delete(key)
            end = timer()
            cpu_used = cpu() - cpu_start
            if count > warmup:
                kept_delete.append(end - start)
                if log is not None:
                    log((2, end, end - start, cpu_used))
                miss_delete += outcome is False
        if on_progress is not None and count % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            on_progress(PROGRESS_EVERY)
    result.finished_ns = timer()
    if on_progress is not None:
        on_progress(workload.ops % PROGRESS_EVERY)
    result.misses.update(get=miss_get, set=miss_set, delete=miss_delete)
    return result
