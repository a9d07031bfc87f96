"""get, set and incr per backend, one call per round (the key-value store benchmark's shape).

Run: ``python -m pytest bench/micro`` (see bench/README.md).
"""

from __future__ import annotations

from typing import Any

import pytest

KEY = "micro:key"
VALUE = b"v" * 100  # the 100-byte value of the project's reference measurements


@pytest.mark.benchmark(group="get")
def bench_get(benchmark: Any, cache: Any) -> None:
    cache.set(KEY, VALUE)
    assert benchmark(cache.get, KEY) == VALUE


@pytest.mark.benchmark(group="get-miss")
def bench_get_miss(benchmark: Any, cache: Any) -> None:
    assert benchmark(cache.get, "micro:absent") is None


@pytest.mark.benchmark(group="set")
def bench_set(benchmark: Any, cache: Any) -> None:
    benchmark(cache.set, KEY, VALUE)
    assert cache.get(KEY) == VALUE


@pytest.mark.benchmark(group="incr")
def bench_incr(benchmark: Any, cache: Any) -> None:
    cache.set(KEY, 0)
    last = benchmark(cache.incr, KEY)
    # The counter moved with every call: the value the last call returned is the stored one.
    assert last >= 1
    assert cache.get(KEY) == last
