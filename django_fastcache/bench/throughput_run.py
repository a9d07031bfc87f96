"""The ``--throughput`` run: every selected row, both read ratios, one table and two files.

The method is in :mod:`django_fastcache.bench.throughput`; this module runs it over the
rows, reports progress, and writes throughput.json and throughput.csv.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django_fastcache.bench import environment, runner, throughput
from django_fastcache.bench.backends import EmbeddedServers, Row
from django_fastcache.bench.harness import (
    BenchOptions,
    ProjectSettings,
    build_header,
    resolve_rows,
    select_rows,
    skip_lines,
)
from django_fastcache.bench.progress import Stream
from django_fastcache.bench.results import write_json, write_rows_csv
from django_fastcache.bench.stats import format_ns
from django_fastcache.bench.throughput import MixResult, Step, ThroughputPlan

# The latency run's header fields that still apply here.
HEADER_FIELDS = ("Date", "cachebench", "Machine", "Python", "Libraries", "Servers", "Timer", "Rows")
CSV_FIELDS = (
    "name",
    "status",
    "read_ratio",
    "best_target_rate",
    "best_achieved_rate",
    "best_p95_ns",
    "reason",
)


def method_field(plan: ThroughputPlan) -> tuple[str, str]:
    return (
        "Method",
        f"open loop: {plan.procs} load processes share the target rate, one call in flight "
        "per process; a request's time is its call time plus the wait behind earlier "
        "requests, replayed on the schedule from the measured call times; "
        f"steps of {plan.step_seconds:g} s from {plan.start_rate} req/s, doubling until "
        f"P{plan.quantile * 100:.0f} >= {plan.bound_ns / 1e6:g} ms or the load falls behind "
        f"schedule (> {throughput.ON_TIME:.2f} x the step), a failing step measured "
        f"{plan.retries + 1} times; then {plan.refine_steps} bisection steps; at most "
        f"{plan.max_rate} req/s; reported: the achieved rate of the best passing step",
    )


def verdict(step: Step) -> str:
    if step.passed:
        return "ok"
    return "behind schedule" if not step.on_time else "over the bound"


def mix_record(name: str, mix: MixResult) -> dict[str, Any]:
    best = mix.best
    return {
        "name": name,
        "status": "failed" if mix.error else "ok",
        "reason": mix.error or "",
        "read_ratio": mix.read_ratio,
        "best_target_rate": best.target_rate if best else None,
        "best_achieved_rate": round(best.achieved_rate, 1) if best else None,
        "best_p95_ns": best.p95_ns if best else None,
        "steps": [asdict(step) for step in mix.steps],
    }


def measure_row(
    row: Row,
    plan: ThroughputPlan,
    options: BenchOptions,
    settings_module: str | None,
    context: runner.WorkerContext,
    err: Stream,
) -> list[MixResult]:
    """Empty and pre-fill the row once, then measure each read ratio; raises RowFailed."""
    from django.utils.module_loading import import_string

    try:
        import_string(row.backend)
        row.empty_storage()
    except Exception as exc:
        raise runner.RowFailed(runner.describe(exc)) from exc
    runner.prefill(context, row.config, settings_module, plan.keys, False)
    mixes = []
    for ratio in plan.read_ratios:

        def report(step: Step, ratio: float = ratio) -> None:
            if options.progress:
                err.write(
                    f"{row.name:<18} {ratio:4.0%} get {step.target_rate:>9} req/s  "
                    f"P95 {format_ns(step.p95_ns).strip():>9}  {verdict(step)}\n"
                )
                err.flush()

        mixes.append(
            throughput.measure_mix(
                context, row.config, settings_module, plan, ratio, row.process_local, report
            )
        )
    return mixes


def run_throughput(
    options: BenchOptions, plan: ThroughputPlan, out: Stream, err: Stream
) -> dict[str, Any]:
    """Measure every selected embedded row; print the table; write the two files."""
    # Loopback only: a project's own caches, possibly remote and in use, are not loaded.
    project = ProjectSettings(ProjectSettings.from_django(False).settings_module, {}, None)
    names = select_rows(options.backends, [])
    context = runner.start_context(options.start_method)
    measured: list[tuple[str, list[MixResult]]] = []
    records: list[dict[str, Any]] = []
    with EmbeddedServers() as servers:
        outcomes = resolve_rows(names, {}, servers)
        header = [
            *(f for f in build_header(options, project, outcomes) if f[0] in HEADER_FIELDS),
            method_field(plan),
        ]
        out.write(environment.render_fields(header) + "\n\n")
        for line in skip_lines(outcomes):
            out.write(line + "\n\n")
        out.flush()
        err.write(f"Results will be written to {options.output_dir}\n")
        err.flush()
        for outcome in outcomes:
            if outcome.skipped is not None:
                continue
            row = outcome.row
            try:
                mixes = measure_row(row, plan, options, project.settings_module, context, err)
            except runner.RowFailed as exc:
                out.write(f"Skipped {row.name}: {exc}\n\n")
                records.append({"name": row.name, "status": "skipped", "reason": str(exc)})
                continue
            for mix in mixes:
                if mix.error is not None:
                    out.write(f"Failed {row.name} ({mix.label}): {mix.error}\n\n")
                records.append(mix_record(row.name, mix))
            measured.append((row.name, mixes))
    out.write(throughput.render_table(measured, plan) + "\n\n")
    document = {
        "tool": "cachebench --throughput",
        "header": dict(header),
        "plan": asdict(plan),
        "rows": records,
    }
    directory = options.output_dir
    files = [
        write_json(directory / "throughput.json", document),
        write_rows_csv(
            directory / "throughput.csv",
            CSV_FIELDS,
            [{key: value for key, value in r.items() if key != "steps"} for r in records],
        ),
    ]
    out.write(f"Results in {directory}: {', '.join(path.name for path in files)}\n")
    return document
