"""cachebench end to end: real worker processes, real servers, tiny workloads."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import django
import pytest
from django.core.cache.backends.locmem import LocMemCache
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fastcache.testing.servers import MemcachedServer

pytestmark = pytest.mark.integration

# Two workers x 1500 operations: counts 1001..1499 are kept, 499 per worker.
KEPT = 2 * 499


@pytest.fixture(scope="module", autouse=True)
def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("cachebench", *args, "--no-progress", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _table(output: str, name: str) -> list[list[str]]:
    lines = output.splitlines()
    start = lines.index(f"Timings for {name}")
    return [line.split() for line in lines[start + 4 : start + 8]]


def test_tiny_run_prints_tables_and_writes_results(tmp_path: Path) -> None:
    output, _ = _run(
        "--procs", "2", "--ops", "1500", "--no-plot", "--output-dir", str(tmp_path),
        "--backends", "locmem,diskcache,fastcache",
    )  # fmt: skip

    assert ":Workers: 2 processes x 1500 operations, multiprocessing 'spawn' context" in output
    assert "procs = 2 (original: 8)" in output
    for name in ("locmem", "diskcache"):
        rows = _table(output, name)
        assert [row[0] for row in rows] == ["get", "set", "delete", "Total"]
        assert sum(int(row[1]) for row in rows[:3]) == int(rows[3][1]) == KEPT

    document = json.loads((tmp_path / "results.json").read_text())
    assert [row["name"] for row in document["rows"]] == ["locmem", "diskcache", "fastcache"]
    assert document["workload"]["procs"] == 2
    locmem, diskcache, fastcache = document["rows"]
    assert locmem["status"] == diskcache["status"] == "ok"
    assert locmem["total"]["count"] == KEPT
    assert set(locmem["actions"]) == {"get", "set", "delete"}
    get = locmem["actions"]["get"]
    assert get["median_ns"] <= get["p90_ns"] <= get["p99_ns"] <= get["max_ns"]
    # locmem workers do not share a cache and start empty: they miss more than diskcache.
    assert get["miss"] > diskcache["actions"]["get"]["miss"]

    with (tmp_path / "results.csv").open() as handle:
        records = list(csv.DictReader(handle))
    measured = [row["name"] for row in document["rows"] if row["status"] == "ok"]
    assert [r["backend"] for r in records] == [name for name in measured for _ in range(4)]
    assert [r["action"] for r in records[:4]] == ["get", "set", "delete", "Total"]
    assert not list(tmp_path.glob("*.png"))

    if not MemcachedServer.available():
        assert fastcache["status"] == "skipped"
        assert "Skipped fastcache: memcached is not installed (apt-get install" in output
    elif fastcache["status"] != "ok":
        # The harness did its part (the row is skipped with its reason, the run went on);
        # the backend did not run. Reported, never passed over in silence.
        assert f"Skipped fastcache: {fastcache['reason']}" in output
        pytest.xfail(f"the fastcache row did not run: {fastcache['reason']}")
    else:
        assert _table(output, "fastcache")[3][1] == str(KEPT)


class ExplodingCache(LocMemCache):
    """Stores (so the pre-fill passes), then fails on the first get in a worker."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        raise RuntimeError("boom")


class CrashingCache(LocMemCache):
    """Takes the whole worker process down, as a crash in a C extension would."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        os._exit(3)


HERE = __name__


@override_settings(
    CACHEBENCH_BACKENDS={
        "exploding": {"BACKEND": f"{HERE}.ExplodingCache"},
        "crashing": {"BACKEND": f"{HERE}.CrashingCache"},
        "missing": {"BACKEND": "no_such_module.Cache"},
    }
)
def test_failing_rows_are_skipped_with_a_reason_and_the_run_goes_on(tmp_path: Path) -> None:
    output, _ = _run(
        "--procs", "2", "--ops", "1200", "--no-plot", "--output-dir", str(tmp_path),
        "--backends", "missing,exploding,crashing,locmem",
    )  # fmt: skip

    assert "Skipped missing: ModuleNotFoundError: No module named 'no_such_module'" in output
    assert "Skipped exploding: worker " in output
    assert "failed: RuntimeError: boom" in output
    assert "Skipped crashing: worker " in output
    assert "died with exit code 3" in output
    assert "Timings for locmem" in output
    assert "exploding: configured by the project (CACHEBENCH_BACKENDS)" in output
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(row["name"], row["status"]) for row in rows] == [
        ("missing", "skipped"),
        ("exploding", "skipped"),
        ("crashing", "skipped"),
        ("locmem", "ok"),
    ]


def test_missing_server_binaries_skip_their_rows_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    output, _ = _run(
        "--procs", "2", "--ops", "1200", "--no-plot", "--output-dir", str(tmp_path),
        "--backends", "memcached,fastcache,redis,locmem",
    )  # fmt: skip
    assert (
        "Skipped memcached, fastcache: memcached is not installed (apt-get install memcached)"
        in output
    )
    assert "Skipped redis: redis-server is not installed (apt-get install redis-server)" in output
    assert "Timings for locmem" in output


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _run("--procs", "2", "--ops", "1500", "--backends", "locmem", "--output-dir", str(tmp_path))
    for action in ("get", "set", "delete"):
        assert (tmp_path / f"{action}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_example_project_runs_cachebench_from_its_manage_py(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "EXAMPLE_CACHE": "locmem"}
    environment.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [
            sys.executable, str(root / "example_project" / "manage.py"), "cachebench",
            "--procs", "1", "--ops", "1200", "--backends", "locmem", "--no-plot",
            "--no-progress", "--output-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=120, env=environment, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "each calls django.setup() with example_project.settings" in done.stdout
    assert "Timings for locmem" in done.stdout
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["status"] == "ok"


def test_unknown_backend_is_a_command_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="unknown backend"):
        _run("--backends", "memcache", "--output-dir", str(tmp_path))


def test_too_few_ops_is_a_command_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="warmup"):
        _run("--ops", "900", "--output-dir", str(tmp_path))


def test_call_logs_hold_each_workers_kept_calls(tmp_path: Path) -> None:
    from django_fastcache.bench import calllog

    logs = tmp_path / "calls"
    out, _err = _run(
        "--procs", "2", "--ops", "1500", "--backends", "locmem", "--no-plot",
        "--output-dir", str(tmp_path), "--call-log", str(logs),
    )  # fmt: skip
    assert f"call logs: {logs}" in out
    workers = calllog.read_directory(logs)["locmem"]
    assert [log.worker for log in workers] == [0, 1]
    document = json.loads((tmp_path / "results.json").read_text())
    counts = document["rows"][0]["actions"]
    for action in ("get", "set", "delete"):
        assert sum(len(log.durations[action]) for log in workers) == counts[action]["count"]
        assert all(len(log.cpu[action]) == len(log.durations[action]) for log in workers)
    assert all(log.usage["ru_utime"] + log.usage["ru_stime"] > 0 for log in workers)


def test_call_logs_with_throughput_is_a_command_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="leave it out with --throughput"):
        _run("--throughput", "--call-log", str(tmp_path), "--output-dir", str(tmp_path))
