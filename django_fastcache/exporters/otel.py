"""OpenTelemetry metrics over the clients' snapshots, as observable instruments.

    from opentelemetry import metrics
    from django_fastcache.exporters.otel import instrument

    instrument(metrics.get_meter("django_fastcache"))  # every FastCache alias in CACHES

The instruments are read by the SDK's metric reader when it collects: one snapshot per
client per collection, nothing recorded on the request path. Attributes: ``cache``,
``client`` (``async``/``blocking``), ``node`` and, for requests, ``operation``. OpenTelemetry
has no observable histogram, so latency comes as two observable counters,
``fastcache.request.duration.sum`` and ``.count``, and one per bucket bound,
``fastcache.request.duration.bucket`` with an ``le`` attribute (cumulative, like
Prometheus's). Needs ``opentelemetry-api`` (``pip install django-fastcache[otel]``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

try:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "the OpenTelemetry exporter needs opentelemetry-api: pip install django-fastcache[otel]"
    ) from exc

from ..client.metrics import MetricsSnapshot
from .sources import Sources, snapshots


class _Snapshots:
    """One set of snapshots per collection: every callback of one collection reads the same
    figures (taken again once ``max_age`` seconds have passed)."""

    def __init__(self, sources: Sources, max_age: float = 0.5) -> None:
        self.sources = sources
        self.max_age = max_age
        self._taken: list[tuple[str, MetricsSnapshot]] = []
        self._at = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> list[tuple[str, MetricsSnapshot]]:
        with self._lock:
            now = time.monotonic()
            if now - self._at > self.max_age:
                self._taken = list(snapshots(self.sources))
                self._at = now
            return self._taken


Reading = Callable[[_Snapshots], Iterable[Observation]]


def instrument(meter: Meter, sources: Sources = None, prefix: str = "fastcache") -> None:
    """Create the observable instruments on ``meter``, reading ``sources`` (see
    :func:`~django_fastcache.exporters.sources.snapshots`; default: every FastCache alias)."""
    taken = _Snapshots(sources)

    def callback(read: Reading) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return list(read(taken))

        return observe

    counters: list[tuple[str, str, str, Reading]] = [
        ("requests", "{request}", "Requests sent.", _requests("calls")),
        ("request.errors", "{request}", "Requests that failed.", _requests("errors")),
        ("request.timeouts", "{request}", "Requests that ran out of time.", _requests("timeouts")),
        ("request.duration.sum", "s", "Total time to replies.", _latency_sum),
        ("request.duration.count", "{request}", "Replies timed.", _latency_count),
        ("request.duration.bucket", "{request}", "Replies timed, by bound.", _latency_buckets),
        ("pool.connections.opened", "{connection}", "Connections opened.", _pool("opened")),
        ("pool.connections.closed", "{connection}", "Connections closed.", _pool("closed")),
        ("pool.connect_failures", "{connection}", "Failed connects.", _pool("connect_failures")),
        ("pool.waits", "{request}", "Calls that queued for a connection.", _pool("waits")),
        ("pool.wait_timeouts", "{request}", "Calls that gave up waiting.", _pool("wait_timeouts")),
        ("pool.wait_seconds", "s", "Time spent waiting for a connection.", _pool("wait_seconds")),
    ]
    for name, unit, description, read in counters:
        meter.create_observable_counter(
            f"{prefix}.{name}", callbacks=[callback(read)], unit=unit, description=description
        )
    meter.create_observable_gauge(
        f"{prefix}.pool.connections",
        callbacks=[callback(_connections)],
        unit="{connection}",
        description="Connections to the node now, by state.",
    )
    meter.create_observable_gauge(
        f"{prefix}.node.healthy",
        callbacks=[callback(_healthy)],
        description="1 while the node answers, 0 after it failed.",
    )


def _node_attributes(name: str, snapshot: MetricsSnapshot, node: str) -> dict[str, Any]:
    return {"cache": name, "client": snapshot.client, "node": node}


def _requests(field: str) -> Reading:
    def read(taken: _Snapshots) -> Iterable[Observation]:
        for name, snapshot in taken.get():
            for node_id, node in snapshot.nodes.items():
                for operation, stats in node.operations.items():
                    if stats.calls or stats.errors:
                        attributes = _node_attributes(name, snapshot, node_id)
                        attributes["operation"] = operation
                        yield Observation(getattr(stats, field), attributes)

    return read


def _latencies(taken: _Snapshots) -> Iterable[tuple[dict[str, Any], Any]]:
    for name, snapshot in taken.get():
        for node_id, node in snapshot.nodes.items():
            for operation, stats in node.operations.items():
                if stats.latency is not None and stats.calls:
                    attributes = _node_attributes(name, snapshot, node_id)
                    attributes["operation"] = operation
                    yield attributes, stats.latency


def _latency_sum(taken: _Snapshots) -> Iterable[Observation]:
    for attributes, histogram in _latencies(taken):
        yield Observation(histogram.sum, attributes)


def _latency_count(taken: _Snapshots) -> Iterable[Observation]:
    for attributes, histogram in _latencies(taken):
        yield Observation(histogram.count, attributes)


def _latency_buckets(taken: _Snapshots) -> Iterable[Observation]:
    for attributes, histogram in _latencies(taken):
        for le, count in histogram.cumulative():
            yield Observation(count, {**attributes, "le": "+Inf" if le == float("inf") else le})


def _pool(field: str) -> Reading:
    def read(taken: _Snapshots) -> Iterable[Observation]:
        for name, snapshot in taken.get():
            for node_id, node in snapshot.nodes.items():
                yield Observation(
                    getattr(node.pool, field), _node_attributes(name, snapshot, node_id)
                )

    return read


def _connections(taken: _Snapshots) -> Iterable[Observation]:
    for name, snapshot in taken.get():
        for node_id, node in snapshot.nodes.items():
            attributes = _node_attributes(name, snapshot, node_id)
            for state in ("open", "idle", "in_use"):
                yield Observation(getattr(node.pool, state), {**attributes, "state": state})


def _healthy(taken: _Snapshots) -> Iterable[Observation]:
    for name, snapshot in taken.get():
        for node_id, node in snapshot.nodes.items():
            yield Observation(1 if node.healthy else 0, _node_attributes(name, snapshot, node_id))


__all__ = ["instrument"]
