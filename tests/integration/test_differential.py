"""Model-based differential test: FastCache against Django's LocMemCache, op by op.

A hypothesis ``RuleBasedStateMachine`` applies each random operation of Django's cache API
to FastCache (over a real memcached, started by the project's ``memcached`` fixture) and to
a ``LocMemCache`` oracle that never culls, and requires the same return value, or the same
kind of exception (both ``ValueError``, both ``TypeError``...), and the same warnings
(``CacheKeyWarning``). Every key of the pool is compared now and then (a rule: a read after
every step could repair what it should find) and at the end of each example.

It runs six ways: disk tier off / on, each through the sync API, through the async API (one
event loop for the whole test; the oracle is always called synchronously), and through both
in turn ("mixed": a switch_api rule flips between them). With the disk tier on, a further
rule flushes memcached behind FastCache's back (after the queued disk writes have landed):
the disk tier must then answer as memcached would have (docs/disk-tier.md).

Divergences the docs describe (memcached's key rules, how memcached's ``incr``/``decr``
count, deltas memcached cannot carry, get_many of keys that make one, a refused increment's
disk copy) are recorded and tolerated: the keys are then deleted from both caches so the
models stay in step. Any other divergence fails at once, and hypothesis shrinks it to a
minimal sequence.

Environment:
    FASTCACHE_DIFF_LONG=1           a longer run (2000 examples of 80 steps per way)
    FASTCACHE_DIFF_EXAMPLES=N       examples per way (default 60)
    FASTCACHE_DIFF_STEPS=N          steps per example (default 40)
    FASTCACHE_DIFF_REPORT=path      append the tolerated divergences, as JSON lines, there
    FASTCACHE_DIFF_MEMCACHED_LOSS=0 leave out the tiered ways' memcached_loses_everything rule
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.cache.backends.base import DEFAULT_TIMEOUT, InvalidCacheKey
from django.core.cache.backends.locmem import LocMemCache
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_fastcache.backends import FastCache
from django_fastcache.errors import NonIntegerValueError
from django_fastcache.testing.servers import MemcachedServer
from tests.integration.test_client_commands import raw_exchange

pytestmark = pytest.mark.integration

LONG = os.environ.get("FASTCACHE_DIFF_LONG") == "1"
MAX_EXAMPLES = int(os.environ.get("FASTCACHE_DIFF_EXAMPLES") or (2000 if LONG else 60))
STEPS = int(os.environ.get("FASTCACHE_DIFF_STEPS") or (80 if LONG else 40))
REPORT = os.environ.get("FASTCACHE_DIFF_REPORT")
MEMCACHED_LOSS = os.environ.get("FASTCACHE_DIFF_MEMCACHED_LOSS", "1") == "1"

TIMEOUT = 300  # both caches' TIMEOUT (what DEFAULT_TIMEOUT means)
MAX_KEY = 250
U64 = 2**64

# -- documented divergences: tolerated (the keys resynced); any other fails at once --------
DOCUMENTED = {
    # docs/configuration.md "Keys": FastCache raises InvalidCacheKey where locmem warns.
    "invalid-key": "configuration.md#keys",
    # The same, for keys locmem takes silently: over 250 UTF-8 bytes but not characters
    # (documented), or a lone surrogate (no UTF-8 form).
    "invalid-key-locmem-silent": "configuration.md#keys",
    # "Values, serializers and flags" / "Behaviour of the cache operations": incr/decr only
    # count values stored as digits (0..2**64-1); anything else raises NonIntegerValueError.
    "incr-non-digit-value": "configuration.md#values-serializers-and-flags",
    # "memcached stops decr at 0 and wraps incr at 2**64".
    "incr-wraps": "configuration.md#behaviour-of-the-cache-operations",
    "decr-floor": "configuration.md#behaviour-of-the-cache-operations",
    # "Timeouts": a delta that is not an int (bool included) or beyond 2**64-1 raises
    # InvalidArgumentError (a ValueError).
    "delta-refused": "configuration.md#timeouts",
    # "Behaviour of the cache operations": get_many of keys that make one key (7 and "7")
    # answers the last of them, as Django's own memcached backends do.
    "get-many-collapses-colliding-keys": "configuration.md#behaviour-of-the-cache-operations",
    # disk-tier.md "The guarantees, plainly": an incr/decr memcached refused (the value
    # not a number) hides a disk copy that had not landed yet: a miss once memcached loses
    # the key.
    "refused-incr-drops-disk-copy": "disk-tier.md#the-guarantees-plainly",
}


# -- strategies ------------------------------------------------------------------------------
class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT = _Omit()  # leave the argument out (the backend's default applies)

GOOD_KEYS = ["k0", "k1", "k2", "ключ"]
ODD_KEYS = ["x" * 247, "é" * 123, 7, "7"]  # valid: 250 and 249 made bytes; int 7 and "7",
# which make the same key
BAD_KEYS = [
    "with space",
    "tab\tkey",
    "del\x7f",
    "x" * 248,  # 251 characters made: locmem warns, FastCache refuses
    "é" * 124,  # 127 characters but 251 UTF-8 bytes made: only FastCache refuses
    "\ud800",  # a lone surrogate: no UTF-8 form
]
ALL_KEYS = [*GOOD_KEYS, *ODD_KEYS[:-1]]  # distinct made keys

keys = st.sampled_from(GOOD_KEYS * 20 + ODD_KEYS * 2 + BAD_KEYS)  # ~6% invalid
# Lists of keys, some naming one made key twice (7 and "7", or a key repeated).
key_lists = st.one_of(
    st.lists(keys, max_size=4), st.sampled_from([[7, "7"], ["7", 7, "k0"], ["k0", "k0"], []])
)
collisions = st.sampled_from([7, "7"])
versions = st.sampled_from([None, None, None, 1, 2])
timeouts = st.sampled_from([OMIT, None, 3600, DEFAULT_TIMEOUT, 0, -1, -3600, 2_592_001])
big_ints = st.sampled_from(
    [2**31, 2**63 - 1, 2**63, U64 - 2, U64 - 1, U64, U64 + 1, 2**100, -1, -(2**64)]
)
ints = st.one_of(st.integers(-5, 20), big_ints)
texts = st.one_of(st.text(max_size=6), st.sampled_from(["", "5", "-3", "007", "\ud800"]))
scalars = st.one_of(ints, texts, st.binary(max_size=6), st.none(), st.booleans())
values = st.one_of(
    scalars,
    st.floats(allow_nan=False),
    st.lists(st.one_of(ints, texts, st.none()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.one_of(ints, texts), max_size=3),
)
deltas = st.one_of(
    st.integers(-3, 10),
    st.sampled_from([0, 2**32, 2**63, U64 - 1, U64, -(U64 - 1), -U64]),
    st.sampled_from([1.5, True]),
)
defaults = st.one_of(st.none(), st.sampled_from(["DEFAULT", 0, b""]))


# -- outcomes --------------------------------------------------------------------------------
@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    warned: tuple[str, ...] = ()

    def show(self) -> str:
        if self.error is not None:
            text = f"raises {type(self.error).__module__}.{type(self.error).__qualname__}"
            text += f"({self.error})"
        else:
            text = f"returns {self.value!r}"
        return text + (f" warns {list(self.warned)}" if self.warned else "")


def capture(call: Callable[[], Any]) -> Outcome:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value, error = call(), None
        except Exception as exc:
            value, error = None, exc
    return Outcome(value, error, tuple(sorted({w.category.__name__ for w in caught})))


KINDS = (TypeError, ValueError, KeyError, AttributeError, OverflowError, pickle.PicklingError)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 != True here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def agree(fc: Outcome, lm: Outcome) -> bool:
    if (fc.error is None) != (lm.error is None) or fc.warned != lm.warned:
        return False
    if fc.error is not None:
        assert lm.error is not None
        fc_kinds = {k for k in KINDS if isinstance(fc.error, k)}
        lm_kinds = {k for k in KINDS if isinstance(lm.error, k)}
        return bool(fc_kinds & lm_kinds) or type(fc.error) is type(lm.error)
    return same(fc.value, lm.value)


@dataclass
class Divergences:
    """The tolerated divergences of one test: label -> count and first example."""

    way: str
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, label: str, example: dict[str, Any]) -> None:
        entry = self.seen.setdefault(label, {"count": 0, "first": example})
        entry["count"] += 1

    def summary(self) -> str:
        lines = [f"[{self.way}] tolerated divergences:"]
        for label, entry in sorted(self.seen.items()):
            lines.append(f"  {label} ({DOCUMENTED[label]}) x{entry['count']}: {entry['first']}")
        return "\n".join(lines)


def memcached_key_ok(made: str) -> bool:
    try:
        data = made.encode()
    except UnicodeEncodeError:
        return False
    return len(data) <= MAX_KEY and not any(b <= 0x20 or b == 0x7F for b in data)


# -- the machine -----------------------------------------------------------------------------
class CacheDiff(RuleBasedStateMachine):
    # Set per test (see the test below).
    fc: FastCache
    lm: LocMemCache
    server: MemcachedServer
    api: str  # "sync", "async" or "mixed" (switched by the switch_api rule)
    loop: asyncio.AbstractEventLoop
    divergences: Divergences

    def __init__(self) -> None:
        super().__init__()
        self.use_async = self.api == "async"
        # A fresh start for every example: memcached flushed (and the disk tier emptied).
        self.fc_call("clear")
        self.lm.clear()
        self.failed = False
        self.tiered = self.fc._shared().tiered  # the disk tier (None when it is off)
        # With the disk tier: made keys whose disk copy a documented divergence spoilt
        # (label by key), and those of them memcached_loses_everything then exposed.
        self.spoilt_disk_copies: dict[str, str] = {}
        self.exposed_disk_copies: dict[str, str] = {}

    # -- calling both ------------------------------------------------------------------------
    def fc_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.use_async:
            return self.loop.run_until_complete(getattr(self.fc, "a" + name)(*args, **kwargs))
        return getattr(self.fc, name)(*args, **kwargs)

    def peek(self, key: Any, version: Any) -> Any:
        """What the oracle holds for a key (a sentinel when nothing), without warnings."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.lm.get(key, OMIT, version=version)

    def check(
        self,
        op: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        touched: list[tuple[Any, Any]],
        make_args: Callable[[], tuple[tuple[Any, ...], dict[str, Any], list[Any]]] | None = None,
    ) -> tuple[Outcome, Outcome]:
        kwargs = {k: v for k, v in kwargs.items() if v is not OMIT}
        before = {kv: self.peek(*kv) for kv in touched}
        if make_args is None:
            fc = capture(lambda: self.fc_call(op, *args, **kwargs))
            lm = capture(lambda: getattr(self.lm, op)(*args, **kwargs))
        else:  # get_or_set with a callable: count each backend's calls of it
            fc_args, fc_kwargs, fc_calls = make_args()
            lm_args, lm_kwargs, lm_calls = make_args()
            fc = capture(lambda: self.fc_call(op, *fc_args, **fc_kwargs))
            lm = capture(lambda: getattr(self.lm, op)(*lm_args, **lm_kwargs))
            if fc.error is None:
                fc.value = (fc.value, f"default called {len(fc_calls)}x")
            if lm.error is None:
                lm.value = (lm.value, f"default called {len(lm_calls)}x")
        if not agree(fc, lm):
            self.diverged(op, args, kwargs, touched, before, fc, lm)
        if self.tiered is not None:
            self.track_disk_copies(op, kwargs, touched, fc)
        return fc, lm

    def track_disk_copies(
        self, op: str, kwargs: dict[str, Any], touched: list[tuple[Any, Any]], fc: Outcome
    ) -> None:
        """Note the keys whose disk copy a documented divergence spoils, and forget them
        again once a plain write or delete of theirs went through."""
        if not touched or any(not memcached_key_ok(self.fc.make_key(*kv)) for kv in touched):
            return
        made = [self.fc.make_key(k, version=v) for k, v in touched]
        if op in ("incr", "decr") and isinstance(fc.error, NonIntegerValueError):
            self.spoilt_disk_copies[made[0]] = "refused-incr-drops-disk-copy"
        elif op in ("set", "add", "delete", "set_many", "delete_many") and fc.error is None:
            for m in made:
                if op != "add" or fc.value is True:
                    self.spoilt_disk_copies.pop(m, None)
                    self.exposed_disk_copies.pop(m, None)

    def diverged(
        self,
        op: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        touched: list[tuple[Any, Any]],
        before: dict[tuple[Any, Any], Any],
        fc: Outcome,
        lm: Outcome,
    ) -> None:
        call = f"{op}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"
        label = self.classify(op, args, kwargs, touched, before, fc, lm)
        example = {
            "call": call,
            "oracle held": {repr(k): v for k, v in before.items() if v is not OMIT},
            "FastCache": fc.show(),
            "LocMemCache": lm.show(),
        }
        if label is None:
            self.failed = True
            raise AssertionError(
                f"divergence [{label or 'unclassified'}] in {self.divergences.way}:\n"
                f"  {call}   (oracle held before: {example['oracle held']})\n"
                f"  FastCache:   {fc.show()}\n"
                f"  LocMemCache: {lm.show()}\n"
                f"  memcached holds now: {self.memcached_holds(touched)}"
            )
        self.divergences.add(label, example)
        self.resync(touched)

    def memcached_holds(self, touched: list[tuple[Any, Any]]) -> dict[str, str]:
        """What memcached holds under each valid key involved (``mg <key> v f t``, read
        on a socket of its own), for the report of a divergence."""
        held: dict[str, str] = {}
        for key, version in touched:
            made = self.fc.make_key(key, version=version)
            if memcached_key_ok(made):
                request = b"mg %s v f t\r\nmn\r\n" % made.encode()
                held[made] = repr(raw_exchange(self.server, request, b"MN\r\n")[:-4])
        return held

    def classify(
        self,
        op: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        touched: list[tuple[Any, Any]],
        before: dict[tuple[Any, Any], Any],
        fc: Outcome,
        lm: Outcome,
    ) -> str | None:
        if op in ("incr", "decr"):
            delta = kwargs.get("delta", 1)
            if type(delta) is not int or abs(delta) >= U64:
                # Refused before the key is looked at (locmem may warn about the key first).
                return "delta-refused" if isinstance(fc.error, ValueError) else None
        made = [self.fc.make_key(k, version=v) for k, v in touched]
        if any(not memcached_key_ok(m) for m in made):
            if isinstance(fc.error, InvalidCacheKey) and not fc.warned:
                # locmem warns only on over 250 characters, control characters and space;
                # FastCache also refuses over 250 UTF-8 bytes, and keys with no UTF-8 form.
                return "invalid-key" if lm.warned else "invalid-key-locmem-silent"
            return None
        for m in made:  # a key whose disk copy a known divergence spoilt, then exposed
            if m in self.exposed_disk_copies:
                return self.exposed_disk_copies[m]
        if op in ("incr", "decr") and touched:
            held = before[touched[0]]
            counted = type(held) is int and 0 <= held < U64
            if held is not OMIT and not counted:
                if isinstance(fc.error, TypeError) and lm.error is None:
                    return "incr-non-digit-value"
                return None
            if counted and fc.error is None and lm.error is None:
                if lm.value >= U64 and fc.value == lm.value % U64:
                    return "incr-wraps"
                if lm.value < 0 and fc.value == 0:
                    return "decr-floor"
        return self.classify_colliding_keys(op, args, kwargs, fc, lm)

    def classify_colliding_keys(
        self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], fc: Outcome, lm: Outcome
    ) -> str | None:
        if op == "get_many" and fc.error is None and lm.error is None and fc.warned == lm.warned:
            version = kwargs.get("version")
            groups: dict[str, list[Any]] = {}
            for key in dict.fromkeys(args[0]):
                groups.setdefault(self.fc.make_key(key, version=version), []).append(key)
            collapsed = {}
            for keys_of_one in groups.values():
                if keys_of_one[0] in lm.value:  # FastCache names the last of them
                    collapsed[keys_of_one[-1]] = lm.value[keys_of_one[0]]
            if any(len(g) > 1 for g in groups.values()) and same(fc.value, collapsed):
                return "get-many-collapses-colliding-keys"
        return None

    def resync(self, touched: list[tuple[Any, Any]]) -> None:
        """After a tolerated divergence: the keys involved deleted from both caches."""
        for key, version in touched:
            self.spoilt_disk_copies.pop(self.fc.make_key(key, version=version), None)
            self.exposed_disk_copies.pop(self.fc.make_key(key, version=version), None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.lm.delete(key, version=version)
            try:
                self.fc_call("delete", key, version=version)
            except InvalidCacheKey:
                pass

    # -- the operations ------------------------------------------------------------------------
    @rule(key=keys, default=defaults, version=versions)
    def get(self, key: Any, default: Any, version: Any) -> None:
        self.check("get", (key,), {"default": default, "version": version}, [(key, version)])

    @rule(key=keys, value=values, timeout=timeouts, version=versions)
    def set(self, key: Any, value: Any, timeout: Any, version: Any) -> None:
        self.check("set", (key, value), {"timeout": timeout, "version": version}, [(key, version)])

    @rule(key=keys, value=values, timeout=timeouts, version=versions)
    def add(self, key: Any, value: Any, timeout: Any, version: Any) -> None:
        self.check("add", (key, value), {"timeout": timeout, "version": version}, [(key, version)])

    @rule(key=keys, version=versions)
    def delete(self, key: Any, version: Any) -> None:
        self.check("delete", (key,), {"version": version}, [(key, version)])

    @rule(key=keys, timeout=timeouts, version=versions)
    def touch(self, key: Any, timeout: Any, version: Any) -> None:
        self.check("touch", (key,), {"timeout": timeout, "version": version}, [(key, version)])

    @rule(key=keys, delta=st.one_of(st.just(OMIT), deltas), version=versions)
    def incr(self, key: Any, delta: Any, version: Any) -> None:
        self.check("incr", (key,), {"delta": delta, "version": version}, [(key, version)])

    @rule(key=keys, delta=st.one_of(st.just(OMIT), deltas), version=versions)
    def decr(self, key: Any, delta: Any, version: Any) -> None:
        self.check("decr", (key,), {"delta": delta, "version": version}, [(key, version)])

    @rule(key=keys, value=st.integers(0, 20), timeout=timeouts)
    def set_counter(self, key: Any, value: int, timeout: Any) -> None:
        """A set of a small non-negative int, so that incr/decr often count."""
        self.check("set", (key, value), {"timeout": timeout}, [(key, None)])

    @rule(key=keys, version=versions)
    def has_key(self, key: Any, version: Any) -> None:
        self.check("has_key", (key,), {"version": version}, [(key, version)])

    @rule(many=key_lists, version=versions)
    def get_many(self, many: list[Any], version: Any) -> None:
        self.check("get_many", (many,), {"version": version}, [(k, version) for k in many])

    @rule(
        data=st.dictionaries(keys | collisions, values, max_size=4),
        timeout=timeouts,
        version=versions,
    )
    def set_many(self, data: dict[Any, Any], timeout: Any, version: Any) -> None:
        self.check(
            "set_many", (data,), {"timeout": timeout, "version": version},
            [(k, version) for k in data],
        )  # fmt: skip

    @rule(many=key_lists, version=versions)
    def delete_many(self, many: list[Any], version: Any) -> None:
        self.check("delete_many", (many,), {"version": version}, [(k, version) for k in many])

    @rule(key=keys, default=values, timeout=timeouts, version=versions)
    def get_or_set(self, key: Any, default: Any, timeout: Any, version: Any) -> None:
        kwargs = {"timeout": timeout, "version": version}
        self.check("get_or_set", (key, default), kwargs, [(key, version)])

    @rule(key=keys, default=values, timeout=timeouts, version=versions)
    def get_or_set_callable(self, key: Any, default: Any, timeout: Any, version: Any) -> None:
        def make_args() -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
            calls: list[Any] = []

            def compute() -> Any:
                calls.append(1)
                return default

            kwargs = {"version": version}
            if timeout is not OMIT:
                kwargs["timeout"] = timeout
            return (key, compute), kwargs, calls

        self.check(
            "get_or_set", (key, f"<callable returning {default!r}>"),
            {"timeout": timeout, "version": version}, [(key, version)], make_args,
        )  # fmt: skip

    @rule()
    def clear(self) -> None:
        self.check("clear", (), {}, [])
        self.spoilt_disk_copies.clear()
        self.exposed_disk_copies.clear()

    # -- beyond the API: the mixed way's switches, and memcached losing its data ------------
    @precondition(lambda self: self.api == "mixed")
    @rule()
    def switch_api(self) -> None:
        self.use_async = not self.use_async

    @precondition(lambda self: self.tiered is not None and MEMCACHED_LOSS)
    @rule()
    def memcached_loses_everything(self) -> None:
        """memcached flushed behind FastCache's back (a restart, someone else's flush_all),
        once the disk copies queued so far have landed: docs/disk-tier.md says the disk tier
        then answers as memcached would have, so the oracle is left as it is."""
        assert self.tiered is not None
        assert self.tiered.flush(30.0), "the writer behind did not land the queued writes"
        self.server.flush()
        self.exposed_disk_copies.update(self.spoilt_disk_copies)

    # -- every key of the pool, read back the same: at random, and at the end -----------------
    # (a rule, not an invariant: a read after every step could hide what a read repairs)
    @rule()
    def read_everything(self) -> None:
        self.compare_contents()

    def compare_contents(self) -> None:
        for version in (None, 2):
            every = [(k, version) for k in ALL_KEYS]
            self.check("get_many", (ALL_KEYS,), {"version": version}, every)
            for key in ALL_KEYS:
                self.check("get", (key, OMIT), {"version": version}, [(key, version)])

    def teardown(self) -> None:
        if not self.failed:
            self.compare_contents()


# -- the test --------------------------------------------------------------------------------
@pytest.fixture
def event_loop_for_machine() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.timeout(0)  # its length is set by FASTCACHE_DIFF_* (the suite's 120 s would cut it)
@pytest.mark.parametrize("api", ["sync", "async", "mixed"])
@pytest.mark.parametrize("tier", ["memcached-only", "tiered"])
def test_fastcache_matches_locmem(
    memcached: MemcachedServer,
    request: pytest.FixtureRequest,
    event_loop_for_machine: asyncio.AbstractEventLoop,
    tier: str,
    api: str,
) -> None:
    options: dict[str, Any] = (
        {"disk_tier": False}
        if tier == "memcached-only"
        else {"disk_directory": request.getfixturevalue("disk_directory")}
    )
    fc = FastCache(memcached.location, {"TIMEOUT": TIMEOUT, "OPTIONS": options})
    lm = LocMemCache(
        f"differential-{uuid.uuid4().hex}",
        {"TIMEOUT": TIMEOUT, "OPTIONS": {"MAX_ENTRIES": 10**9, "CULL_FREQUENCY": 0}},
    )
    way = f"{tier}/{api}"
    divergences = Divergences(way)
    machine = type(
        "CacheDiff_" + way.replace("/", "_").replace("-", "_"),
        (CacheDiff,),
        {
            "fc": fc,
            "lm": lm,
            "server": memcached,
            "api": api,
            "loop": event_loop_for_machine,
            "divergences": divergences,
        },
    )
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=MAX_EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,  # nothing written under the repository (.hypothesis/)
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        if api != "sync":
            event_loop_for_machine.run_until_complete(fc.client.aclose())
        print(divergences.summary())
        if REPORT:
            with open(REPORT, "a", encoding="utf-8") as file:
                for label, entry in divergences.seen.items():
                    line = {"way": way, "label": label, "documented": DOCUMENTED.get(label)}
                    file.write(json.dumps({**line, **entry}, default=repr) + "\n")
