"""Running one row: empty its storage, pre-fill it in a separate process, run the workers.

Workers are started with a ``spawn`` (or ``forkserver``) multiprocessing context: a forked
child would inherit the parent's Django state, open connections and client threads, which
is exactly what a benchmark must not measure. Each worker sets Django up with the
project's settings, builds its cache from the row's ``CACHES`` entry the way Django's
cache handler does, waits at a barrier so that all start together, runs its operations,
closes the cache and sends its samples back as packed 64-bit integers.
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_module
import time
import traceback
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Union

from django_fastcache.bench import calllog
from django_fastcache.bench.stats import ACTIONS, BackendStats, summarize
from django_fastcache.bench.workload import Workload, prefill_items, run_ops

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

# The two start methods that give a worker a fresh interpreter.
WorkerContext = Union["SpawnContext", "ForkServerContext"]

# Workers wait this long at the barrier for the slowest one to import Django and connect.
BARRIER_TIMEOUT = 120.0
PREFILL_TIMEOUT = 300.0
POLL_SECONDS = 0.1
# How describe() starts the error of a worker whose barrier another worker aborted.
BROKEN_BARRIER = "BrokenBarrierError"


class RowFailed(Exception):
    """The row could not be measured; the message is the one line the user sees."""


def setup_django(settings_module: str | None) -> None:
    """Configure Django in a fresh worker process, as the parent was configured."""
    import django
    from django.conf import settings

    if settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    elif not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        # The parent configured Django by hand (no settings module to import): the cache
        # entry carries everything a backend reads, so minimal settings are enough.
        # FastCache seals values with a key from SECRET_KEY: every worker needs the same.
        settings.configure(INSTALLED_APPS=[], USE_TZ=True, SECRET_KEY="cachebench")
    django.setup()


def build_cache(config: dict[str, Any]) -> Any:
    """A cache instance from a ``CACHES`` entry, built as Django's CacheHandler builds one."""
    from django.utils.module_loading import import_string

    params = dict(config)
    backend = params.pop("BACKEND")
    location = params.pop("LOCATION", "")
    return import_string(backend)(location, params)


def describe(exc: BaseException) -> str:
    """One line: the exception and where it was raised."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"


# -- the child processes ------------------------------------------------------------------


def prefill_main(
    config: dict[str, Any],
    settings_module: str | None,
    keys: int,
    clear: bool,
    results: Any,
) -> None:
    """Set every key (value = key) and close the cache; report "ok" or the error."""
    try:
        setup_django(settings_module)
        cache = build_cache(config)
        if clear:
            cache.clear()
        for key, value in prefill_items(keys):
            cache.set(key, value)
        cache.close()
        results.put(("ok", ""))
    except BaseException as exc:
        results.put(("error", describe(exc)))


def worker_main(
    config: dict[str, Any],
    settings_module: str | None,
    workload: Workload,
    index: int,
    barrier: Any,
    counter: Any,
    results: Any,
    call_log: str | None = None,
    name: str = "",
) -> None:
    """One benchmark worker: seed = its index; samples go back as ``array('q')`` bytes.
    ``call_log``: a directory where it also writes its log of calls (:mod:`.calllog`),
    under the row's ``name``."""

    def progress(done: int) -> None:
        with counter.get_lock():
            counter.value += done

    released = False
    try:
        setup_django(settings_module)
        cache = build_cache(config)
        barrier.wait(BARRIER_TIMEOUT)
        released = True
        calls = None if call_log is None else array("q")
        usage = calllog.usage_now()
        measured = run_ops(cache, workload, seed=index, on_progress=progress, calls=calls)
        if calls is not None and call_log is not None:
            used = calllog.usage_between(usage, calllog.usage_now())
            calllog.write(call_log, name, index, measured.started_ns, used, calls)
        cache.close()
        packed = {action: measured.samples[action].tobytes() for action in ACTIONS}
        results.put(
            ("done", index, packed, measured.misses, measured.started_ns, measured.finished_ns)
        )
    except BaseException as exc:
        # Release the others at once rather than leave them waiting out the barrier. Not
        # once it has let everyone through: a worker that has not woken from it yet would
        # then fail with BrokenBarrierError instead of running.
        if not released:
            with contextlib.suppress(Exception):
                barrier.abort()
        results.put(("error", index, describe(exc)))


# -- the parent ---------------------------------------------------------------------------


@dataclass
class RowMeasurement:
    stats: BackendStats
    wall_ns: int  # from the first worker's start to the last one's end


def _stop(processes: Sequence[BaseProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)


def prefill(
    context: WorkerContext,
    config: dict[str, Any],
    settings_module: str | None,
    keys: int,
    clear: bool,
) -> None:
    """Run the pre-fill in its own process; raise :class:`RowFailed` if it fails."""
    results = context.Queue()
    process = context.Process(
        target=prefill_main,
        args=(config, settings_module, keys, clear, results),
        name="cachebench-prefill",
    )
    process.start()
    deadline = time.monotonic() + PREFILL_TIMEOUT
    try:
        while True:
            try:
                status, detail = results.get(timeout=POLL_SECONDS)
                break
            except queue_module.Empty:
                if process.exitcode not in (None, 0):
                    raise RowFailed(
                        f"the pre-fill process died with exit code {process.exitcode}"
                    ) from None
                if time.monotonic() > deadline:
                    raise RowFailed(
                        f"the pre-fill did not finish in {PREFILL_TIMEOUT:.0f} s"
                    ) from None
        process.join(30)
    finally:
        _stop([process])
        results.close()
    if status != "ok":
        raise RowFailed(f"the pre-fill failed: {detail}")


def run_workers(
    context: WorkerContext,
    config: dict[str, Any],
    settings_module: str | None,
    workload: Workload,
    name: str,
    *,
    on_progress: Callable[[int], None] | None = None,
    timeout: float | None = None,
    call_log: str | None = None,
) -> RowMeasurement:
    """Start ``workload.procs`` workers, wait for every one, merge their samples.
    ``call_log``: a directory for each worker's log of calls (:mod:`.calllog`)."""
    barrier = context.Barrier(workload.procs)
    counter = context.Value("q", 0)
    results = context.Queue()
    processes = [
        context.Process(
            target=worker_main,
            args=(
                config,
                settings_module,
                workload,
                index,
                barrier,
                counter,
                results,
                call_log,
                name,
            ),
            name=f"cachebench-{name}-{index}",
        )
        for index in range(workload.procs)
    ]
    for process in processes:
        process.start()
    deadline = None if not timeout else time.monotonic() + timeout
    merged = {action: array("q") for action in ACTIONS}
    misses = dict.fromkeys(ACTIONS, 0)
    started: list[int] = []
    finished: list[int] = []
    pending = set(range(workload.procs))
    consequence: str | None = None
    try:
        while pending:
            try:
                message = results.get(timeout=POLL_SECONDS)
            except queue_module.Empty:
                if on_progress is not None:
                    on_progress(counter.value)
                _check_alive(processes, pending)
                if deadline is not None and time.monotonic() > deadline:
                    raise RowFailed(f"the workers did not finish in {timeout:.0f} s") from None
                continue
            if message[0] == "error":
                failure = f"worker {message[1]} failed: {message[2]}"
                if not message[2].startswith(BROKEN_BARRIER):
                    raise RowFailed(failure)
                # Another worker aborted the barrier; its own error says why and is on
                # its way, so report that one (this one only if no other comes).
                consequence = consequence or failure
                pending.discard(message[1])
                continue
            _, index, packed, worker_misses, start_ns, finish_ns = message
            for action in ACTIONS:
                merged[action].frombytes(packed[action])
                misses[action] += worker_misses[action]
            started.append(start_ns)
            finished.append(finish_ns)
            pending.discard(index)
        if consequence is not None:
            raise RowFailed(consequence)
        if on_progress is not None:
            on_progress(counter.value)
    finally:
        if pending:
            with contextlib.suppress(Exception):
                barrier.abort()
        for process in processes:
            process.join(30 if not pending else 0.5)
        _stop(processes)
        results.close()
    return RowMeasurement(
        stats=summarize(name, merged, misses), wall_ns=max(finished) - min(started)
    )


def _check_alive(processes: Sequence[BaseProcess], pending: set[int]) -> None:
    """A worker that died without a word (killed, crashed in C) fails the row.

    A worker that exited cleanly has already queued its message: it is still on its way.
    """
    for index in pending:
        code = processes[index].exitcode
        if code is not None and code != 0:
            raise RowFailed(f"worker {index} died with exit code {code}")


def start_context(method: str) -> WorkerContext:
    import multiprocessing

    if method not in ("spawn", "forkserver"):
        raise ValueError("workers must start with 'spawn' or 'forkserver' (fork copies Django)")
    context: WorkerContext = multiprocessing.get_context(method)  # type: ignore[assignment]
    return context
