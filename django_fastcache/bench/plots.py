"""One PNG per action: grouped bars of Median, P90 and P99, one bar per backend.

The y axis is logarithmic, in microseconds: a filebased set (milliseconds) and a locmem
get (tens of microseconds) both stay readable, and no bar is clipped or hidden. Each bar
carries its value, so the log scale never has to be read off by eye.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from django_fastcache.bench.stats import ACTIONS, BackendStats

PERCENTILES: tuple[tuple[str, str], ...] = (
    ("Median", "median_ns"),
    ("P90", "p90_ns"),
    ("P99", "p99_ns"),
)


# One colour per row in every run, so charts of different runs read alike. Related rows
# share a hue: pylibmc over TCP and over a socket, fastcache and its socket twin, the two
# rows with a disk tier.
ROW_COLORS: dict[str, str] = {
    "locmem": "#7f7f7f",
    "filebased": "#c7c7c7",
    "memcached": "#ff7f0e",
    "memcached-unix": "#ffbb78",
    "pymemcache": "#bcbd22",
    "redis": "#2ca02c",
    "diskcache": "#17becf",
    "fastcache": "#d62728",
    "fastcache-unix": "#ff9896",
    "fastcache-tiered": "#9467bd",
    "fastcache-outage": "#c5b0d5",
}
# For a project's own rows, in order of appearance.
EXTRA_COLORS: tuple[str, ...] = ("#1f77b4", "#aec7e8", "#8c564b", "#e377c2", "#f7b6d2", "#dbdb8d")


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _label(microseconds: float) -> str:
    if microseconds >= 1000:
        return f"{microseconds / 1000:.2f} ms"
    if microseconds >= 100:
        return f"{microseconds:.0f} µs"
    return f"{microseconds:.1f} µs"


def plot_action(
    action: str,
    measured: Sequence[BackendStats],
    path: Path,
    not_measured: Sequence[str] = (),
) -> Path | None:
    """Write the chart of one action; None when no backend has samples for it.

    Rows that were skipped, or have no samples of this action, are named under the
    legend: a reader must not take a missing bar for an unselected row.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never look for a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlottingUnavailable("matplotlib is not installed (pip install matplotlib)") from exc

    series = []
    absent = list(not_measured)
    for stats in measured:
        row = stats.action(action)
        values = [getattr(row, field) for _, field in PERCENTILES]
        if row.count and all(value is not None for value in values):
            series.append((stats.name, [value / 1000 for value in values]))
        else:
            absent.append(stats.name)
    if not series:
        return None

    group_width = 0.84
    bar_width = group_width / len(series)
    figure, axes = plt.subplots(figsize=(max(8.0, 1.1 * len(series) + 4), 6.0), dpi=120)
    extra = iter(EXTRA_COLORS * (1 + len(series) // len(EXTRA_COLORS)))
    for position, (name, values) in enumerate(series):
        offsets = [
            group - group_width / 2 + bar_width * (position + 0.5)
            for group in range(len(PERCENTILES))
        ]
        bars = axes.bar(
            offsets, values, bar_width, label=name, color=ROW_COLORS.get(name) or next(extra)
        )
        axes.bar_label(
            bars,
            labels=[_label(value) for value in values],
            rotation=90,
            fontsize=6,
            padding=2,
        )
    axes.set_yscale("log")
    # Bars on a log axis grow from the bottom edge: put it a decade-step below the smallest
    # value so that the shortest bar is still plainly a bar.
    smallest = min(value for _, values in series for value in values)
    bottom = 10 ** math.floor(math.log10(max(smallest, 1e-3) / 2))
    axes.set_ylim(bottom, axes.get_ylim()[1] * 4)  # room above the tallest bar for its label
    axes.set_xticks(range(len(PERCENTILES)), [label for label, _ in PERCENTILES])
    axes.set_ylabel("Time (microseconds, log scale)")
    axes.set_title(f'"{action}" Time vs Percentile')
    axes.grid(axis="y", which="major", alpha=0.3)
    axes.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.08),
        ncol=min(len(series), 4),
        frameon=False,
    )
    if absent:
        figure.text(
            0.5,
            0.01,
            f"Not measured: {', '.join(absent)} (see the run's output)",
            ha="center",
            fontsize=8,
            style="italic",
        )
    figure.tight_layout(rect=(0, 0.03 if absent else 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def plot_all(
    measured: Sequence[BackendStats], directory: Path, not_measured: Sequence[str] = ()
) -> list[Path]:
    """One PNG per action, named ``<action>.png``."""
    written = []
    for action in ACTIONS:
        path = plot_action(action, measured, directory / f"{action}.png", not_measured)
        if path is not None:
            written.append(path)
    return written
