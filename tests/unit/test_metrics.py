"""The metrics registry and node health, without servers: owners' lists summed, folded when
their owner is gone, never going backwards."""

from __future__ import annotations

from dataclasses import dataclass

from django_fastcache.client.events import NodeEvent, NodeHealth
from django_fastcache.client.metrics import (
    LATENCY_BOUNDS,
    OPERATIONS,
    ClientMetrics,
    Histogram,
    Latencies,
    PoolStats,
    new_calls,
)
from django_fastcache.errors import (
    ConnectFailedError,
    LocalResourceError,
    OperationTimeoutError,
    ServerError,
)
from django_fastcache.protocol import ReplyKind

GET = int(ReplyKind.RETRIEVAL)
STORE = int(ReplyKind.STORAGE)


@dataclass
class Nodes:
    node_ids: tuple[str, ...]


def test_operations_are_named_by_reply_kind() -> None:
    assert OPERATIONS[GET] == "get"
    assert OPERATIONS[STORE] == "store"
    assert OPERATIONS[int(ReplyKind.META)] == "meta"
    assert len(set(OPERATIONS)) == len(ReplyKind)


def test_histogram_buckets_and_cumulative_counts() -> None:
    latencies = Latencies()
    for seconds in (0.00005, 0.0001, 0.0003, 0.2, 10.0):
        latencies.observe(GET, seconds)
    histogram = Histogram(LATENCY_BOUNDS, tuple(latencies.buckets[GET]), latencies.sums[GET])
    assert histogram.count == 5
    cumulative = dict(histogram.cumulative())
    assert cumulative[0.0001] == 2  # a bound is inclusive
    assert cumulative[0.0005] == 3
    assert cumulative[0.25] == 4
    assert cumulative[2.5] == 4
    assert cumulative[float("inf")] == 5
    assert abs(histogram.sum - 10.20045) < 1e-9


def test_live_owners_are_summed_and_gone_ones_folded() -> None:
    metrics = ClientMetrics("blocking", Nodes(("a:1", "b:2")), latency=False)
    alive = {"one": True, "two": True}
    one, two = new_calls(), new_calls()
    metrics.attach("a:1", one, None, lambda: alive["one"])
    metrics.attach("a:1", two, None, lambda: alive["two"])
    one[GET] += 3
    two[GET] += 2
    two[STORE] += 1
    node = metrics.snapshot(lambda _node: True).nodes["a:1"]
    assert node.operations["get"].calls == 5
    assert node.operations["get"].latency is None
    assert node.pool.open == 2  # two threads hold a connection
    alive["one"] = False  # its thread ended
    metrics.detach(two)  # its connection was discarded
    two[GET] += 100  # after detaching, nothing more is read from it
    node = metrics.snapshot(lambda _node: True).nodes["a:1"]
    assert node.operations["get"].calls == 5
    assert node.operations["store"].calls == 1
    assert node.pool.open == 0
    assert metrics.snapshot(lambda _node: True).nodes["b:2"].calls == 0


def test_failures_count_errors_and_timeouts() -> None:
    metrics = ClientMetrics("async", Nodes(("a:1",)))
    metrics.failed("a:1", GET, OperationTimeoutError("late"))
    metrics.failed("a:1", GET, ConnectFailedError("refused"), uncounted=True)
    metrics.failed("a:1", STORE, ServerError("out of memory"))
    node = metrics.snapshot(lambda _node: False).nodes["a:1"]
    get = node.operations["get"]
    assert (get.calls, get.errors, get.timeouts) == (1, 2, 1)
    assert (node.operations["store"].errors, node.operations["store"].timeouts) == (1, 0)
    assert node.errors == 3
    assert not node.healthy


def test_pool_totals_survive_their_pool() -> None:
    metrics = ClientMetrics("async", Nodes(("a:1",)))
    stats = PoolStats(open=3, idle=2, in_use=1, opened=5, closed=2, waits=7, wait_seconds=0.5)
    alive = [True]
    calls = new_calls()
    metrics.attach("a:1", calls, Latencies(), lambda: alive[0], lambda: stats)
    assert metrics.snapshot(lambda _node: True).nodes["a:1"].pool == stats
    alive[0] = False  # its loop closed
    pool = metrics.snapshot(lambda _node: True).nodes["a:1"].pool
    assert (pool.open, pool.idle, pool.in_use) == (0, 0, 0)
    assert (pool.opened, pool.closed, pool.waits, pool.wait_seconds) == (5, 2, 7, 0.5)


def test_node_health_changes_once_per_change_and_ignores_local_trouble() -> None:
    health = NodeHealth()
    events: list[NodeEvent] = []
    unsubscribe = health.subscribe(events.append)
    health.failed("a:1", LocalResourceError("out of descriptors"))
    health.failed("a:1", ServerError("a reply"))
    assert events == []
    assert health.healthy("a:1")
    health.failed("a:1", ConnectFailedError("refused"))
    health.failed("a:1", OperationTimeoutError("late"))
    health.answered("b:2")
    assert [(e.node, e.healthy) for e in events] == [("a:1", False)]
    health.answered("a:1")
    health.answered("a:1")
    assert [(e.node, e.healthy) for e in events] == [("a:1", False), ("a:1", True)]
    unsubscribe()
    health.failed("a:1", ConnectFailedError("refused"))
    assert len(events) == 2
    assert not health.healthy("a:1")
