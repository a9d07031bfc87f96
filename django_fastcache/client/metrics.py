"""Counters and latency histograms of a client, per node and per operation.

The request path only ever increments an ``int`` in a list it already holds, with no lock:
each list is owned by one event loop (an asyncio pool) or one thread (a blocking
connection), so increments never race. :class:`ClientMetrics` keeps a registry of those
lists and sums them when asked for a :class:`MetricsSnapshot`. A list whose owner is gone
(a closed pool, a discarded connection, a finished thread) is folded into the node's
retired totals, so counters never go backwards.

Errors and timeouts are counted on the failure paths, under a lock: they cost nothing
while calls succeed.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import OperationTimeoutError
from ..protocol import ReplyKind
from . import forksafe

#: Operation names, by reply kind: what a request of that kind does.
OPERATIONS: tuple[str, ...] = tuple(
    {
        ReplyKind.RETRIEVAL: "get",
        ReplyKind.STORAGE: "store",
        ReplyKind.DELETE: "delete",
        ReplyKind.TOUCH: "touch",
        ReplyKind.ARITHMETIC: "incr",
        ReplyKind.OK: "admin",
        ReplyKind.VERSION: "version",
        ReplyKind.STATS: "stats",
        ReplyKind.META: "meta",
    }[kind]
    for kind in sorted(ReplyKind)
)
KINDS = len(OPERATIONS)

#: Upper bounds of the latency buckets, in seconds (the last bucket is everything above).
#: Loopback round trips sit in the first few; a timeout lands in the last ones.
LATENCY_BOUNDS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_BUCKETS = len(LATENCY_BOUNDS) + 1


def new_calls() -> list[int]:
    """A fresh per-owner list of call counts, indexed by reply kind."""
    return [0] * KINDS


class Latencies:
    """Latency histograms of one owner (a pool or a blocking connection), per reply kind."""

    __slots__ = ("buckets", "sums")

    def __init__(self) -> None:
        self.buckets = [[0] * _BUCKETS for _ in range(KINDS)]
        self.sums = [0.0] * KINDS

    def observe(self, kind: int, seconds: float) -> None:
        self.buckets[kind][bisect.bisect_left(LATENCY_BOUNDS, seconds)] += 1
        self.sums[kind] += seconds


# -- snapshots ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Histogram:
    """A latency histogram: ``counts[i]`` calls took at most ``bounds[i]`` seconds (and more
    than ``bounds[i - 1]``); ``counts[-1]`` took longer than every bound."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, calls at or under it) per bucket, ending with (inf, all calls)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append((bound, running))
        return out


@dataclass(frozen=True)
class OperationStats:
    """One operation on one node. ``calls`` counts requests (one per node for a multi-key
    command); ``errors`` counts every failed one, ``timeouts`` those among them that ran
    out of time; ``latency`` covers calls that got a reply (None when not measured)."""

    calls: int
    errors: int
    timeouts: int
    latency: Histogram | None


@dataclass(frozen=True)
class PoolStats:
    """Connections to one node. For the asyncio client, summed over event loops: ``open``
    (including those being opened), ``idle``, ``in_use``, ``opened``/``closed`` since the
    start, ``connect_failures``, ``waits`` (calls that queued for a connection),
    ``wait_timeouts`` (those that gave up) and ``wait_seconds`` (time spent queuing). For
    the blocking client, ``open`` is the number of threads holding a connection."""

    open: int = 0
    idle: int = 0
    in_use: int = 0
    opened: int = 0
    closed: int = 0
    connect_failures: int = 0
    waits: int = 0
    wait_timeouts: int = 0
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class NodeStats:
    node: str
    healthy: bool
    operations: Mapping[str, OperationStats]
    pool: PoolStats

    @property
    def calls(self) -> int:
        return sum(op.calls for op in self.operations.values())

    @property
    def errors(self) -> int:
        return sum(op.errors for op in self.operations.values())

    @property
    def timeouts(self) -> int:
        return sum(op.timeouts for op in self.operations.values())


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one client counted, per node id, at ``taken_at`` (``time.time()``).
    ``client`` is ``"async"`` or ``"blocking"``."""

    client: str
    nodes: Mapping[str, NodeStats]
    taken_at: float = field(default_factory=time.time)


# -- the registry ----------------------------------------------------------------------------
PoolReader = Callable[[], PoolStats]


class Nodes(Protocol):
    """What names the nodes: a :class:`~.cluster.Cluster` (its slots may grow)."""

    @property
    def node_ids(self) -> tuple[str, ...]: ...


class _Owner:
    """One owner's lists, and how to tell that the owner is gone."""

    __slots__ = ("alive", "calls", "latencies", "node", "pool")

    def __init__(
        self,
        node: str,
        calls: list[int],
        latencies: Latencies | None,
        alive: Callable[[], bool],
        pool: PoolReader | None,
    ) -> None:
        self.node = node
        self.calls = calls
        self.latencies = latencies
        self.alive = alive
        self.pool = pool


class _NodeTotals:
    __slots__ = ("calls", "errors", "latencies", "pool", "timeouts")

    def __init__(self) -> None:
        self.calls = [0] * KINDS
        self.errors = [0] * KINDS
        self.timeouts = [0] * KINDS
        self.latencies = Latencies()
        self.pool: dict[str, float] = {}


_POOL_TOTALS = ("opened", "closed", "connect_failures", "waits", "wait_timeouts", "wait_seconds")


class ClientMetrics:
    """The registry of one client's counters. Thread-safe; see the module docstring."""

    def __init__(self, client: str, nodes: Nodes, latency: bool = True) -> None:
        self.client = client
        self.nodes = nodes
        #: Whether owners measure latency.
        self.latency = latency
        self._lock = threading.Lock()
        self._owners: dict[int, _Owner] = {}
        # By node id, made on first use (autodiscovery adds nodes).
        self._retired: dict[str, _NodeTotals] = {}
        forksafe.register(self)

    def _forget_after_fork(self) -> object:
        """In a forked child: the parent's pools and connections are not the child's (the
        clients drop them), so their counts become totals; a lock some other thread of the
        parent held at the fork would never be released, so it is made anew."""
        self._lock = threading.Lock()
        owners, self._owners = self._owners, {}
        for owner in owners.values():
            self._fold(owner)
        return None

    def _totals(self, node: str) -> _NodeTotals:
        totals = self._retired.get(node)
        if totals is None:
            totals = self._retired[node] = _NodeTotals()
        return totals

    def attach(
        self,
        node: str,
        calls: list[int],
        latencies: Latencies | None,
        alive: Callable[[], bool],
        pool: PoolReader | None = None,
    ) -> None:
        """Count ``calls`` (and ``latencies``) for ``node`` until ``alive()`` turns False or
        :meth:`detach` is called. Called when an owner is made: never per request."""
        owner = _Owner(node, calls, latencies, alive, pool)
        with self._lock:
            self._fold_dead()
            self._owners[id(calls)] = owner

    def detach(self, calls: list[int]) -> None:
        """The owner of ``calls`` is done: keep its counts in the node's totals."""
        with self._lock:
            owner = self._owners.pop(id(calls), None)
            if owner is not None:
                self._fold(owner)

    def failed(self, node: str, kind: int, error: BaseException, uncounted: bool = False) -> None:
        """A request of ``kind`` to ``node`` failed with ``error`` (a failure path only);
        ``uncounted``: it failed before its owner counted the call (while connecting)."""
        with self._lock:
            totals = self._totals(node)
            if uncounted:
                totals.calls[kind] += 1
            totals.errors[kind] += 1
            if isinstance(error, OperationTimeoutError):
                totals.timeouts[kind] += 1

    def _fold_dead(self) -> None:
        dead = [key for key, owner in self._owners.items() if not owner.alive()]
        for key in dead:
            self._fold(self._owners.pop(key))

    def _fold(self, owner: _Owner) -> None:
        totals = self._totals(owner.node)
        for kind, count in enumerate(owner.calls):
            totals.calls[kind] += count
        if owner.latencies is not None:
            _add_latencies(totals.latencies, owner.latencies)
        if owner.pool is not None:
            stats = owner.pool()
            for name in _POOL_TOTALS:
                totals.pool[name] = totals.pool.get(name, 0) + getattr(stats, name)

    def snapshot(self, healthy: Callable[[str], bool]) -> MetricsSnapshot:
        """Every node's figures now; ``healthy(node_id)`` tells each node's health."""
        nodes: dict[str, NodeStats] = {}
        with self._lock:
            self._fold_dead()
            live = list(self._owners.values())
            for node_id in dict.fromkeys((*self.nodes.node_ids, *self._retired)):
                node = node_id
                retired = self._totals(node)
                calls = list(retired.calls)
                latencies = Latencies()
                _add_latencies(latencies, retired.latencies)
                pool: dict[str, float] = dict.fromkeys(PoolStats.__dataclass_fields__, 0)
                for name, value in retired.pool.items():
                    pool[name] += value
                for owner in live:
                    if owner.node != node:
                        continue
                    for kind, count in enumerate(owner.calls):
                        calls[kind] += count
                    if owner.latencies is not None:
                        _add_latencies(latencies, owner.latencies)
                    if owner.pool is None:
                        pool["open"] += 1  # a blocking connection: one thread's
                        pool["in_use"] += 1
                    else:
                        stats = owner.pool()
                        for name in pool:
                            pool[name] += getattr(stats, name)
                operations = {
                    name: OperationStats(
                        calls=calls[kind],
                        errors=retired.errors[kind],
                        timeouts=retired.timeouts[kind],
                        latency=Histogram(
                            LATENCY_BOUNDS,
                            tuple(latencies.buckets[kind]),
                            latencies.sums[kind],
                        )
                        if self.latency
                        else None,
                    )
                    for kind, name in enumerate(OPERATIONS)
                }
                nodes[node_id] = NodeStats(
                    node=node_id,
                    healthy=healthy(node_id),
                    operations=operations,
                    pool=_pool_stats(pool),
                )
        return MetricsSnapshot(client=self.client, nodes=nodes)


def _add_latencies(into: Latencies, other: Latencies) -> None:
    for kind in range(KINDS):
        bucket_into, bucket_other = into.buckets[kind], other.buckets[kind]
        for index, count in enumerate(bucket_other):
            bucket_into[index] += count
        into.sums[kind] += other.sums[kind]


def _pool_stats(values: dict[str, float]) -> PoolStats:
    return PoolStats(
        open=int(values["open"]),
        idle=int(values["idle"]),
        in_use=int(values["in_use"]),
        opened=int(values["opened"]),
        closed=int(values["closed"]),
        connect_failures=int(values["connect_failures"]),
        waits=int(values["waits"]),
        wait_timeouts=int(values["wait_timeouts"]),
        wait_seconds=values["wait_seconds"],
    )


__all__ = [
    "LATENCY_BOUNDS",
    "OPERATIONS",
    "ClientMetrics",
    "Histogram",
    "Latencies",
    "MetricsSnapshot",
    "NodeStats",
    "OperationStats",
    "PoolStats",
]
