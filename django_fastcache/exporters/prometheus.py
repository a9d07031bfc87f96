"""A ``prometheus_client`` collector over the clients' metrics snapshots.

    from prometheus_client import REGISTRY
    from django_fastcache.exporters.prometheus import FastCacheCollector

    REGISTRY.register(FastCacheCollector())  # every FastCache alias in CACHES

Each scrape takes one snapshot per client and turns it into metric families labelled by
``cache`` (the alias, or the name given), ``client`` (``async`` or ``blocking``),
``node`` and, for requests, ``operation``. Needs ``prometheus_client``
(``pip install django-fastcache[prometheus]``).
"""

from __future__ import annotations

from collections.abc import Iterator

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "the Prometheus exporter needs prometheus_client: pip install django-fastcache[prometheus]"
    ) from exc

from .sources import Sources, snapshots

_REQUEST = ["cache", "client", "node", "operation"]
_NODE = ["cache", "client", "node"]


class FastCacheCollector(Collector):
    """Reads ``sources`` (see :func:`~django_fastcache.exporters.sources.snapshots`) at
    every scrape; by default every FastCache alias in ``settings.CACHES``."""

    def __init__(self, sources: Sources = None, namespace: str = "fastcache") -> None:
        self.sources = sources
        self.namespace = namespace

    def describe(self) -> list[Metric]:
        # No I/O and no Django at registration: families are known only when collected.
        return []

    def collect(self) -> Iterator[Metric]:
        ns = self.namespace
        requests = CounterMetricFamily(f"{ns}_requests", "Requests sent.", labels=_REQUEST)
        errors = CounterMetricFamily(
            f"{ns}_request_errors", "Requests that failed, timeouts included.", labels=_REQUEST
        )
        timeouts = CounterMetricFamily(
            f"{ns}_request_timeouts", "Requests that ran out of time.", labels=_REQUEST
        )
        latency = HistogramMetricFamily(
            f"{ns}_request_duration_seconds",
            "Time from sending a request to its reply.",
            labels=_REQUEST,
        )
        healthy = GaugeMetricFamily(
            f"{ns}_node_healthy", "1 while the node answers, 0 after it failed.", labels=_NODE
        )
        connections = GaugeMetricFamily(
            f"{ns}_pool_connections",
            "Connections to the node now, by state (async: summed over event loops;"
            " blocking: one per thread).",
            labels=[*_NODE, "state"],
        )
        totals = {
            "opened": CounterMetricFamily(
                f"{ns}_pool_connections_opened", "Connections opened.", labels=_NODE
            ),
            "closed": CounterMetricFamily(
                f"{ns}_pool_connections_closed", "Connections closed.", labels=_NODE
            ),
            "connect_failures": CounterMetricFamily(
                f"{ns}_pool_connect_failures", "Connections that failed to open.", labels=_NODE
            ),
            "waits": CounterMetricFamily(
                f"{ns}_pool_waits", "Calls that queued for a connection.", labels=_NODE
            ),
            "wait_timeouts": CounterMetricFamily(
                f"{ns}_pool_wait_timeouts",
                "Calls that gave up waiting for a connection.",
                labels=_NODE,
            ),
            "wait_seconds": CounterMetricFamily(
                f"{ns}_pool_wait_seconds", "Seconds spent waiting for a connection.", labels=_NODE
            ),
        }
        for name, snapshot in snapshots(self.sources):
            for node_id, node in snapshot.nodes.items():
                labels = [name, snapshot.client, node_id]
                healthy.add_metric(labels, 1.0 if node.healthy else 0.0)
                pool = node.pool
                for state, value in (("open", pool.open), ("idle", pool.idle)):
                    connections.add_metric([*labels, state], value)
                connections.add_metric([*labels, "in_use"], pool.in_use)
                for key, family in totals.items():
                    family.add_metric(labels, getattr(pool, key))
                for operation, stats in node.operations.items():
                    if not (stats.calls or stats.errors):
                        continue  # never used: no series
                    op_labels = [*labels, operation]
                    requests.add_metric(op_labels, stats.calls)
                    errors.add_metric(op_labels, stats.errors)
                    timeouts.add_metric(op_labels, stats.timeouts)
                    histogram = stats.latency
                    if histogram is not None:
                        latency.add_metric(
                            op_labels,
                            [(_bound(le), count) for le, count in histogram.cumulative()],
                            histogram.sum,
                        )
        yield requests
        yield errors
        yield timeouts
        yield latency
        yield healthy
        yield connections
        yield from totals.values()


def _bound(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(le)


__all__ = ["FastCacheCollector"]
