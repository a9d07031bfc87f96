"""No read older than an acknowledged write or delete, under faults of the machine: a
partition that leaves timed-out requests on their way, and a temp cleaner removing the
journal's, the node states' and the write stamps anchor's files in the middle of an outage
(see docs/disk-tier.md).

Short by default, like test_consistency; ``FASTCACHE_SOAK_SECONDS`` makes it a soak.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from django_fastcache.testing.servers import MemcachedServer

from .runner import CLEANER, PARTITION, STOP, run
from .test_consistency import CI_SECONDS, PROCESSES, SOAK_SECONDS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.skipif(not MemcachedServer.available(), reason="memcached is not installed"),
    pytest.mark.timeout(SOAK_SECONDS + 180),
]

KINDS = (PARTITION, CLEANER, STOP)


def test_no_stale_read_through_partitions_and_removed_files(tmp_path: Path) -> None:
    seconds = SOAK_SECONDS or CI_SECONDS
    result = run(
        seconds, processes=max(PROCESSES, 4), directory=str(tmp_path), log=print, kinds=KINDS
    )
    print(result.summary())

    assert not result.violations, "stale reads found:\n\n" + result.report()
    assert not result.errors, "calls raised:\n\n" + "\n".join(result.errors[:5])
    happened = Counter(event.kind for event in result.events)
    assert all(happened[kind] >= 1 for kind in KINDS), happened
    assert result.outage_problems() == [], result.summary()
    totals = Counter[str]()
    for stats in result.stats:
        totals.update({name: stats[name] for name in ("journaled", "replays")})
    assert totals["journaled"] > 0
    assert totals["replays"] >= len(result.events)
