"""One PNG per action: a horizontal bar group per backend (Median, P90, P99), fastest on top.

Made to be read at the width a README shows it (about 800 pixels): large type, backend
names written out on the axis rather than only in a legend, each bar labelled with its
value, and a subtitle saying what was measured, on what, and that lower is better.

When the values span more than :data:`LINEAR_SPAN` the time axis is logarithmic and starts
just below the smallest value, not at a round decade far under it: an axis starting at
1 µs makes 194 µs and 349 µs look alike. Otherwise it is linear from zero.
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
# Colour encodes the percentile (the backend is named on the axis): three hues that stay
# apart for the common colour-vision deficiencies (Okabe-Ito blue, orange, vermillion).
PERCENTILE_COLORS: tuple[str, ...] = ("#0072B2", "#E69F00", "#D55E00")
# Rows of this library are named in bold, so a reader finds them at a glance.
OWN_PREFIX = "fastcache"
# Largest max/min ratio still drawn on a linear axis.
LINEAR_SPAN = 20.0
FONT_SIZE = 13


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _label(microseconds: float) -> str:
    if microseconds >= 1000:
        return f"{microseconds / 1000:.2f} ms"
    if microseconds >= 100:
        return f"{microseconds:.0f} µs"
    return f"{microseconds:.1f} µs"


def _tick(microseconds: float) -> str:
    """Axis ticks: round numbers without a needless ".0" ("10 µs", "1 ms", "2.5 ms")."""
    if microseconds >= 1000:
        return f"{microseconds / 1000:g} ms"
    return f"{microseconds:g} µs"


def log_axis_start(smallest: float) -> float:
    """A round value (1, 2 or 5 times a power of ten) just below ``smallest``."""
    smallest = max(smallest, 1e-3)
    decade: float = 10.0 ** math.floor(math.log10(smallest))
    for step in (5, 2, 1):
        if step * decade < smallest * 0.9:
            return step * decade
    return decade / 2


def time_axis(smallest: float, largest: float) -> tuple[str, float, float]:
    """Scale and limits of the time axis, with room right of the longest bar for its label."""
    if largest / max(smallest, 1e-9) > LINEAR_SPAN:
        return "log", log_axis_start(smallest), largest * 3.5
    return "linear", 0.0, largest * 1.22


def plot_action(
    action: str,
    measured: Sequence[BackendStats],
    path: Path,
    not_measured: Sequence[str] = (),
    subtitle: str = "",
) -> Path | None:
    """Write the chart of one action; None when no backend has samples for it.

    Rows that were skipped, or have no samples of this action, are named under the
    chart: a reader must not take a missing bar for an unselected row.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never look for a display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:
        raise PlottingUnavailable("matplotlib is not installed (pip install matplotlib)") from exc

    series: list[tuple[str, list[float]]] = []
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
    # Fastest median on top: barh draws the first entry at the bottom.
    series.sort(key=lambda item: item[1][0], reverse=True)

    scale, low, high = time_axis(
        min(value for _, values in series for value in values),
        max(value for _, values in series for value in values),
    )

    bar_height = 0.26
    height = 1.6 + 0.62 * len(series) + (0.3 if subtitle else 0) + (0.3 if absent else 0)
    with plt.rc_context({"font.size": FONT_SIZE}):
        figure, axes = plt.subplots(figsize=(10.0, height), dpi=100)
        for index, ((label, _), color) in enumerate(zip(PERCENTILES, PERCENTILE_COLORS)):
            # Median on top of each group, P99 at the bottom.
            offsets = [group + bar_height * (1 - index) for group in range(len(series))]
            values = [values[index] for _, values in series]
            bars = axes.barh(offsets, values, bar_height, color=color, label=label)
            axes.bar_label(
                bars, labels=[_label(v) for v in values], padding=3, fontsize=FONT_SIZE - 3
            )
        axes.set_yticks(range(len(series)), [name for name, _ in series])
        for tick in axes.get_yticklabels():
            if tick.get_text().startswith(OWN_PREFIX):
                tick.set_fontweight("bold")
        axes.set_xscale(scale)
        axes.set_xlim(low, high)
        axes.set_xlabel("time per call (log scale)" if scale == "log" else "time per call")
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: _tick(value)))
        axes.grid(axis="x", which="major", alpha=0.3)
        axes.set_axisbelow(True)
        for side in ("top", "right"):
            axes.spines[side].set_visible(False)
        title = f"cachebench: {action}"
        axes.set_title(
            f"{title}\n{subtitle}" if subtitle else title, loc="left", fontsize=FONT_SIZE + 1
        )
        # Below the axis label: never over a bar, its value or the subtitle.
        axes.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12 * 6 / height),
            frameon=False,
            fontsize=FONT_SIZE - 2,
            ncol=3,
        )
        if absent:
            figure.text(
                0.01,
                0.01,
                f"Not measured: {', '.join(absent)} (see the run's output)",
                ha="left",
                fontsize=FONT_SIZE - 3,
                style="italic",
            )
        figure.tight_layout(rect=(0, 0.04 if absent else 0, 1, 1))
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        plt.close(figure)
    return path


def plot_all(
    measured: Sequence[BackendStats],
    directory: Path,
    not_measured: Sequence[str] = (),
    subtitle: str = "",
) -> list[Path]:
    """One PNG per action, named ``<action>.png``."""
    written = []
    for action in ACTIONS:
        path = plot_action(
            action, measured, directory / f"{action}.png", not_measured, subtitle=subtitle
        )
        if path is not None:
            written.append(path)
    return written
