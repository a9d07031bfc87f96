"""The benchmark's arithmetic and text: percentiles, units, tables, the workload, the search."""

from __future__ import annotations

import random
from array import array

import pytest

from django_fastcache.bench.backends import ROW_NAMES, Row, settings_rows
from django_fastcache.bench.environment import render_fields
from django_fastcache.bench.harness import (
    OptionError,
    RowOutcome,
    describe_row,
    select_rows,
    skip_lines,
)
from django_fastcache.bench.stats import (
    COLUMNS,
    format_ns,
    percentile,
    render_table,
    summarize,
)
from django_fastcache.bench.throughput import (
    MixResult,
    Step,
    ThroughputPlan,
    search,
)
from django_fastcache.bench.throughput import (
    render_table as render_throughput,
)
from django_fastcache.bench.workload import Workload, run_ops


class TestPercentile:
    def test_spec_formula(self) -> None:
        values = list(range(1, 101))
        assert percentile(values, 0.5) == 50
        assert percentile(values, 0.9) == 90
        assert percentile(values, 0.99) == 99
        assert percentile(values, 1.0) == 100

    def test_small_sample_follows_the_formula_to_the_last_element(self) -> None:
        # int(1 * 0.5) - 1 == -1: the formula answers the maximum, and so do we.
        assert percentile([7], 0.5) == 7
        assert percentile([1, 2, 3], 0.5) == 1

    def test_empty(self) -> None:
        assert percentile([], 0.5) is None


class TestFormat:
    @pytest.mark.parametrize(
        ("ns", "text"),
        [
            (None, "  0.000ns"),
            (0, "  0.000ns"),
            (1, "  1.000ns"),
            (999, "999.000ns"),
            (1000, "1000.000ns"),  # a unit is used only strictly above one of it
            (1001, "  1.001us"),
            (36_001, " 36.001us"),
            (8_202_000, "  8.202ms"),
            (34_726_000_000, " 34.726s "),
        ],
    )
    def test_units(self, ns: int | None, text: str) -> None:
        assert format_ns(ns) == text


def _stats() -> object:
    samples = {
        "get": array("q", [1000 * n for n in range(1, 11)]),
        "set": array("q", [5_000_000, 7_000_000]),
        "delete": array("q"),
    }
    return summarize("demo", samples, {"get": 3, "set": 0, "delete": 0})


class TestSummary:
    def test_rows_and_totals(self) -> None:
        stats = _stats()
        get = stats.action("get")
        assert (get.count, get.miss, get.median_ns, get.p90_ns, get.max_ns) == (
            10,
            3,
            5000,
            9000,
            10000,
        )
        assert get.total_ns == 55_000
        assert stats.action("delete").count == 0
        assert stats.action("delete").median_ns is None
        assert stats.total_count == 12
        assert stats.total_ns == 55_000 + 12_000_000

    def test_table_is_the_published_layout(self) -> None:
        lines = render_table(_stats()).splitlines()
        border = " ".join(["=" * 9] * 8)
        assert lines[0] == border
        assert lines[1] == "Timings for demo"
        assert lines[2] == "-" * len(border)
        assert lines[3].split() == list(COLUMNS)
        assert lines[4] == border
        assert lines[5].split() == [
            "get",
            "10",
            "3",
            "5.000us",
            "9.000us",
            "9.000us",  # P99 of ten values: int(9.9) - 1 is the ninth
            "10.000us",
            "55.000us",
        ]
        assert lines[6].split()[3:] == ["5.000ms", "5.000ms", "5.000ms", "7.000ms", "12.000ms"]
        assert lines[7].split() == ["delete", "0", "0", *["0.000ns"] * 5]
        assert lines[8].split() == ["Total", "12", "12.055ms"]
        assert lines[9] == border
        assert len(lines) == 10
        # Every cell is right-aligned under its column: the RST grid must hold.
        assert all(len(line) == len(border) for line in lines[3:])

    def test_wide_cells_widen_their_column(self) -> None:
        samples = {"get": array("q", [2_000_000_000_000]), "set": array("q"), "delete": array("q")}
        table = render_table(summarize("slow-backend-with-a-long-name", samples, {}))
        border = table.splitlines()[0]
        assert all(len(line) <= len(border) for line in table.splitlines())
        assert "2000.000s" in table


class _DictCache:
    """A cache double with Django's return values: None on a miss, delete -> bool."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None


class TestWorkload:
    def test_defaults_are_the_spec(self) -> None:
        spec = Workload()
        assert (spec.procs, spec.ops, spec.keys, spec.warmup) == (8, 100_000, 1100, 1000)
        assert spec.kept_per_worker == 98_999
        assert spec.kept_total == 791_992
        assert spec.differences_from_original() == []

    def test_differences_are_named(self) -> None:
        assert Workload(procs=2, ops=5000).differences_from_original() == [
            "procs = 2 (original: 8)",
            "ops = 5000 (original: 100000)",
        ]

    def test_too_few_ops_is_refused(self) -> None:
        with pytest.raises(ValueError, match="warmup"):
            Workload(ops=1001)

    def test_keeps_samples_after_warmup_and_counts_misses(self) -> None:
        workload = Workload(procs=1, ops=3000)
        progress: list[int] = []
        measured = run_ops(_DictCache(), workload, seed=0, on_progress=progress.append)
        kept = sum(len(values) for values in measured.samples.values())
        assert kept == workload.kept_per_worker == 1999
        assert sum(progress) == workload.ops
        assert all(value >= 0 for values in measured.samples.values() for value in values)
        # An empty cache at start: early gets miss, so some misses must be counted.
        assert measured.misses["get"] > 0
        assert measured.misses["set"] == 0  # set returns None, never False

    def test_draws_the_original_operation_stream(self) -> None:
        # The original: random.seed(i); per op randrange(keys), randrange(1, 100), random().
        workload = Workload(procs=1, ops=2000, warmup=0)
        rng = random.Random(3)
        expected = {"get": 0, "set": 0, "delete": 0}
        for count in range(workload.ops):
            rng.randrange(workload.keys)
            rng.randrange(1, 100)
            choice = rng.random()
            action = "get" if choice < 0.9 else "set" if choice < 0.99 else "delete"
            if count > workload.warmup:
                expected[action] += 1
        measured = run_ops(_DictCache(), workload, seed=3)
        assert {action: len(v) for action, v in measured.samples.items()} == expected


class TestRows:
    def test_settings_alias_by_row_name_and_overrides(self) -> None:
        caches = {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://x/2"},
        }
        rows = settings_rows(
            caches,
            {
                "memcached": "default",
                "mine": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
            },
        )
        assert set(rows) == {"redis", "memcached", "mine"}
        assert rows["redis"].config["LOCATION"] == "redis://x/2"
        assert rows["memcached"].backend.endswith("LocMemCache")
        assert all(row.source == "settings" and row.clear_in_prefill for row in rows.values())

    def test_bad_override_is_refused(self) -> None:
        with pytest.raises(ValueError, match="not defined"):
            settings_rows({}, {"memcached": "nope"})
        with pytest.raises(ValueError, match="BACKEND"):
            settings_rows({}, {"memcached": {"LOCATION": "x"}})

    def test_selection(self) -> None:
        assert select_rows(None, ["mine"]) == [*ROW_NAMES, "mine"]
        assert select_rows(["redis", "locmem", "redis"], []) == ["redis", "locmem"]
        with pytest.raises(OptionError, match="unknown backend"):
            select_rows(["memcache"], [])

    def test_one_skip_line_per_reason(self) -> None:
        outcomes = [
            RowOutcome(Row("memcached", {}), skipped="memcached is not installed"),
            RowOutcome(Row("fastcache", {}), skipped="memcached is not installed"),
            RowOutcome(Row("redis", {}), skipped="redis-server is not installed"),
            RowOutcome(Row("locmem", {})),
        ]
        assert skip_lines(outcomes) == [
            "Skipped memcached, fastcache: memcached is not installed",
            "Skipped redis: redis-server is not installed",
        ]

    def test_header_row_masks_credentials(self) -> None:
        row = Row(
            "redis",
            {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://:s3cret@h:6379/1"},
            source="settings",
            note="CACHES['redis']",
        )
        assert describe_row(row) == (
            "redis: django_redis.cache.RedisCache redis://***@h:6379/1 (settings, CACHES['redis'])"
        )
        assert describe_row(Row("x", {"BACKEND": "B"})) == "x: B (embedded)"

    def test_header_is_a_field_list(self) -> None:
        text = render_fields([("Timer", "perf_counter_ns"), ("Notes", ["a", "b"])])
        assert text.splitlines() == [":Timer: perf_counter_ns", ":Notes:", "    - a", "    - b"]


class TestThroughputSearch:
    def _measure(self, limit: int) -> tuple[list[int], object]:
        asked: list[int] = []

        def measure(rate: int) -> Step:
            asked.append(rate)
            ok = rate <= limit
            return Step(rate, float(rate), 500_000 if ok else 2_000_000, rate, True, ok)

        return asked, measure

    def test_doubles_then_bisects(self) -> None:
        asked, measure = self._measure(limit=5000)
        best, steps = search(measure, ThroughputPlan(start_rate=1000, refine_steps=3))
        # A failing rate is measured twice before it counts.
        assert asked == [1000, 2000, 4000, 8000, 8000, 6000, 6000, 5000, 5500, 5500]
        assert best is not None
        assert best.target_rate == 5000
        assert len(steps) == len(asked)

    def test_first_step_failing_reports_nothing_sustained(self) -> None:
        asked, measure = self._measure(limit=10)
        best, steps = search(measure, ThroughputPlan(start_rate=1000, retries=0))
        assert best is None
        assert asked == [1000]
        assert steps[0].p95_ns == 2_000_000

    def test_a_passing_retry_continues_the_search(self) -> None:
        outcomes = iter([True, False, True, True, False, False])

        def measure(rate: int) -> Step:
            ok = next(outcomes)
            return Step(rate, float(rate), 1, rate, True, ok)

        best, steps = search(measure, ThroughputPlan(start_rate=1000, refine_steps=0))
        assert [step.target_rate for step in steps] == [1000, 2000, 2000, 4000, 8000, 8000]
        assert best is not None
        assert best.target_rate == 4000

    def test_bounded_by_max_rate(self) -> None:
        asked, measure = self._measure(limit=10**9)
        best, _ = search(measure, ThroughputPlan(start_rate=1000, max_rate=16_000))
        assert asked == [1000, 2000, 4000, 8000, 16000]
        assert best is not None
        assert best.target_rate == 16000


def test_throughput_table() -> None:
    plan = ThroughputPlan(start_rate=1000)
    good = Step(8000, 7990.4, 120_000, 16000, True, True)
    results = [
        ("memcached", [MixResult(1.0, [good], good), MixResult(0.95, [good], good)]),
        ("slow", [MixResult(1.0, [Step(1000, 990.0, 3_000_000, 2000, True, False)], None)]),
    ]
    results[1][1].append(MixResult(0.95, [], None, error="load process 0 failed: boom"))
    lines = render_throughput(results, plan).splitlines()
    assert lines[0] == "Throughput at P95 < 1 ms"
    assert lines[4].split() == [
        "Backend",
        "100%",
        "get",
        "req/s",
        "P95",
        "95%",
        "get",
        "req/s",
        "P95",
    ]
    assert lines[6].split() == ["memcached", "7,990", "120.000us", "7,990", "120.000us"]
    assert lines[7].split() == ["slow", "<", "1000", "3.000ms", "failed"]
