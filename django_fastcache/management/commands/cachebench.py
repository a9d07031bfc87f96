"""``manage.py cachebench``: the eight-process cache benchmark (see django_fastcache.bench)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from django_fastcache.bench import harness
from django_fastcache.bench.backends import ROW_NAMES
from django_fastcache.bench.workload import Workload


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _unstyled(text: str) -> str:
    return text


class _Verbatim:
    """A command's output stream that writes text as given.

    OutputWrapper ends every write with a newline and colours stderr on a terminal; a
    progress bar redrawn in place with a carriage return needs neither.
    """

    def __init__(self, wrapper: OutputWrapper) -> None:
        self._wrapper = wrapper

    def write(self, text: str, /) -> None:
        self._wrapper.write(text, style_func=_unstyled, ending="")

    def flush(self) -> None:
        self._wrapper.flush()

    def isatty(self) -> bool:
        return bool(self._wrapper.isatty())


def output_directory(given: Path | None) -> Path:
    """--output-dir, else the project's CACHEBENCH_OUTPUT_DIR, else ./cachebench-results;
    absolute, so that the path printed is the one written whatever the working directory."""
    from django.conf import settings

    chosen = given or getattr(settings, "CACHEBENCH_OUTPUT_DIR", None) or harness.DEFAULT_OUTPUT_DIR
    return Path(chosen).expanduser().absolute()


class Command(BaseCommand):
    help = (
        "Benchmark Django cache backends with the method of DiskCache's DjangoCache "
        "benchmark (8 processes x 100,000 operations by default) and print median/P90/P99 "
        "per operation. memcached and redis are started on loopback when the project does "
        "not configure a row. The full default run takes about 11 minutes on 2 CPUs; "
        "--quick takes under a minute."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--procs", type=_positive, help="worker processes (default 8; --throughput: CPU count)"
        )
        parser.add_argument("--ops", type=_positive, help="operations per worker (default 100000)")
        parser.add_argument("--keys", type=_positive, help="distinct keys (default 1100)")
        parser.add_argument(
            "--warmup", type=int, help="samples with count <= this are discarded (default 1000)"
        )
        parser.add_argument(
            "--backends",
            help="comma-separated rows, in the order given (default: all of "
            f"{','.join(ROW_NAMES)})",
        )
        parser.add_argument(
            "--output-dir",
            type=Path,
            help="where results.json, results.csv and the PNGs go (default: the "
            "CACHEBENCH_OUTPUT_DIR setting, else ./cachebench-results); printed at the start",
        )
        parser.add_argument("--no-plot", action="store_true", help="write no PNG files")
        parser.add_argument(
            "--quick",
            action="store_true",
            help=f"a short run: {harness.QUICK_PROCS} procs x {harness.QUICK_OPS} ops "
            "unless --procs/--ops say otherwise",
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bars")
        parser.add_argument(
            "--start-method",
            choices=("spawn", "forkserver"),
            default="spawn",
            help="how worker processes start (default spawn)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=3600.0,
            help="seconds a row's workers may take before the row is skipped (0: no limit)",
        )
        parser.add_argument(
            "--no-settings",
            action="store_true",
            help="ignore CACHEBENCH_BACKENDS and CACHES: use the embedded defaults only",
        )
        parser.add_argument(
            "--call-log",
            type=Path,
            metavar="DIR",
            help="also write each worker's kept calls (action, end, duration, the thread's CPU "
            "time over the call) and its process's CPU, context switches, page faults and "
            "(Linux) run-queue wait to DIR/<row>.<worker>.calls, for bench/call_tails.py",
        )
        throughput = parser.add_argument_group("throughput at a latency bound")
        throughput.add_argument(
            "--throughput",
            action="store_true",
            help="instead of the latency tables, find per row the highest rate with P95 < 1 ms "
            "for 100%% and 95%% gets",
        )
        throughput.add_argument(
            "--step-seconds", type=float, help="length of each rate step (default 2, quick 0.5)"
        )
        throughput.add_argument(
            "--max-rate", type=_positive, default=1_024_000, help="highest rate tried (req/s)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        quick = options["quick"]
        backends = (
            [name.strip() for name in options["backends"].split(",") if name.strip()]
            if options["backends"]
            else None
        )
        bench = harness.BenchOptions(
            backends=backends,
            output_dir=output_directory(options["output_dir"]),
            plot=not options["no_plot"],
            progress=not options["no_progress"],
            start_method=options["start_method"],
            timeout=options["timeout"] or None,
            use_settings=not options["no_settings"],
            quick=quick,
            call_log=options["call_log"],
        )
        try:
            if options["throughput"]:
                if options["call_log"] is not None:
                    raise CommandError(
                        "--call-log logs the latency tables' calls: leave it out with --throughput"
                    )
                from django_fastcache.bench.throughput import ThroughputPlan
                from django_fastcache.bench.throughput_run import run_throughput

                step = options["step_seconds"] or (0.5 if quick else 2.0)
                plan = ThroughputPlan(
                    procs=options["procs"] or os.cpu_count() or 2,
                    keys=options["keys"] or 1100,
                    step_seconds=step,
                    max_rate=options["max_rate"],
                )
                run_throughput(bench, plan, _Verbatim(self.stdout), _Verbatim(self.stderr))
                return
            spec = Workload()
            bench.workload = Workload(
                procs=options["procs"] or (harness.QUICK_PROCS if quick else spec.procs),
                ops=options["ops"] or (harness.QUICK_OPS if quick else spec.ops),
                keys=options["keys"] or spec.keys,
                warmup=spec.warmup if options["warmup"] is None else options["warmup"],
            )
            harness.run(bench, _Verbatim(self.stdout), _Verbatim(self.stderr))
            if bench.call_log is not None:
                self.stdout.write(f"call logs: {bench.call_log} (python bench/call_tails.py)")
        except (harness.OptionError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
