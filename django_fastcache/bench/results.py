"""results.json and results.csv: every number of a run, in integer nanoseconds."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from django_fastcache.bench.stats import BackendStats

CSV_FIELDS: tuple[str, ...] = (
    "backend",
    "action",
    "count",
    "miss",
    "median_ns",
    "p90_ns",
    "p99_ns",
    "max_ns",
    "total_ns",
)


def stats_as_dict(stats: BackendStats) -> dict[str, Any]:
    return {
        "actions": {row.action: row.as_dict() for row in stats.actions},
        "total": {"count": stats.total_count, "total_ns": stats.total_ns},
    }


def write_json(path: Path, document: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=False)
        handle.write("\n")
    return path


def write_csv(path: Path, measured: Sequence[BackendStats]) -> Path:
    """One line per backend and action, then a Total line per backend (times summed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for stats in measured:
            for row in stats.actions:
                record = row.as_dict()
                writer.writerow({"backend": stats.name, **record})
            writer.writerow(
                {
                    "backend": stats.name,
                    "action": "Total",
                    "count": stats.total_count,
                    "total_ns": stats.total_ns,
                }
            )
    return path


def write_rows_csv(path: Path, fields: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> Path:
    """A plain CSV of dict rows (the throughput mode's results)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
    return path
