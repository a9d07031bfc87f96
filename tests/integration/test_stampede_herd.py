"""Herds on a cold key: 50 callers or more (threads, forked processes, asyncio tasks, and
all three at once) call get_or_set together, and the default callable runs exactly once.

Calls are counted with memcached's incr, so processes count too. No caller is timed: the
callers start together at a barrier, each counts itself in ("entered") just before its
get_or_set, and the one computation waits until every caller has entered before it
returns, so all of them ask while the value is still missing or being computed.
"""

from __future__ import annotations

import asyncio
import faulthandler
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import MEMCACHED_ONLY

pytestmark = pytest.mark.integration

CALLERS = 50
KEY = "hot"
VALUE = {"expensive": "result"}
WAIT = 30.0  # reached only when something is broken
FORK = multiprocessing.get_context("fork")


def make(location: str, options: dict[str, Any]) -> FastCache:
    # A lease longer than any wait here: a second computation can only be a bug. A long
    # operation timeout: 150 callers on a small machine are no test of timeouts.
    return FastCache(
        location,
        {
            "OPTIONS": {
                **options,
                "stampede_lease": 120,
                "stampede_wait": 120,
                "operation_timeout": 20.0,
            }
        },
    )


def prepare(cache: FastCache) -> None:
    cache.delete(KEY)
    cache.set("calls", 0)
    cache.set("entered", 0)


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the herd never gathered")
        time.sleep(0.002)


def expensive(cache: FastCache, total: int) -> Callable[[], Any]:
    """The default callable: counted in memcached, done once every caller has entered."""

    def default() -> Any:
        cache.incr("calls")
        wait_for(lambda: cache.get("entered") >= total)
        return VALUE

    return default


def async_expensive(cache: FastCache, total: int) -> Callable[[], Any]:
    async def default() -> Any:
        await cache.aincr("calls")
        deadline = time.monotonic() + WAIT
        while await cache.aget("entered") < total:
            assert time.monotonic() < deadline, "the herd never gathered"
            await asyncio.sleep(0.002)
        return VALUE

    return default


def thread_caller(cache: FastCache, total: int, start: Any, results: list[Any]) -> None:
    start.wait(WAIT)
    cache.incr("entered")
    results.append(cache.get_or_set(KEY, expensive(cache, total)))


def process_caller(location: str, options: dict[str, Any], total: int, start: Any, n: int) -> None:
    """A forked process's whole life: its result goes to memcached, its exit status says
    whether it raised."""
    status = 1
    try:
        cache = make(location, options)
        start.wait(WAIT)
        cache.incr("entered")
        cache.set(f"result-{n}", cache.get_or_set(KEY, expensive(cache, total)))
        status = 0
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        os._exit(status)


def run_tasks(cache: FastCache, count: int, total: int, start: Any, results: list[Any]) -> None:
    """``count`` asyncio tasks on a loop of this thread, started together."""

    async def task() -> Any:
        await cache.aincr("entered")
        return await cache.aget_or_set(KEY, async_expensive(cache, total))

    async def main() -> list[Any]:
        try:
            return await asyncio.gather(*[task() for _ in range(count)])
        finally:
            await cache.client.aclose()

    start.wait(WAIT)
    results.extend(asyncio.run(main()))


def fork_callers(
    location: str, options: dict[str, Any], count: int, total: int, start: Any
) -> list[Any]:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    processes = [
        FORK.Process(target=process_caller, args=(location, options, total, start, n))
        for n in range(count)
    ]
    for process in processes:
        process.start()
    return processes


def process_results(cache: FastCache, processes: list[Any]) -> list[Any]:
    deadline = time.monotonic() + WAIT * 2
    running = {process.sentinel: process for process in processes}
    # Until all are done, or one failed (it printed why: the herd it was one of can never
    # gather now), or the deadline.
    while running and time.monotonic() < deadline:
        for sentinel in wait(list(running), max(0.0, deadline - time.monotonic())):
            running.pop(sentinel).join()
        if any(process.exitcode not in (None, 0) for process in processes):
            break
    stuck = [process for process in processes if process.exitcode is None]
    if stuck:
        # Have the first print where it is (the handler is inherited from this process).
        os.kill(stuck[0].pid, signal.SIGUSR1)
        stuck[0].join(2)
        for process in stuck:
            process.kill()
            process.join()
    assert [process.exitcode for process in processes] == [0] * len(processes)
    found = cache.get_many([f"result-{n}" for n in range(len(processes))])
    return list(found.values())


def calls(cache: FastCache) -> int:
    return cache.get("calls")


def test_threads(memcached: MemcachedServer, tier_options: dict[str, Any]) -> None:
    cache = make(memcached.location, tier_options)
    prepare(cache)
    start = threading.Barrier(CALLERS)
    results: list[Any] = []
    threads = [
        threading.Thread(target=thread_caller, args=(cache, CALLERS, start, results))
        for _ in range(CALLERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    assert results == [VALUE] * CALLERS
    assert calls(cache) == 1


def test_asyncio_tasks(memcached: MemcachedServer, tier_options: dict[str, Any]) -> None:
    cache = make(memcached.location, tier_options)
    prepare(cache)
    results: list[Any] = []
    run_tasks(cache, CALLERS, CALLERS, threading.Barrier(1), results)
    assert results == [VALUE] * CALLERS
    assert calls(cache) == 1


def test_processes(memcached: MemcachedServer, tier_options: dict[str, Any]) -> None:
    # This process counts over memcached alone: it starts no disk tier (and none of the
    # tier's threads) before forking; each child builds its own stack with the options.
    cache = make(memcached.location, MEMCACHED_ONLY)
    prepare(cache)
    start = FORK.Barrier(CALLERS)
    processes = fork_callers(memcached.location, tier_options, CALLERS, CALLERS, start)
    assert process_results(cache, processes) == [VALUE] * CALLERS
    assert calls(cache) == 1


def test_threads_processes_and_tasks_at_once(
    memcached: MemcachedServer, tier_options: dict[str, Any]
) -> None:
    each = 20
    total = 3 * each
    # Processes first, before this process starts any thread (its disk tier's included):
    # a fork copies no lock another thread holds.
    prepare(make(memcached.location, MEMCACHED_ONLY))
    start = FORK.Barrier(2 * each + 1)  # the processes, the threads, the loop's thread
    processes = fork_callers(memcached.location, tier_options, each, total, start)
    cache = make(memcached.location, tier_options)
    thread_results: list[Any] = []
    task_results: list[Any] = []
    threads = [
        threading.Thread(target=thread_caller, args=(cache, total, start, thread_results))
        for _ in range(each)
    ]
    threads.append(
        threading.Thread(target=run_tasks, args=(cache, each, total, start, task_results))
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    assert thread_results == [VALUE] * each
    assert task_results == [VALUE] * each
    assert process_results(cache, processes) == [VALUE] * each
    assert calls(cache) == 1
