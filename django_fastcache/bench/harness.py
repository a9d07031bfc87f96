"""The whole latency run: resolve the rows, print the header, measure each row, write files.

``manage.py cachebench`` and ``python -m django_fastcache.bench`` only turn their
arguments into :class:`BenchOptions` and call :func:`run`.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django_fastcache import __version__
from django_fastcache.bench import environment, runner
from django_fastcache.bench.backends import (
    PUBLISHED_ROWS,
    EmbeddedServers,
    Row,
    RowUnavailable,
    default_row,
    row_names,
    settings_rows,
)
from django_fastcache.bench.progress import ProgressBar, Stream
from django_fastcache.bench.results import stats_as_dict, write_csv, write_json
from django_fastcache.bench.stats import BackendStats, render_table
from django_fastcache.bench.workload import Workload

DEFAULT_OUTPUT_DIR = Path("cachebench-results")
QUICK_PROCS = 2
QUICK_OPS = 5000


class OptionError(ValueError):
    """A bad option; the management command turns it into a CommandError."""


@dataclass
class BenchOptions:
    workload: Workload = field(default_factory=Workload)
    backends: Sequence[str] | None = None  # None: every row
    output_dir: Path = DEFAULT_OUTPUT_DIR
    plot: bool = True
    progress: bool = True
    start_method: str = "spawn"
    timeout: float | None = 3600.0  # per row, for the workers; None: no limit
    use_settings: bool = True
    quick: bool = False
    #: A directory for each worker's log of calls (``calllog``); None: no logs.
    call_log: Path | None = None


@dataclass
class RowOutcome:
    row: Row
    stats: BackendStats | None = None
    wall_ns: int = 0
    skipped: str | None = None


@dataclass
class Report:
    header: list[tuple[str, str | list[str]]]
    outcomes: list[RowOutcome]
    files: list[Path]

    @property
    def measured(self) -> list[BackendStats]:
        return [outcome.stats for outcome in self.outcomes if outcome.stats is not None]

    @property
    def skipped(self) -> dict[str, str]:
        return {o.row.name: o.skipped for o in self.outcomes if o.skipped is not None}


@dataclass
class ProjectSettings:
    """What the harness reads from Django's settings (kept apart so tests can pass their own)."""

    settings_module: str | None
    caches: dict[str, dict[str, Any]]
    overrides: dict[str, Any] | None

    @classmethod
    def from_django(cls, use_settings: bool = True) -> ProjectSettings:
        from django.conf import settings

        module = getattr(settings, "SETTINGS_MODULE", None) if settings.configured else None
        if not use_settings:
            return cls(module, {}, None)
        return cls(
            module,
            dict(getattr(settings, "CACHES", {})),
            getattr(settings, "CACHEBENCH_BACKENDS", None),
        )


def redact(location: Any) -> str:
    """A LOCATION fit to print: credentials in URLs are masked."""
    text = ", ".join(location) if isinstance(location, (list, tuple)) else str(location)
    return re.sub(r"//[^/@\s]*@", "//***@", text)


def describe_row(row: Row) -> str:
    """``name: BACKEND LOCATION (source, note)`` for the header."""
    location = redact(row.config.get("LOCATION", ""))
    where = f" {location}" if location else ""
    origin = f"{row.source}, {row.note}" if row.note else row.source
    return f"{row.name}: {row.backend}{where} ({origin})"


def select_rows(requested: Sequence[str] | None, extra: Sequence[str]) -> list[str]:
    known = row_names(extra)
    if not requested:
        return known
    unknown = [name for name in requested if name not in known]
    if unknown:
        raise OptionError(
            f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(known)}"
        )
    return list(dict.fromkeys(requested))


def resolve_rows(
    names: Sequence[str], project: dict[str, Row], servers: EmbeddedServers
) -> list[RowOutcome]:
    outcomes = []
    for name in names:
        if name in project:
            outcomes.append(RowOutcome(project[name]))
            continue
        try:
            outcomes.append(RowOutcome(default_row(name, servers)))
        except RowUnavailable as exc:
            outcomes.append(RowOutcome(Row(name, {}), skipped=str(exc)))
    return outcomes


def skip_lines(outcomes: Sequence[RowOutcome]) -> list[str]:
    """One line per reason: a missing memcached is said once for all of its rows."""
    by_reason: dict[str, list[str]] = {}
    for outcome in outcomes:
        if outcome.skipped is not None:
            by_reason.setdefault(outcome.skipped, []).append(outcome.row.name)
    return [f"Skipped {', '.join(names)}: {reason}" for reason, names in by_reason.items()]


def differences(options: BenchOptions, outcomes: Sequence[RowOutcome]) -> list[str]:
    """Every way this run differs from DiskCache's DjangoCache benchmark, the method followed."""
    notes = [
        "timer: time.perf_counter_ns() (the original used time.time())",
        "start: workers build their cache, then wait at a multiprocessing.Barrier and start "
        "together (the original slept 0.01 s, then built its cache)",
        f"workers: started with the multiprocessing '{options.start_method}' context and "
        "call django.setup() (the original used multiprocessing's default start method)",
        "misses: counted per action; their timings are not kept apart (the tables never "
        "showed them)",
    ]
    notes += [f"workload: {note}" for note in options.workload.differences_from_original()]
    if options.quick:
        notes.append("--quick: a short run, not comparable with the published figures")
    extra = [o.row.name for o in outcomes if o.row.name not in PUBLISHED_ROWS]
    if extra:
        notes.append(f"rows not in DiskCache's published table: {', '.join(extra)}")
    for outcome in outcomes:
        row = outcome.row
        if row.source == "settings":
            notes.append(
                f"{row.name}: configured by the project ({row.note}); emptied with "
                "cache.clear() in the pre-fill process"
            )
    embedded = [o.row.name for o in outcomes if o.row.source == "embedded" and o.row.flush]
    if embedded:
        notes.append(
            "servers: memcached and redis started by cachebench on loopback "
            "(memcached -m 64 -U 0 -t 2; redis without persistence, database 1)"
        )
    return notes


def build_header(
    options: BenchOptions, project: ProjectSettings, outcomes: Sequence[RowOutcome]
) -> list[tuple[str, str | list[str]]]:
    workload = options.workload
    header: list[tuple[str, str | list[str]]] = [
        ("Date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("cachebench", f"django-fastcache {__version__}"),
        *environment.machine_fields(),
        (
            "Workers",
            f"{workload.procs} processes x {workload.ops} operations, multiprocessing "
            f"'{options.start_method}' context, released together by a "
            "multiprocessing.Barrier; each calls django.setup() with "
            f"{project.settings_module or 'minimal settings'} and builds its cache from the "
            "row's CACHES entry",
        ),
        (
            "Workload",
            f"key str(random.randrange({workload.keys})).encode(), value "
            "str(count).encode() * random.randrange(1, 100), "
            f"{workload.get_ratio:.0%} get / {workload.set_ratio:.0%} set / "
            f"{1 - workload.get_ratio - workload.set_ratio:.0%} delete, "
            f"random.seed(worker index); samples with count <= {workload.warmup} discarded "
            f"({workload.kept_per_worker} kept per worker, {workload.kept_total} in all)",
        ),
        (
            "Pre-fill",
            f"a separate process sets all {workload.keys} keys (value = key) and closes the "
            "cache, after the storage is emptied (directories removed, servers flushed)",
        ),
        (
            "Statistics",
            "per action over all workers, percentile(p) = sorted(v)[int(len(v) * p) - 1]; "
            "Total = sum of the samples; a miss is a get returning None or a set or delete "
            "returning False",
        ),
        ("Rows", [describe_row(o.row) for o in outcomes if o.skipped is None]),
        ("Differences from DiskCache's benchmark", differences(options, outcomes)),
    ]
    return header


def measure_row(
    outcome: RowOutcome,
    options: BenchOptions,
    project: ProjectSettings,
    context: Any,
    err: Stream,
) -> None:
    """Measure one row in place; a failure of any kind becomes ``outcome.skipped``."""
    from django.utils.module_loading import import_string

    row = outcome.row
    workload = options.workload
    bar = ProgressBar(err, row.name, workload.procs * workload.ops, enabled=options.progress)
    try:
        import_string(row.backend)  # fail here, in one line, rather than in every worker
        row.empty_storage()
        runner.prefill(
            context, row.config, project.settings_module, workload.keys, row.clear_in_prefill
        )
        measurement = runner.run_workers(
            context,
            row.config,
            project.settings_module,
            workload,
            row.name,
            on_progress=bar.update,
            timeout=options.timeout,
            call_log=None if options.call_log is None else str(options.call_log),
        )
    except Exception as exc:
        outcome.skipped = str(exc) if isinstance(exc, runner.RowFailed) else runner.describe(exc)
        bar.finish("failed")
        return
    outcome.stats = measurement.stats
    outcome.wall_ns = measurement.wall_ns
    bar.finish("done")


def report_document(report: Report, options: BenchOptions) -> dict[str, Any]:
    rows = []
    for outcome in report.outcomes:
        entry: dict[str, Any] = {
            "name": outcome.row.name,
            "backend": outcome.row.backend,
            "location": redact(outcome.row.config.get("LOCATION", "")),
            "source": outcome.row.source,
            "status": "skipped" if outcome.skipped is not None else "ok",
        }
        if outcome.skipped is not None:
            entry["reason"] = outcome.skipped
        if outcome.stats is not None:
            entry["wall_ns"] = outcome.wall_ns
            seconds = outcome.wall_ns / 1e9
            entry["ops_per_second"] = (
                round(options.workload.procs * options.workload.ops / seconds, 1)
                if seconds
                else None
            )
            entry.update(stats_as_dict(outcome.stats))
        rows.append(entry)
    return {
        "tool": "cachebench",
        "header": {name: value for name, value in report.header},
        "workload": asdict(options.workload),
        "start_method": options.start_method,
        "rows": rows,
    }


def plot_subtitle(options: BenchOptions) -> str:
    """What a chart shows beyond its bars: the machine, the load, how to read it."""
    workload = options.workload
    cpus = os.cpu_count() or 1
    return (
        f"{environment.cpu_model()}, {cpus} CPU{'s' if cpus > 1 else ''}; "
        f"{workload.procs} processes x {workload.ops:,} ops; lower is better"
    )


def run(
    options: BenchOptions,
    out: Stream,
    err: Stream,
    project: ProjectSettings | None = None,
    on_row: Callable[[RowOutcome], None] | None = None,
) -> Report:
    """Run every selected row and write the tables, results.json, results.csv and plots."""
    project = project or ProjectSettings.from_django(options.use_settings)
    try:
        configured = settings_rows(project.caches, project.overrides)
    except ValueError as exc:
        raise OptionError(str(exc)) from exc
    names = select_rows(options.backends, list(configured))
    context = runner.start_context(options.start_method)

    with EmbeddedServers() as servers:
        outcomes = resolve_rows(names, configured, servers)
        header = build_header(options, project, outcomes)
        out.write(environment.render_fields(header) + "\n\n")
        for line in skip_lines(outcomes):
            out.write(line + "\n\n")
        out.flush()
        err.write(f"Results will be written to {options.output_dir}\n")
        err.flush()
        for outcome in outcomes:
            if outcome.skipped is not None:
                continue
            measure_row(outcome, options, project, context, err)
            if outcome.stats is not None:
                out.write(render_table(outcome.stats) + "\n\n")
            else:
                out.write(f"Skipped {outcome.row.name}: {outcome.skipped}\n\n")
            out.flush()
            if on_row is not None:
                on_row(outcome)

    report = Report(header=header, outcomes=outcomes, files=[])
    directory = options.output_dir
    report.files.append(write_json(directory / "results.json", report_document(report, options)))
    report.files.append(write_csv(directory / "results.csv", report.measured))
    if options.plot:
        from django_fastcache.bench.plots import PlottingUnavailable, plot_all

        try:
            report.files += plot_all(
                report.measured, directory, list(report.skipped), subtitle=plot_subtitle(options)
            )
        except PlottingUnavailable as exc:
            out.write(f"No plots: {exc}\n")
    written = ", ".join(path.name for path in report.files)
    out.write(f"Results in {directory}: {written}\n")
    return report
