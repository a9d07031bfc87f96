"""What cachebench shows a person: progress lines off a terminal, the plots, where results go."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.test import override_settings

from django_fastcache.bench.plots import LINEAR_SPAN, log_axis_start, plot_action, time_axis
from django_fastcache.bench.progress import ProgressBar
from django_fastcache.bench.stats import ActionStats, BackendStats
from django_fastcache.management.commands.cachebench import output_directory


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- progress -------------------------------------------------------------------------------


def test_off_a_terminal_a_line_is_written_every_interval() -> None:
    clock, stream = FakeClock(), Pipe()
    bar = ProgressBar(stream, "filebased", 800, log_seconds=10.0, clock=clock)
    for second in range(1, 36):
        clock.now += 1
        bar.update(second * 10)
    lines = stream.getvalue().splitlines()
    # At 10, 20 and 30 seconds: one line each, no carriage returns.
    assert len(lines) == 3
    assert "\r" not in stream.getvalue()
    assert lines[0].startswith("filebased")
    assert "100/800" in lines[0]
    assert "10s elapsed" in lines[0]
    # 100 of 800 in 10 s: 70 s to go.
    assert "about 1m10s left" in lines[0]


def test_off_a_terminal_the_final_line_is_written_once() -> None:
    clock, stream = FakeClock(), Pipe()
    bar = ProgressBar(stream, "locmem", 100, clock=clock)
    bar.update(100)
    bar.finish()
    assert stream.getvalue().splitlines() == [bar._line(100, "done")]


def test_on_a_terminal_the_bar_is_redrawn_in_place() -> None:
    clock, stream = FakeClock(), Terminal()
    bar = ProgressBar(stream, "memcached", 100, clock=clock)
    clock.now += 1
    bar.update(50)
    text = stream.getvalue()
    assert text.startswith("\r")
    assert not text.endswith("\n")
    assert "50%" in text


def test_disabled_progress_writes_nothing() -> None:
    clock, stream = FakeClock(), Pipe()
    bar = ProgressBar(stream, "redis", 100, enabled=False, log_seconds=1.0, clock=clock)
    clock.now += 5
    bar.update(50)
    bar.finish()
    assert stream.getvalue() == ""


# -- plots ----------------------------------------------------------------------------------


def stats(name: str, median_us: float, p90_us: float, p99_us: float) -> BackendStats:
    row = ActionStats(
        "get",
        count=100,
        miss=0,
        median_ns=int(median_us * 1000),
        p90_ns=int(p90_us * 1000),
        p99_ns=int(p99_us * 1000),
        max_ns=int(p99_us * 2000),
        total_ns=int(median_us * 100_000),
    )
    return BackendStats(name, (row,))


@pytest.mark.parametrize(
    ("smallest", "start"),
    [(194.0, 100.0), (349.0, 200.0), (2.4, 2.0), (12.9, 10.0), (7.6, 5.0), (1.05, 0.5)],
)
def test_a_log_axis_starts_just_below_the_smallest_value(smallest: float, start: float) -> None:
    assert log_axis_start(smallest) == pytest.approx(start)
    assert log_axis_start(smallest) < smallest


def test_close_values_get_a_linear_axis_from_zero() -> None:
    # 194 against 349 µs: on a log axis from 1 µs they would look alike.
    scale, low, high = time_axis(194.0, 349.0)
    assert scale == "linear"
    assert low == 0
    assert high > 349


def test_wide_values_get_a_log_axis_starting_near_the_smallest() -> None:
    scale, low, high = time_axis(2.4, 7640.0)
    assert scale == "log"
    assert low == pytest.approx(2.0)
    assert high > 7640


def test_the_linear_span_is_the_switch() -> None:
    assert time_axis(10.0, 10.0 * LINEAR_SPAN)[0] == "linear"
    assert time_axis(10.0, 10.0 * LINEAR_SPAN * 1.01)[0] == "log"


@pytest.mark.parametrize(
    "measured",
    [
        [stats("memcached", 194, 300, 349), stats("fastcache", 220, 330, 400)],
        [stats("locmem", 2.4, 2.9, 3.8), stats("filebased", 12.9, 45.8, 7640)],
    ],
)
def test_a_plot_is_written(tmp_path: Path, measured: list[BackendStats]) -> None:
    pytest.importorskip("matplotlib")
    path = plot_action("get", measured, tmp_path / "get.png", ["redis"], subtitle="lower is better")
    assert path == tmp_path / "get.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_samples_no_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    empty = BackendStats("locmem", (ActionStats("get", 0, 0, None, None, None, None, 0),))
    assert plot_action("get", [empty], tmp_path / "get.png") is None
    assert not (tmp_path / "get.png").exists()


# -- where results go -----------------------------------------------------------------------


def test_output_directory_option_wins_and_is_absolute(tmp_path: Path) -> None:
    with override_settings(CACHEBENCH_OUTPUT_DIR=str(tmp_path / "setting")):
        assert output_directory(Path("given")) == Path.cwd() / "given"


def test_output_directory_from_the_project_setting(tmp_path: Path) -> None:
    with override_settings(CACHEBENCH_OUTPUT_DIR=str(tmp_path / "setting")):
        assert output_directory(None) == tmp_path / "setting"


def test_output_directory_default_is_under_the_working_directory() -> None:
    assert output_directory(None) == Path.cwd() / "cachebench-results"
