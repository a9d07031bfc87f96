"""``manage.py fastcache status [--alias NAME]``: every FastCache alias, every node, now.

Each node is reached over a connection of its own (not the process's pooled ones), asked
for its version and timed, so a wrong LOCATION shows up as the error that names the fix.
The disk tier's state (up/out per node as the host sees it, journal lengths) and this
process's counters follow. The exit status is 1 when a node cannot be reached.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.management.base import BaseCommand, CommandError

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.address import Address
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.errors import FastCacheError


def probe(address: Address, client_settings: ClientSettings) -> tuple[str | None, float, str]:
    """(version, round trip in seconds, error): one fresh connection to one node."""
    client = BlockingClient(Cluster([address], client_settings))
    began = time.perf_counter()
    try:
        versions = run_blocking(client.version())
    except FastCacheError as exc:
        return None, time.perf_counter() - began, str(exc)
    finally:
        client.close_thread_connections()
    return versions.get(address.node_id), time.perf_counter() - began, ""


class Command(BaseCommand):
    help = "Show each FastCache alias's memcached nodes (reached now) and its disk tier."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        status = sub.add_parser("status", help="connect to every node; show the disk tier")
        status.add_argument("--alias", help="only this cache alias (default: every FastCache)")

    def handle(self, *args: Any, **options: Any) -> None:
        unreachable = 0
        for alias, cache in self._aliases(options.get("alias")):
            unreachable += self._report(alias, cache)
        if unreachable:
            raise CommandError(f"{unreachable} memcached node(s) cannot be reached")

    def _aliases(self, wanted: str | None) -> list[tuple[str, FastCache]]:
        names = list(settings.CACHES)
        if wanted is not None and wanted not in names:
            raise CommandError(f"no cache alias {wanted!r} in CACHES (there are {names})")
        found = []
        for name in [wanted] if wanted is not None else names:
            cache = caches[name]
            if isinstance(cache, FastCache):
                found.append((name, cache))
            elif wanted is not None:
                raise CommandError(f"the cache alias {wanted!r} is not a FastCache")
        if not found:
            raise CommandError("no FastCache alias in CACHES")
        return found

    def _report(self, alias: str, cache: FastCache) -> int:
        write = self.stdout.write
        cluster = cache.blocking_client.cluster
        write(f"{alias}: {len(cluster)} memcached node(s)")
        tier = cache.tier_stats()
        tier_nodes: dict[str, Any] = {} if tier is None else tier["nodes"]
        unreachable = 0
        for address in cluster.addresses:
            version, took, error = probe(address, cluster.settings)
            if error:
                unreachable += 1
                line = f"  {address.node_id}  UNREACHABLE  {error}"
            else:
                line = (
                    f"  {address.node_id}  ok  memcached {version}  "
                    f"round trip {took * 1000:.2f} ms (connect included)"
                )
            node = tier_nodes.get(address.node_id)
            if node is not None:
                journal = node["journal_length"]
                line += f"  tier: {node['state']}, journal {'?' if journal is None else journal}"
            write(line, style_func=self.style.ERROR if error else None)
        if tier is None:
            write("  disk tier: off")
        else:
            write(f"  disk tier: {tier['directory']}")
            counters = {k: v for k, v in tier.items() if k not in ("directory", "nodes")}
            write(
                "  counters (this process): " + ", ".join(f"{k}={v}" for k, v in counters.items())
            )
        return unreachable
