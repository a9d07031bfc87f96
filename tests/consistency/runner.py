"""The consistency run: worker processes hammer FastCache while memcached is made to fail.

:func:`run` starts one memcached process and ``processes`` workers (see :mod:`.worker`),
all sharing one disk tier directory, as processes on one host would. While they run, the
chaos controller (here, in the parent) makes memcached fail under them at random moments,
each kind at least once, in random order:

``kill``
    SIGKILL; after a while it is started again, empty, on the same port.
``stop``
    SIGSTOP, so it hangs with its data and sockets; after a while SIGCONT. Its values from
    before the outage are still there: only the journal replay keeps them from being read.
``restart``
    stopped and at once started again, empty, on the same port.

Each outage lasts until the workers have been seen reading from the disk tier and
journaling writes (so no outage goes unexercised), plus a random extra time; then the
controller waits for the node to be marked up again, host-wide, before the next event.
The events' times are kept for the report. At the end every worker's log goes through the
checker (:mod:`.checker`).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import multiprocessing
import os
import pickle
import random
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_fastcache.client.address import parse_address
from django_fastcache.disk import NodeStates
from django_fastcache.testing.proxy import DelayProxy
from django_fastcache.testing.servers import MemcachedServer
from django_fastcache.testing.stamps import drop_tables

from .checker import GET, STALE_NOTHING, Op, Violation, check, format_violation
from .worker import (
    COLUMNS,
    DISK,
    DISK_READS,
    FALLBACK,
    FALLBACK_READS,
    JOURNALED,
    JOURNALED_WRITES,
    KINDS,
    NOTHING,
    OPS,
    SLOTS,
    SOURCES,
    WorkerConfig,
    run_worker,
)

KILL, STOP, RESTART = "kill", "stop", "restart"
EVENT_KINDS = (KILL, STOP, RESTART)
#: Faults of the machine, run when asked for (``run(kinds=...)``; see .faults):
#: ``partition``, memcached behind a proxy that holds every byte for PARTITION_HOLD
#: seconds (requests time out, their bytes still on their way), then lets them through at
#: once; ``cleaner``, memcached hung while the journal, node-state and write stamps anchor
#: files are removed, as an age-based temp cleaner would.
PARTITION, CLEANER = "partition", "cleaner"
#: Seconds a partition holds bytes: past every call's timeout and the replay's wait.
PARTITION_HOLD = 3.0

#: FastCache OPTIONS of the workers: short timeouts so outages are noticed quickly; disk
#: entries never too old to answer (the run checks consistency, not the staleness bound).
OPTIONS: dict[str, Any] = {
    "operation_timeout": 0.2,
    "connect_timeout": 0.2,
    "disk_max_staleness": 10.0**9,
}

#: Seconds to wait for something the run needs (workers ready, an outage noticed, a node
#: back); past it the run fails rather than hangs.
PATIENCE = 20.0


@dataclass
class Event:
    kind: str
    #: monotonic_ns when the failure began, when memcached was back (restarted or
    #: continued), and when the node was marked up again host-wide.
    start: int
    back: int = 0
    recovered: int = 0
    #: Whether the workers were seen reading from the disk tier during the outage (and,
    #: for kill and stop, journaling writes), before the controller ended it.
    observed: bool = False


class History:
    """Every worker's log, in columns, with what the checker and the report need."""

    def __init__(self, logs: list[dict[str, array[int]]], keys: list[str]) -> None:
        self.keys = keys
        self.columns = {name: array(code) for name, code in COLUMNS.items()}
        self.process = array("b")
        for process, log in enumerate(logs):
            for name, column in self.columns.items():
                column.extend(log[name])
            self.process.extend([process] * len(log["kind"]))
        self.rows_of_key: dict[int, array[int]] = {}
        for row, key in enumerate(self.columns["key"]):
            self.rows_of_key.setdefault(key, array("l")).append(row)
        # When reads from the disk tier, and journaled writes, began: sorted, for counting.
        starts, kinds, sources = self.columns["start"], self.columns["kind"], self.columns["source"]
        get = KINDS.index(GET)
        self.fallback_reads = sorted(
            t for t, k, s in zip(starts, kinds, sources) if k == get and s == FALLBACK
        )
        self.disk_reads = sorted(
            t for t, k, s in zip(starts, kinds, sources) if k == get and s in (FALLBACK, DISK)
        )
        self.journaled = sorted(t for t, s in zip(starts, sources) if s == JOURNALED)

    def __len__(self) -> int:
        return len(self.process)

    def op(self, row: int) -> Op:
        c = self.columns
        value = c["value"][row]
        return Op(
            self.process[row],
            KINDS[c["kind"][row]],
            self.keys[c["key"][row]],
            None if value == NOTHING else value,
            c["start"][row],
            c["end"][row],
            bool(c["ok"][row]),
            SOURCES[c["source"][row]],
        )

    def ops_of_key(self, key: int) -> list[Op]:
        return [self.op(row) for row in self.rows_of_key.get(key, ())]

    def check(self, losses: Sequence[tuple[int, float]] = ()) -> list[Violation]:
        """The checker, key by key (only one key's operations are ever objects at once)."""
        violations: list[Violation] = []
        for key in sorted(self.rows_of_key):
            violations += check(self.ops_of_key(key), losses=losses)
        violations.sort(key=lambda v: v.read.start)
        return violations

    def outages_seen(self) -> list[tuple[int, float]]:
        """The interval of every write that was journaled: its node was out then, having
        gone out no later than the write's end (and, for a write begun after it, no
        earlier than its start: that write would have found it out). Outages the runner
        did not inject (a node judged out under load) are losses as much as its own: a
        write memcached acknowledged just before may be gone with its disk copy still
        queued. (Not reads answered from disk: this process's own trouble, a busy pool
        or no descriptors, answers them so without any outage.)"""
        c = self.columns
        return [
            (start, float(end))
            for start, end, source in zip(c["start"], c["end"], c["source"])
            if source == JOURNALED
        ]

    @staticmethod
    def count(starts: list[int], since: int, until: int) -> int:
        return bisect.bisect_right(starts, until) - bisect.bisect_left(starts, since)


@dataclass
class RunResult:
    seconds: float
    processes: int
    seed: int
    history: History
    events: list[Event]
    errors: list[str]
    stats: list[dict[str, Any]]
    #: Reads that returned a value older than an acknowledged write or delete (or a value
    #: nobody wrote): what must never happen.
    violations: list[Violation] = field(default_factory=list)
    #: Increments and adds that raised OutcomeUnknownError (memcached may have made them
    #: when their node failed): allowed, and checked as writes that may have taken effect.
    unknown_outcomes: int = 0
    #: Reads of nothing where a value was due (the checker's "stale nothing"). Allowed:
    #: the disk tier is written behind memcached, so a key whose latest write had not
    #: landed on disk when memcached lost it (or went out), or whose write was in flight,
    #: misses. Counted and shown, not failed.
    misses: list[Violation] = field(default_factory=list)

    def outage_problems(self) -> list[str]:
        """A line for each outage the workers did not exercise: for a kill or a stop,
        reads answered by the disk tier and journaled writes while the node was out; for a
        restart, reads answered by the disk tier before the next event."""
        history = self.history
        problems = []
        end_of_run = max(history.columns["end"], default=0)
        for index, event in enumerate(self.events):
            following = self.events[index + 1].start if index + 1 < len(self.events) else end_of_run
            fallback_reads = history.count(history.fallback_reads, event.start, event.recovered)
            journaled = history.count(history.journaled, event.start, event.recovered)
            disk_reads = history.count(history.disk_reads, event.start, following)
            if not event.observed:
                problems.append(f"{event.kind} #{index}: the workers were not seen to notice")
            if event.kind in (KILL, STOP) and not (fallback_reads and journaled):
                problems.append(
                    f"{event.kind} #{index}: {fallback_reads} reads from the disk tier and "
                    f"{journaled} journaled writes during the outage"
                )
            if event.kind == RESTART and not disk_reads:
                problems.append(f"restart #{index}: no read was answered by the disk tier")
        return problems

    def summary(self) -> str:
        columns = self.history.columns
        kinds = {KINDS[k]: n for k, n in sorted(Counter(columns["kind"]).items())}
        sources = {SOURCES[s]: n for s, n in sorted(Counter(columns["source"]).items())}
        origin = min(columns["start"], default=0)
        lines = [
            f"{len(self.history)} operations by {self.processes} processes in "
            f"{self.seconds:.1f} s (seed {self.seed}): {kinds}; answered by {sources}",
        ]
        for event in self.events:
            lines.append(
                f"  {event.kind:<8} at {(event.start - origin) / 1e9:7.3f} s, back after "
                f"{(event.back - event.start) / 1e9:.3f} s, node up after "
                f"{(event.recovered - event.start) / 1e9:.3f} s"
                + ("" if event.observed else "  (NOT observed by the workers)")
            )
        totals: Counter[str] = Counter()
        for stats in self.stats:
            for name in ("fallbacks", "disk_hits", "refills", "journaled", "replays"):
                totals[name] += stats[name]
            totals["disk_failures"] += stats["disk_failures"]
        lines.append(f"  disk tier counters over all workers: {dict(totals)}")
        reads = sum(1 for kind in columns["kind"] if KINDS[kind] in (GET, "incr"))
        # Adds that took (get_or_set's stored values among them): each read nothing.
        adds = sum(
            1
            for kind, value in zip(columns["kind"], columns["value"])
            if KINDS[kind] == "add" and value != NOTHING
        )
        lines.append(
            f"  errors: {len(self.errors)}, stale reads: {len(self.violations)}; reads and "
            f"increments checked: {reads}, adds that took checked: {adds}; misses where a "
            f"value was due (allowed, the disk copy lagging or a write in flight): "
            f"{len(self.misses)}; increments and adds of unknown outcome (allowed): "
            f"{self.unknown_outcomes}"
        )
        return "\n".join(lines)

    def report(self, limit: int = 5) -> str:
        parts = [self.summary()]
        parts += [format_violation(v) for v in self.violations[:limit]]
        if len(self.violations) > limit:
            parts.append(f"... and {len(self.violations) - limit} more")
        if self.misses and not self.violations:
            parts.append(
                "the first miss where a value was due:\n" + format_violation(self.misses[0])
            )
        parts += self.errors[:limit]
        return "\n\n".join(parts)


def _wait_for(condition: Callable[[], bool], timeout: float = PATIENCE) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class _Chaos:
    def __init__(
        self,
        server: MemcachedServer,
        states: NodeStates,
        counters: Any,
        processes: int,
        proxy: DelayProxy | None = None,
    ) -> None:
        self.server = server
        self.states = states
        self.counters = counters
        self.processes = processes
        self.proxy = proxy

    def _node_out(self) -> bool:
        """The node's host-wide state; once its files were removed, the workers' new ones
        (the controller never makes them: a zeroed file would say "up" too early)."""
        states = self.states
        if states.replaced():
            if not os.path.exists(os.path.join(states.directory, "distrust.state")):
                return True
            self.states = states = NodeStates(states.directory, states.node_ids)
        return states.is_out(0)

    def _clean(self) -> None:
        """Remove the journal's and the node states' files, and the write stamps anchor, as
        a temp cleaner would. (The first worker to find the anchor gone makes another, and a
        table it names, retiring the one the others still stamp.)"""
        disk = os.path.dirname(self.states.directory)
        doomed = [
            os.path.join(disk, name)
            for name in os.listdir(disk)
            if name.startswith("journal") or name == "stamps.anchor"
        ]
        doomed += [
            os.path.join(self.states.directory, n) for n in os.listdir(self.states.directory)
        ]
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):  # SQLite removes its -wal itself
                os.unlink(path)

    def total(self, slot: int) -> int:
        return sum(self.counters[w * SLOTS + slot] for w in range(self.processes))

    def each_worker_did(self, slot: int, at_least: int, since: list[int]) -> bool:
        return all(
            self.counters[w * SLOTS + slot] - since[w] >= at_least for w in range(self.processes)
        )

    def snapshot(self, slot: int) -> list[int]:
        return [self.counters[w * SLOTS + slot] for w in range(self.processes)]

    def outage(self, kind: str, rng: random.Random) -> Event:
        fallbacks, disk_reads = self.total(FALLBACK_READS), self.total(DISK_READS)
        journaled = self.total(JOURNALED_WRITES)
        event = Event(kind, start=time.monotonic_ns())
        if kind == KILL:
            self.server.kill()
        elif kind in (STOP, CLEANER):
            self.server.pause()
        elif kind == PARTITION:
            assert self.proxy is not None
            self.proxy.delay = PARTITION_HOLD
        else:
            self.server.restart()
        if kind in (KILL, STOP, PARTITION, CLEANER):
            event.observed = _wait_for(
                lambda: (
                    self.total(FALLBACK_READS) >= fallbacks + 3
                    and self.total(JOURNALED_WRITES) >= journaled + 1
                )
            )
            if kind == CLEANER:
                self._clean()
            time.sleep(rng.uniform(0.0, 0.4))  # the outage goes on a random while longer
            if kind == KILL:
                self.server.restart()
            elif kind == PARTITION:
                assert self.proxy is not None
                self.proxy.delay = 0.0
            else:
                self.server.resume()
        event.back = time.monotonic_ns()
        if kind == RESTART:
            event.observed = _wait_for(
                lambda: (
                    self.total(DISK_READS) + self.total(FALLBACK_READS)
                    >= disk_reads + fallbacks + 1
                )
            )
        if not _wait_for(lambda: not self._node_out()):
            raise RuntimeError(f"the node was not brought back within {PATIENCE}s after {kind}")
        event.recovered = time.monotonic_ns()
        return event


def run(
    seconds: float,
    *,
    processes: int = 4,
    keys: int = 20,
    seed: int | None = None,
    directory: str | None = None,
    log: Callable[[str], None] = lambda line: None,
    kinds: Sequence[str] = EVENT_KINDS,
) -> RunResult:
    """Run the workers for about ``seconds`` under chaos (at least one event of each kind,
    however short ``seconds`` is) and check their logs."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="consistency-"))
            stack.callback(drop_tables, directory)  # the workers' table in /dev/shm
        disk = os.path.join(directory, "disk")
        server = stack.enter_context(MemcachedServer())
        proxy = None
        if PARTITION in kinds:  # the workers reach memcached through it
            proxy = stack.enter_context(DelayProxy(server.location, partition=True))
            # Requests held, replies not: a request that ran but whose reply came late
            # (an increment, say) has an outcome its caller never learns, which the
            # checker cannot tell from a stale read; late requests are what is tested.
            proxy.requests_only = True
        location = [server.location if proxy is None else proxy.location]
        node_id = parse_address(location[0]).node_id
        # The workers create the directory the same way (0700) on first use.
        os.makedirs(disk, mode=0o700, exist_ok=True)
        states = NodeStates(os.path.join(disk, "nodes"), (node_id,))
        context = multiprocessing.get_context("spawn")
        counters = context.Array("q", processes * SLOTS, lock=False)
        start = context.Barrier(processes + 1)
        stop = context.Event()
        workers = []
        for index in range(processes):
            config = WorkerConfig(
                index=index,
                location=location,
                directory=disk,
                options=OPTIONS,
                keys=keys,
                seed=rng.randrange(2**32),
                log_path=os.path.join(directory, f"worker-{index}.pickle"),
            )
            worker = context.Process(
                target=run_worker, args=(config, counters, start, stop), daemon=True
            )
            worker.start()
            stack.callback(_end_worker, worker)
            workers.append((worker, config))
        start.wait(timeout=60)
        began = time.monotonic()
        log(f"{processes} workers running (seed {seed})")
        chaos = _Chaos(server, states, counters, processes, proxy)
        schedule = list(kinds)
        rng.shuffle(schedule)
        events: list[Event] = []
        while schedule or time.monotonic() - began < seconds:
            kind = schedule.pop() if schedule else rng.choice(list(kinds))
            # Some traffic on a healthy node first, then a random moment.
            since = chaos.snapshot(OPS)
            if not _wait_for(lambda since=since: chaos.each_worker_did(OPS, 20, since)):
                raise RuntimeError("the workers stopped making progress")
            time.sleep(rng.uniform(0.0, 0.3))
            event = chaos.outage(kind, rng)
            events.append(event)
            log(f"{kind}: back after {(event.back - event.start) / 1e9:.2f} s")
        remaining = seconds - (time.monotonic() - began)
        if remaining > 0:
            time.sleep(remaining)
        stop.set()
        for worker, _config in workers:
            worker.join(PATIENCE)
        elapsed = time.monotonic() - began
        logs: list[dict[str, array[int]]] = []
        errors: list[str] = []
        unknown_outcomes = 0
        stats: list[dict[str, Any]] = []
        for worker, config in workers:
            if worker.exitcode != 0 or not os.path.exists(config.log_path):
                raise RuntimeError(f"worker {config.index} failed (exit code {worker.exitcode})")
            with open(config.log_path, "rb") as file:
                result = pickle.load(file)
            logs.append(result["log"])
            keys = result["keys"]
            errors += result["errors"]
            unknown_outcomes += result["unknown_outcomes"]
            stats.append(result["stats"])
    history = History(logs, keys)
    outcome = RunResult(elapsed, processes, seed, history, events, errors, stats)
    outcome.unknown_outcomes = unknown_outcomes
    log(f"checking {len(history)} operations")
    # Each outage may have lost any key whose disk copy was in flight, until it was over:
    # those the runner injected, and those the workers found (a node judged out under load).
    losses = [(event.start, float(event.recovered or math.inf)) for event in events]
    losses += history.outages_seen()
    found = history.check(losses)
    outcome.violations = [v for v in found if v.kind != STALE_NOTHING]
    outcome.misses = [v for v in found if v.kind == STALE_NOTHING]
    return outcome


def _end_worker(worker: multiprocessing.process.BaseProcess) -> None:
    if worker.is_alive():
        worker.terminate()
        worker.join(5)
