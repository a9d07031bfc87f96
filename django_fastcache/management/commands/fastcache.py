"""``manage.py fastcache status [--alias NAME]``: every FastCache alias, every node, now.
``manage.py fastcache placement --add/--remove HOST:PORT``: the keys a node change moves.

Each node is reached over a connection of its own (not the process's pooled ones), asked
for its version and timed, so a wrong LOCATION shows up as the error that names the fix.
The disk tier's state (up/out per node as the host sees it, journal lengths) and this
process's counters follow; a tier no process has made yet is reported as such, not made.
The exit status is 1 when a node cannot be reached.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.management.base import BaseCommand, CommandError

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.address import Address, parse_address
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.placement import PLACEMENTS, movement
from django_fastcache.errors import ConfigurationError, FastCacheError


def probe(address: Address, client_settings: ClientSettings) -> tuple[str | None, float, str]:
    """(version, round trip in seconds, error): one fresh connection to one node."""
    # The node itself, even when the alias's addresses are autodiscovery endpoints.
    node_settings = dataclasses.replace(client_settings, autodiscovery=False)
    client = BlockingClient(Cluster([address], node_settings))
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
        placement = sub.add_parser(
            "placement", help="how many keys a change of the node list would move"
        )
        placement.add_argument("--alias", help="only this cache alias (default: every FastCache)")
        placement.add_argument(
            "--add", action="append", default=[], metavar="HOST:PORT", help="a node to add"
        )
        placement.add_argument(
            "--remove", action="append", default=[], metavar="HOST:PORT", help="a node to remove"
        )
        placement.add_argument(
            "--placement",
            choices=PLACEMENTS,
            help="the placement to compare under (default: the alias's own)",
        )
        placement.add_argument(
            "--keys", metavar="FILE", help="count these keys (one a line) instead of a sample"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "placement":
            for alias, cache in self._aliases(options.get("alias")):
                self._placement(alias, cache, options)
            return
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
        # A tier no process has made yet stays unmade: building it here would leave its
        # directory and its table in /dev/shm behind for an alias nothing uses (a LOCATION
        # or disk_directory mistyped in a settings file, say).
        made = cache.disk_tier_made()
        cluster = cache.blocking_client.cluster if made else cache.untiered_cluster()
        try:
            nodes = [cluster.addresses[slot] for slot in cluster.live_nodes()]
        except FastCacheError as exc:  # autodiscovery could not fetch the node list
            write(f"{alias}: no node list: {exc}", style_func=self.style.ERROR)
            return 1
        write(f"{alias}: {len(nodes)} memcached node(s)")
        tier = cache.tier_stats() if made else None
        tier_nodes: dict[str, Any] = {} if tier is None else tier["nodes"]
        unreachable = 0
        for address in nodes:
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
        if cache.disk_directory is None:
            write("  disk tier: off")
        elif tier is None:
            write(
                f"  disk tier: {cache.disk_directory} (not made yet: no process has used this"
                " alias; the first request makes it)"
            )
        else:
            write(f"  disk tier: {tier['directory']}")
            counters = {k: v for k, v in tier.items() if k not in ("directory", "nodes")}
            write(
                "  counters (this process): " + ", ".join(f"{k}={v}" for k, v in counters.items())
            )
        return unreachable

    def _placement(self, alias: str, cache: FastCache, options: dict[str, Any]) -> None:
        """Report what ``--add``/``--remove`` would do to the alias's key placement."""
        if not options["add"] and not options["remove"]:
            raise CommandError("say which nodes change: --add HOST:PORT and/or --remove HOST:PORT")
        cluster = cache.blocking_client.cluster
        mode = options["placement"] or cluster.settings.placement
        try:
            before = [cluster.addresses[slot] for slot in cluster.live_nodes()]
        except FastCacheError as exc:
            raise CommandError(f"{alias}: no node list: {exc}") from exc
        try:
            added = [parse_address(text) for text in options["add"]]
            removed = {parse_address(text).node_id for text in options["remove"]}
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        known = {address.node_id for address in before}
        for node_id in sorted(removed - known):
            raise CommandError(f"{node_id} is not one of {alias}'s nodes ({', '.join(known)})")
        after = [a for a in before if a.node_id not in removed]
        after += [a for a in added if a.node_id not in known]
        if not after:
            raise CommandError("that would leave no node")
        keys = None
        if options["keys"]:
            with open(options["keys"], "rb") as lines:
                keys = [line.rstrip(b"\r\n") for line in lines if line.strip()]
        moved = movement(before, after, mode, keys)
        write = self.stdout.write
        write(f"{alias}: {mode} placement, {len(before)} node(s) -> {len(after)} node(s)")
        source = "keys from " + options["keys"] if options["keys"] else "sample keys"
        write(f"  {moved.moved} of {moved.keys} {source} move: {moved.fraction:.1%}")
        for node_id, count in sorted(moved.moved_from.items()):
            write(f"    from {node_id}: {count}")
        for node_id, count in sorted(moved.moved_to.items()):
            write(f"    to   {node_id}: {count}")
