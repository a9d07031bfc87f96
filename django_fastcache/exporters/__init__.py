"""Exporters of the clients' metrics to monitoring systems, each behind an optional extra.

* :mod:`.prometheus`: a ``prometheus_client`` collector (``pip install
  django-fastcache[prometheus]``).
* :mod:`.otel`: OpenTelemetry observable instruments (``django-fastcache[otel]``).

Both read :class:`~django_fastcache.client.metrics.MetricsSnapshot` objects when they are
scraped or collected, through :func:`snapshots`; nothing is counted twice and nothing runs
between scrapes.
"""

from __future__ import annotations

from .sources import Source, snapshots

__all__ = ["Source", "snapshots"]
