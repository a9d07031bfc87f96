"""What runs in each worker process: Django set up by hand, FastCache, a loop of random
operations, every one logged.

Started with multiprocessing's "spawn" context, so each worker is a fresh interpreter that
imports this module, configures Django itself and opens its own connections and SQLite
handles (nothing is inherited from the parent).

Time stamps come from ``time.monotonic_ns()``: on Linux it reads ``CLOCK_MONOTONIC``, one
clock for the whole machine, so the stamps of different processes (and of the chaos
controller in the parent) compare. It never jumps, unlike ``time.time_ns()``.
``time.perf_counter_ns()`` is the same clock on Linux, but not everywhere, so it is not used.
"""

from __future__ import annotations

import pickle
import random
import time
import traceback
from array import array
from dataclasses import dataclass
from typing import Any

from django_fastcache.errors import OutcomeUnknownError

from .checker import ADD, DELETE, GET, INCR, INVALIDATE, SET

#: The log's columns and their array type codes. ``kind`` indexes :data:`KINDS`, ``key``
#: the worker's key list, ``source`` :data:`SOURCES`; ``value`` is :data:`NOTHING` for None.
COLUMNS = {
    "kind": "b",
    "key": "h",
    "value": "q",
    "start": "q",
    "end": "q",
    "ok": "b",
    "source": "b",
}
KINDS = (GET, SET, DELETE, INCR, ADD, INVALIDATE)
#: Where an answer came from, as the worker saw it in the disk tier's counters.
SOURCES = ("memcached", "fallback", "disk", "journaled")
MEMCACHED, FALLBACK, DISK, JOURNALED = range(len(SOURCES))
NOTHING = -1

#: Shared counters per worker (a multiprocessing Array of int64), by slot.
OPS, FALLBACK_READS, DISK_READS, JOURNALED_WRITES = range(4)
SLOTS = 4

#: A set's value: unique per (worker, write), and spaced so that increments of one value
#: never reach another: worker w's n-th set writes (w + 1) * 10**12 + n * 10**4.
WORKER_SPACING = 10**12
WRITE_SPACING = 10**4
#: The share of reads made with get_or_set (its lease, and the disk tier's answer under it)
#: instead of get. One whose default ran and whose lease store memcached took (the tier's
#: ``leased_stores`` counter moved) is logged as an add that took, over the call's interval:
#: it wrote its value where the key held none. One whose store was refused or not made (a
#: write replaced the lease, the node was out, the wait ran out) is logged as a write that
#: may or may not have landed (a failed set); if it returned another value (Django's own
#: get_or_set reads again), as a read too.
GET_OR_SET_SHARE = 0.3
#: The share of deletes made with invalidate() instead: memcached keeps the value, marked
#: stale, which plain reads may still return until get_or_set replaces it or it expires.
#: Logged as such: the checker counts it as a delete that may or may not have taken effect
#: (a failed one), which explains a later miss and makes no read of the old value stale.
INVALIDATE_SHARE = 0.3
#: The share of reads made with touch() instead (no expiry, as every write here): it
#: changes no value, so it is not logged; what it could do wrong is queue, or put back into
#: memcached, a value older than a write racing it, which later reads would find.
TOUCH_SHARE = 0.1
#: The share of the remaining deletes made with delete_many() of the key and another (each
#: logged as a delete over the call's interval), and of the remaining reads made with
#: get_many() likewise (each key's answer logged as a read): the tier settles a node that
#: fails its part of either apart from the nodes that answered.
DELETE_MANY_SHARE = 0.3
GET_MANY_SHARE = 0.1
#: The kind of a touch, which is not logged.
TOUCHED = -1


@dataclass
class WorkerConfig:
    index: int
    location: list[str]
    directory: str
    options: dict[str, Any]
    keys: int
    seed: int
    log_path: str
    #: Chances of each kind of operation (get, set, delete, incr, add).
    mix: tuple[float, float, float, float, float] = (0.43, 0.22, 0.12, 0.17, 0.06)


def configure_django(location: list[str], options: dict[str, Any]) -> None:
    """Settings for a process that has none: one FastCache as the default cache."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            CACHES={
                "default": {
                    "BACKEND": "django_fastcache.backends.FastCache",
                    "LOCATION": location,
                    "OPTIONS": options,
                }
            },
            INSTALLED_APPS=["django_fastcache"],
            # FastCache seals values with a key from SECRET_KEY: the tests' own, so that
            # every process of a run (and the test process itself) reads the others' values.
            SECRET_KEY="django-fastcache-tests",
            USE_TZ=True,
        )
        django.setup()


def run_worker(config: WorkerConfig, counters: Any, start: Any, stop: Any) -> None:
    """Random operations on ``config.keys`` keys until ``stop`` is set; then the log, the
    errors and the disk tier's counters are pickled to ``config.log_path``.

    The log is kept in columns (:data:`COLUMNS`, arrays of machine integers), about 30
    bytes an operation, so that a soak of millions of operations fits in memory."""
    configure_django(config.location, {**config.options, "disk_directory": config.directory})
    from django.core.cache import cache

    rng = random.Random(config.seed)
    keys = [f"k{i}" for i in range(config.keys)]
    base = (config.index + 1) * WORKER_SPACING
    tiered = cache._shared().tiered  # type: ignore[attr-defined]
    metrics = tiered.metrics
    slot = config.index * SLOTS
    log = {name: array(code) for name, code in COLUMNS.items()}
    kinds, key_column, values = log["kind"], log["key"], log["value"]
    starts, ends, oks, sources = log["start"], log["end"], log["ok"], log["source"]
    errors: list[str] = []
    unknown_outcomes = 0
    writes = 0
    cache.get("warm-up")  # connections and SQLite opened before the clock starts
    start.wait()
    while not stop.is_set():
        kind = rng.choices(range(len(config.mix)), config.mix)[0]
        key = rng.randrange(len(keys))
        value: int | None = None
        fallbacks, disk_hits, journaled = metrics.fallbacks, metrics.disk_hits, metrics.journaled
        leased_stores = metrics.leased_stores
        began = time.monotonic_ns()
        ok = True
        computed: int | None = None
        other = rng.randrange(len(keys))
        # A second key of the same call (delete_many, get_many): its row, (key, value).
        second: tuple[int, int | None] | None = None
        try:
            if kind == 0 and rng.random() < TOUCH_SHARE:
                cache.touch(keys[key], None)
                kind = TOUCHED
            elif kind == 0 and rng.random() < GET_OR_SET_SHARE:
                writes += 1
                offered = base + writes * WRITE_SPACING
                ran: list[int] = []

                def default(offered: int = offered, ran: list[int] = ran) -> int:
                    ran.append(offered)
                    return offered

                value = cache.get_or_set(keys[key], default, timeout=None)
                if ran:
                    computed = offered
            elif kind == 0 and rng.random() < GET_MANY_SHARE and other != key:
                second = (other, None)
                found = cache.get_many([keys[key], keys[other]])
                value, second = found.get(keys[key]), (other, found.get(keys[other]))
            elif kind == 0:
                value = cache.get(keys[key])
            elif kind == 1:
                writes += 1
                value = base + writes * WRITE_SPACING
                cache.set(keys[key], value, timeout=None)
            elif kind == 2 and rng.random() < INVALIDATE_SHARE:
                cache.invalidate(keys[key])  # type: ignore[attr-defined]
                kind = KINDS.index(INVALIDATE)
            elif kind == 2 and rng.random() < DELETE_MANY_SHARE and other != key:
                second = (other, None)
                cache.delete_many([keys[key], keys[other]])
            elif kind == 2:
                cache.delete(keys[key])
            elif kind == 3:
                try:
                    value = cache.incr(keys[key])
                except ValueError:
                    value = None  # the key was missing
            else:
                writes += 1
                value = base + writes * WRITE_SPACING
                if not cache.add(keys[key], value, timeout=None):
                    value = None  # refused: the key held a value
        except OutcomeUnknownError:
            ok = False  # an incr or add memcached may have made as its node failed: allowed
            unknown_outcomes += 1
        except Exception:
            ok = False
            errors.append(traceback.format_exc())
        ended = time.monotonic_ns()
        source = MEMCACHED
        if metrics.fallbacks != fallbacks:
            source = FALLBACK
            if kind == 0:
                counters[slot + FALLBACK_READS] += 1
        elif metrics.disk_hits != disk_hits:
            source = DISK
            if kind == 0:
                counters[slot + DISK_READS] += 1
        if metrics.journaled != journaled:
            source = JOURNALED
            counters[slot + JOURNALED_WRITES] += 1
        counters[slot + OPS] += 1
        if kind == TOUCHED:
            continue
        if computed is not None:
            # The default's value: an add that took (stored under the lease), or a write
            # that may have landed, over the call's interval.
            stored = ok and metrics.leased_stores != leased_stores
            kinds.append(KINDS.index(ADD) if stored else KINDS.index(SET))
            key_column.append(key)
            values.append(computed)
            starts.append(began)
            ends.append(ended)
            oks.append(stored)
            sources.append(source)
            if value == computed:
                continue  # nothing was read
        for row_key, row_value in [(key, value), *([second] if second is not None else [])]:
            kinds.append(kind)
            key_column.append(row_key)
            values.append(NOTHING if row_value is None else row_value)
            starts.append(began)
            ends.append(ended)
            oks.append(ok)
            sources.append(source)
    result = {
        "log": log,
        "keys": keys,
        "errors": errors,
        "unknown_outcomes": unknown_outcomes,
        "stats": cache.tier_stats(),
    }
    with open(config.log_path, "wb") as out:
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
