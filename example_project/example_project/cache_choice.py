"""Which cache the example site runs on, and the line that says so at start-up.

``EXAMPLE_CACHE`` names a backend outright. Without it the site runs on FastCache as
configured by default (``fastcache-tiered``: memcached with its disk tier) when memcached
answers at ``EXAMPLE_MEMCACHED``, and on locmem otherwise, so that it starts on a machine
without memcached too; the start-up line then says how to get FastCache.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

# Loopback answers in well under a millisecond; a remote host that drops packets must not
# hold up start-up for long.
PROBE_TIMEOUT = 0.3


@dataclass(frozen=True)
class Choice:
    name: str
    reason: str


def memcached_reachable(address: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when a memcached at ``host:port`` or ``unix:/path`` answers ``version``."""
    try:
        if address.startswith("unix:"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(address.removeprefix("unix:"))
        else:
            host, _, port = address.rpartition(":")
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        with sock:
            sock.sendall(b"version\r\n")
            return sock.recv(64).startswith(b"VERSION ")
    except (OSError, ValueError):
        return False


def choose(environ: Mapping[str, str], memcached: str) -> Choice:
    named = environ.get("EXAMPLE_CACHE")
    if named:
        return Choice(named, "EXAMPLE_CACHE")
    if memcached_reachable(memcached):
        return Choice("fastcache-tiered", f"memcached answers at {memcached}")
    return Choice(
        "locmem",
        f"no memcached at {memcached}; start one (memcached -l 127.0.0.1 -p 11211) or set "
        "EXAMPLE_MEMCACHED, then restart to run on FastCache",
    )


def describe(choice: Choice, cache: Mapping[str, object]) -> str:
    """``Cache: fastcache-tiered (django_fastcache...FastCache at ...); memcached answers...``"""
    where = f" at {cache['LOCATION']}" if cache.get("LOCATION") else ""
    return f"Cache: {choice.name} ({cache['BACKEND']}{where}); {choice.reason}"


def announce(choice: Choice, cache: Mapping[str, object]) -> None:
    print(describe(choice, cache), file=sys.stderr, flush=True)
