"""No read older than an acknowledged write or delete, while memcached fails under load.

Short by default (a few seconds: four processes, memcached killed, stopped and restarted
once each, in random order). For a soak, set ``FASTCACHE_SOAK_SECONDS`` (and optionally
``FASTCACHE_SOAK_PROCESSES``), or run ``python -m tests.consistency --seconds 600``.
A failing run prints its seed; ``--seed`` replays the same schedule of operations and
outages (the timing, and so the interleaving, still varies).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from django_fastcache.testing.servers import MemcachedServer

from .runner import EVENT_KINDS, KILL, STOP, run

SOAK_SECONDS = float(os.environ.get("FASTCACHE_SOAK_SECONDS") or 0)
PROCESSES = int(os.environ.get("FASTCACHE_SOAK_PROCESSES") or 4)
CI_SECONDS = 3.0

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.skipif(not MemcachedServer.available(), reason="memcached is not installed"),
    pytest.mark.timeout(SOAK_SECONDS + 120),
]


def test_no_stale_read_while_memcached_is_killed_stopped_and_restarted(tmp_path: Path) -> None:
    seconds = SOAK_SECONDS or CI_SECONDS
    result = run(seconds, processes=max(PROCESSES, 4), directory=str(tmp_path), log=print)
    print(result.summary())

    assert not result.violations, "stale reads found:\n\n" + result.report()
    assert not result.errors, "calls raised:\n\n" + "\n".join(result.errors[:5])

    # The run must have exercised what it claims to.
    assert len(set(result.history.process)) >= 4
    happened = Counter(event.kind for event in result.events)
    assert all(happened[kind] >= 1 for kind in EVENT_KINDS), happened
    assert result.outage_problems() == [], result.summary()
    totals = Counter[str]()
    for stats in result.stats:
        totals.update({name: stats[name] for name in ("fallbacks", "journaled", "replays")})
    assert totals["fallbacks"] > 0
    assert totals["journaled"] > 0
    assert totals["replays"] >= happened[KILL] + happened[STOP]
