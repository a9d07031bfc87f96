"""Percentiles, time units and the RST tables, exactly as in DiskCache's benchmark.

Times are integer nanoseconds everywhere; they become text only here.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

ACTIONS: tuple[str, ...] = ("get", "set", "delete")
COLUMNS: tuple[str, ...] = ("Action", "Count", "Miss", "Median", "P90", "P99", "Max", "Total")
COLUMN_WIDTH = 9

_UNITS: tuple[tuple[int, str], ...] = ((10**9, "s "), (10**6, "ms"), (10**3, "us"))


def percentile(sorted_values: Sequence[int], p: float) -> int | None:
    """The original's formula, ``sorted(v)[int(len(v) * p) - 1]``; None when there are no values.

    The caller sorts once and asks for several percentiles. When ``len(v) * p < 1`` the
    index is -1 and the formula answers the maximum: the original's behaviour, kept.
    """
    if not sorted_values:
        return None
    return sorted_values[int(len(sorted_values) * p) - 1]


def format_ns(ns: int | None) -> str:
    """Nine characters: seven for the number (three decimals), two for the unit.

    A unit is used when the value is strictly above one of it (one second prints as
    ``1000.000ms``), as in the published tables. Nothing measured prints as ``0.000ns``.
    """
    if not ns:
        return f"{0:7.3f}ns"
    for scale, unit in _UNITS:
        if ns > scale:
            return f"{ns / scale:7.3f}{unit}"
    return f"{float(ns):7.3f}ns"


@dataclass(frozen=True)
class ActionStats:
    """One row of a table: the summary of one action's merged samples."""

    action: str
    count: int
    miss: int
    median_ns: int | None
    p90_ns: int | None
    p99_ns: int | None
    max_ns: int | None
    total_ns: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BackendStats:
    """Every action of one backend, plus the Total row (counts and times summed)."""

    name: str
    actions: tuple[ActionStats, ...]

    @property
    def total_count(self) -> int:
        return sum(stats.count for stats in self.actions)

    @property
    def total_ns(self) -> int:
        return sum(stats.total_ns for stats in self.actions)

    def action(self, name: str) -> ActionStats:
        for stats in self.actions:
            if stats.action == name:
                return stats
        raise KeyError(name)


def summarize_action(action: str, samples: Iterable[int], miss: int) -> ActionStats:
    ordered = sorted(samples)
    return ActionStats(
        action=action,
        count=len(ordered),
        miss=miss,
        median_ns=percentile(ordered, 0.5),
        p90_ns=percentile(ordered, 0.9),
        p99_ns=percentile(ordered, 0.99),
        max_ns=percentile(ordered, 1.0),
        total_ns=sum(ordered),
    )


def summarize(
    name: str, samples: Mapping[str, array[int] | Sequence[int]], misses: Mapping[str, int]
) -> BackendStats:
    """Summarize merged samples (ns per call, by action) and miss counts."""
    return BackendStats(
        name=name,
        actions=tuple(
            summarize_action(action, samples.get(action, ()), misses.get(action, 0))
            for action in ACTIONS
        ),
    )


def _table_rows(stats: BackendStats) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        (
            row.action,
            str(row.count),
            str(row.miss),
            format_ns(row.median_ns),
            format_ns(row.p90_ns),
            format_ns(row.p99_ns),
            format_ns(row.max_ns),
            format_ns(row.total_ns),
        )
        for row in stats.actions
    ]
    rows.append(("Total", str(stats.total_count), "", "", "", "", "", format_ns(stats.total_ns)))
    return rows


def render_table(stats: BackendStats) -> str:
    """The RST simple table of one backend, titled ``Timings for <name>``.

    The title is a row spanning every column (the dashed line under it says so); the
    column names and the title together form the header. Columns are nine characters
    wide as in the published tables, wider only when a cell would not fit, so that the
    result always stays a valid RST table.
    """
    rows = _table_rows(stats)
    widths = [
        max(COLUMN_WIDTH, len(heading), *(len(row[i]) for row in rows))
        for i, heading in enumerate(COLUMNS)
    ]
    border = " ".join("=" * width for width in widths)
    title = f"Timings for {stats.name}"
    if len(title) > len(border):
        # A spanning row must fit between the borders: widen the last column.
        widths[-1] += len(title) - len(border)
        border = " ".join("=" * width for width in widths)

    def line(cells: Sequence[str]) -> str:
        return " ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))

    lines = [border, title, "-" * len(border), line(COLUMNS), border]
    lines += [line(row) for row in rows]
    lines.append(border)
    return "\n".join(lines)
