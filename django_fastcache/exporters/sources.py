"""Where exporters read metrics from: clients, backends, or every FastCache alias."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..client.metrics import MetricsSnapshot

#: Anything with a ``metrics()`` method that returns one snapshot (``Client``,
#: ``BlockingClient``) or several by client kind (the ``FastCache`` backend).
Source = Any
#: The sources by name (the ``cache`` label), or a function giving them at scrape time.
Sources = Mapping[str, Source] | Callable[[], Mapping[str, Source]] | None


def django_caches() -> dict[str, Source]:
    """Every FastCache alias of ``settings.CACHES``, by alias."""
    from django.conf import settings
    from django.core.cache import caches

    from ..backends import FastCache

    found: dict[str, Source] = {}
    for alias in settings.CACHES:
        cache = caches[alias]
        if isinstance(cache, FastCache):
            found[alias] = cache
    return found


def snapshots(sources: Sources = None) -> Iterator[tuple[str, MetricsSnapshot]]:
    """(name, snapshot) for every client of every source; ``None``: every FastCache alias."""
    if sources is None:
        resolved: Mapping[str, Source] = django_caches()
    elif callable(sources):
        resolved = sources()
    else:
        resolved = sources
    for name, source in resolved.items():
        taken = source.metrics()
        if isinstance(taken, MetricsSnapshot):
            yield name, taken
        else:
            for snapshot in taken.values():
                yield name, snapshot


__all__ = ["Source", "Sources", "django_caches", "snapshots"]
