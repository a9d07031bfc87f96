"""The consistency checker: did any read return a value older than an acknowledged write?

It is a pure function over a log of operations on a key-value store (:func:`check`). Each
operation is an :class:`Op`: which process ran it, its kind (``set``, ``get``, ``delete``,
``incr``), the key, the value written or read (``None``: nothing), when it started and
ended (nanoseconds on one clock shared by every process; see the runner), and whether it
returned normally (``ok``).

Definitions
===========

Two operations are *ordered* in real time when one ended before the other began:
``A < B`` iff ``A.end < B.start`` (strictly; operations that overlap, or touch, are
concurrent and may take effect in either order). An operation is *acknowledged* once it has
returned normally; a failed operation (``ok=False``, an exception) may or may not have taken
effect, at any time after it began: it counts as a write with no end.

*Mutations* are ``set`` (writes its value), ``incr`` that returned a number ``n`` (writes
``n``), ``add`` that took (logged with its value: it writes it; a refused one is logged with
None and neither writes nor is checked), and ``delete`` (writes "nothing"). Every value
written is unique (the runner makes sure of it), so a value read names the write it came
from. A key starts as "nothing".

A **read of a value** ``v`` (a ``get`` returning ``v``) with source write ``W`` (the write of
``v``) is **stale** iff some mutation ``M`` of the same key, acknowledged before the read
began, entirely followed ``W``:

    ``W < M < R``, i.e. ``M.start > W.end`` and ``M.end < R.start``.

Then every order consistent with real time puts ``M`` after ``W`` and before ``R``, so ``R``
must not see ``W``. A write concurrent with ``W`` or with ``R`` does not make ``R`` stale:
either order is possible. Other anomalies of a read of a value: no write of ``v`` exists
(**unknown value**), or every write of ``v`` began after the read ended (**value from the
future**).

A **read of nothing** (a ``get`` returning None, or an ``incr`` refused because the key was
missing) is **stale** iff *no* delete can explain it: for every delete ``D`` of the key
that began before the read ended (``D.start < R.end``; the initial state counts as a delete
that ended at minus infinity), some write ``W`` of a value entirely followed ``D`` and was
acknowledged before ``R`` began (``D < W < R``). In words: a write completed before the read
began, and no delete could have come after it by the time the read ended.

A stale read of nothing is a *miss*, not an old value: the runner counts and shows such
reads apart and does not fail on them. FastCache writes the disk tier behind memcached, and
a key whose latest write had not landed on disk when memcached lost it (or went out), or
whose write was in flight (stamped, not yet in memcached), misses rather than answering an
older value; that is the documented price of the write path (docs/disk-tier.md).

An ``add`` that took (or a ``get_or_set`` whose lease store memcached took: the worker logs
it as one) is a conditional write: it wrote where the key held nothing. A read of its value
``v`` (source ``A``) is also **stale** iff some write ``M`` of a value, acknowledged before the
read began (a ``set`` or an ``add``: an ``incr`` of a value ``invalidate()`` marked stale
leaves it stale, and ``get_or_set`` then replaces it), began after ``A`` began and before
``A`` ended (``A.start < M.start < A.end``, ``M.end < R.start``), and no delete, and no
loss, could fall between them (none began before ``A`` ended and ended after ``M`` began).
Had ``M`` come after the add, ``R`` must not see ``v``; had it come before, the add found a
value and must not have taken. This is the lease store that overwrote a write landing
while the value was computed. (A write that began
before the add did is left alone: memcached may have lost it with its disk copy in flight,
and an add that then takes is the documented miss, not an old value. For the same reason
the runner passes its outages as *losses*: a moment memcached may have lost any key.)

An ``invalidate`` leaves the value in memcached, marked stale: plain reads may return it
until a ``get_or_set`` replaces it. Everywhere it counts as a delete that may take effect at
any time after it began (a failed one): it explains a later miss and hides no value. Only
for the rule above does it take effect within its interval: a ``get_or_set`` wins the stale
value's lease, and a write after the invalidate replaces the value and so that lease.

An add that took also *read* nothing: it is checked as a read of nothing over its own
interval (a miss, when it took over a value memcached had lost with its disk copy in flight).

A successful ``incr`` returning ``n`` also *read* ``n - 1``: it is checked as a read of the
value ``n - 1`` over its own interval, so an increment applied to an overwritten value is
caught too. It also orders what real time may not: it took effect after the write of
``n - 1`` it counted on. So a read of ``v`` (source ``W``) is also **stale** iff an ``incr``
that returned ``v + 1`` was acknowledged before the read began, ``W`` is the only write of
``v``, and no failed increments explain ``v`` (below): the increment replaced ``W``'s value,
and nothing could write ``v`` again. This is a set that timed out (acknowledged late, once
made on disk) whose value another process counted on in memcached meanwhile; and a read of
``v`` by a second ``incr`` is an increment counted twice.

A failed ``incr`` may have taken effect, and nobody knows its count (FastCache raises
``OutcomeUnknownError`` for an increment memcached may have counted when its node failed,
when the disk tier cannot count it alike). So a value ``v`` that no write made is explained
when ``k`` failed increments of the key began before the read ended and some write made
``v - k`` (begun before then) that no mutation acknowledged before the read began entirely
followed (the increments counted on it before it was replaced).

These are necessary conditions for the history to be linearizable, checked read by read
(a full linearizability check is NP-complete in general); each stale read reported is a
real violation, whatever the order of the concurrent operations.

Cost: O(n log n) for n operations (per key: mutations sorted once, a prefix maximum, one
binary search per read).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Op", "Violation", "check", "format_violation"]

SET, GET, DELETE, INCR, ADD = "set", "get", "delete", "incr", "add"
INVALIDATE = "invalidate"
KINDS = (SET, GET, DELETE, INCR, ADD, INVALIDATE)

STALE_VALUE = "stale value"
STALE_NOTHING = "stale nothing"
UNKNOWN_VALUE = "unknown value"
FUTURE_VALUE = "value from the future"


class Op(NamedTuple):
    """One logged operation."""

    process: int
    kind: str
    key: str
    #: set: the value written; get: the value read (None: nothing); incr: the value it
    #: returned (None: the key was missing); delete: None.
    value: int | None
    start: int
    end: int
    ok: bool
    #: Where the answer came from, as the worker saw it ("memcached", "fallback", "disk",
    #: "journaled"...): for the report only, the checker does not use it.
    source: str = ""


@dataclass
class Violation:
    kind: str
    read: Op
    #: The write the value came from (stale value), if any.
    source: Op | None = None
    #: The acknowledged mutation that should have hidden it.
    hidden_by: Op | None = None
    #: The key's operations around the read, in start order.
    history: list[Op] = field(default_factory=list)


def _end(op: Op) -> float:
    """When the operation took effect at the latest: a failed one, possibly never."""
    return op.end if op.ok else math.inf


class _Prefix:
    """Intervals sorted by one bound, with the running maximum of the other: answers "the
    largest ``other`` among intervals whose ``bound`` is below ``t``", and which one."""

    def __init__(self, ops: Iterable[Op], bound: str, other: str) -> None:
        def value(op: Op, name: str) -> float:
            return _end(op) if name == "end" else op.start

        ordered = sorted(ops, key=lambda op: value(op, bound))
        self.bounds = [value(op, bound) for op in ordered]
        self.best: list[tuple[float, Op]] = []
        best: tuple[float, Op] | None = None
        for op in ordered:
            if best is None or value(op, other) > best[0]:
                best = (value(op, other), op)
            self.best.append(best)

    def below(self, t: float) -> tuple[float, Op | None]:
        i = bisect.bisect_left(self.bounds, t)
        if i == 0:
            return -math.inf, None
        return self.best[i - 1]


class _Key:
    def __init__(self, ops: Sequence[Op], losses: Sequence[tuple[int, float]] = ()) -> None:
        self.ops = sorted(ops, key=lambda op: op.start)
        self.starts = [op.start for op in self.ops]  # for history(), once per key
        writes = [op for op in ops if _is_write(op)]
        # invalidate() leaves the value, marked stale, which plain reads may still return:
        # a delete that may take effect at any time (a failed one), except to an add (below).
        invalidates = [op for op in ops if op.kind == INVALIDATE]
        deletes = [op for op in ops if op.kind == DELETE]
        deletes += [op._replace(ok=False) for op in invalidates]
        self.by_value: dict[int, list[Op]] = defaultdict(list)
        for op in writes:
            assert op.value is not None
            self.by_value[op.value].append(op)
        acknowledged = [op for op in (*writes, *deletes) if op.ok]
        # The latest-starting mutation / write among those acknowledged before t.
        self.mutations_ended = _Prefix(acknowledged, bound="end", other="start")
        self.writes_ended = _Prefix([op for op in writes if op.ok], bound="end", other="start")
        # The latest-ending delete among those begun before t (a failed one never ends).
        self.deletes_begun = _Prefix(deletes, bound="start", other="end")
        # What could empty the key before an add: an invalidate within its own interval
        # (a get_or_set wins a stale value's lease; a write after it replaces the value).
        emptying = [op for op in ops if op.kind == DELETE] + invalidates
        self.emptied_begun = _Prefix(emptying, bound="start", other="end")
        # Acknowledged sets and adds by start, for the adds' own rule (not increments: one
        # of a value invalidate() marked stale leaves it stale, for get_or_set to replace).
        self.written = sorted(
            (op for op in writes if op.ok and op.kind != INCR), key=lambda op: op.start
        )
        self.written_starts = [op.start for op in self.written]
        # Outages by start, with the latest end among those begun so far.
        self.loss_starts = sorted(start for start, _end in losses)
        self.loss_ends = list(itertools.accumulate(
            (end for _start, end in sorted(losses)), max
        ))  # fmt: skip
        self.overtaken: dict[int, Op | None] = {}
        # Increments that failed (may have counted, count unknown), by start.
        self.failed_incr_starts = sorted(op.start for op in ops if op.kind == INCR and not op.ok)
        # The earliest-ending acknowledged increment that counted on each value (its n - 1).
        self.counted_on: dict[int, Op] = {}
        for op in ops:
            if op.kind == INCR and op.ok and op.value is not None:
                earliest = self.counted_on.get(op.value - 1)
                if earliest is None or op.end < earliest.end:
                    self.counted_on[op.value - 1] = op

    def check_value(self, read: Op, value: int) -> Violation | None:
        candidates = self.by_value.get(value, [])
        possible = [w for w in candidates if w.start < read.end and w is not read]
        if not possible:
            if self.counted_by_failed_increments(read, value):
                return None
            kind = FUTURE_VALUE if candidates else UNKNOWN_VALUE
            return Violation(kind, read, source=candidates[0] if candidates else None)
        source = max(possible, key=_end)
        latest_start, hidden_by = self.mutations_ended.below(read.start)
        if latest_start > _end(source):
            return Violation(STALE_VALUE, read, source=source, hidden_by=hidden_by)
        if source.kind == ADD and source.ok:
            overtaken = self.overtaking(source)
            if overtaken is not None and overtaken.end < read.start:
                return Violation(STALE_VALUE, read, source=source, hidden_by=overtaken)
        counted = self.counted_on.get(value)
        if (
            counted is not None
            and counted.end < read.start
            and len(candidates) == 1
            and not self.counted_by_failed_increments(read, value)
        ):
            return Violation(STALE_VALUE, read, source=source, hidden_by=counted)
        return None

    def counted_by_failed_increments(self, read: Op, value: int) -> bool:
        """Whether ``value`` may be the count of failed increments begun before ``read``
        ended, on top of a value some write begun by then made (see the module docs)."""
        failed = bisect.bisect_left(self.failed_incr_starts, read.end)
        if not failed:
            return False
        # The base write must not be hidden from the read either: the increments counted
        # on it before whatever replaced it.
        latest_start, _hidden_by = self.mutations_ended.below(read.start)
        return any(
            w.start < read.end and w is not read and latest_start <= _end(w)
            for k in range(1, failed + 1)
            for w in self.by_value.get(value - k, [])
        )

    def overtaking(self, add: Op) -> Op | None:
        """The earliest-ending write of a value begun while ``add`` ran with no delete or
        loss able to fall between them (see the module docs), or None."""
        key = id(add)
        if key in self.overtaken:
            return self.overtaken[key]
        # Deletes (and losses) begun before the add ended: after the latest end among
        # them, nothing can empty the key before the add.
        cutoff, _delete = self.emptied_begun.below(add.end)
        i = bisect.bisect_left(self.loss_starts, add.end)
        if i:
            cutoff = max(cutoff, self.loss_ends[i - 1])
        lo = bisect.bisect_right(self.written_starts, max(add.start, cutoff))
        hi = bisect.bisect_left(self.written_starts, add.end)
        found = min(
            (op for op in self.written[lo:hi] if op is not add and op.start > cutoff),
            key=lambda op: op.end,
            default=None,
        )
        self.overtaken[key] = found
        return found

    def check_nothing(self, read: Op) -> Violation | None:
        latest_write_start, write = self.writes_ended.below(read.start)
        latest_delete_end, _delete = self.deletes_begun.below(read.end)
        if latest_write_start > latest_delete_end:
            return Violation(STALE_NOTHING, read, hidden_by=write)
        return None

    def history(self, violation: Violation, context: int) -> list[Op]:
        first = violation.read.start
        if violation.source is not None:
            first = min(first, violation.source.start)
        if violation.hidden_by is not None:
            first = min(first, violation.hidden_by.start)
        last = violation.read.end
        starts = self.starts
        lo = max(0, bisect.bisect_left(starts, first) - context)
        hi = min(len(self.ops), bisect.bisect_right(starts, last) + context)
        # Operations begun earlier but still running then matter too (a slow write).
        # (looked for among the 1000 before: a report's context, not a proof)
        running = [op for op in self.ops[max(0, lo - 1000) : lo] if _end(op) >= first]
        return running + self.ops[lo:hi]


def _is_write(op: Op) -> bool:
    return op.kind == SET or (op.kind in (INCR, ADD) and op.value is not None)


def check(
    ops: Iterable[Op], *, context: int = 5, losses: Sequence[tuple[int, float]] = ()
) -> list[Violation]:
    """Every read in ``ops`` that breaks the rules of the module docstring, in start order,
    each with the key's history around it (``context`` more operations either side).
    ``losses``: (start, end) of each time memcached may have lost any key (an outage)."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.kind not in KINDS:
            raise ValueError(f"unknown operation kind {op.kind!r}")
        by_key[op.key].append(op)
    violations: list[Violation] = []
    for key_ops in by_key.values():
        key = _Key(key_ops, losses)
        for op in key.ops:
            if not op.ok:
                continue
            found: Violation | None = None
            if op.kind == GET:
                found = key.check_nothing(op) if op.value is None else key.check_value(op, op.value)
            elif op.kind == ADD and op.value is not None:
                # It took: it found nothing, as a read of nothing over its interval would.
                found = key.check_nothing(op)
            elif op.kind == INCR:
                # A missing key, or the value the increment was applied to.
                found = (
                    key.check_nothing(op) if op.value is None else key.check_value(op, op.value - 1)
                )
            if found is not None:
                found.history = key.history(found, context)
                violations.append(found)
    violations.sort(key=lambda v: v.read.start)
    return violations


def _describe(op: Op, origin: int) -> str:
    value = "-" if op.value is None else op.value
    status = "" if op.ok else "  FAILED"
    source = f"  [{op.source}]" if op.source else ""
    return (
        f"p{op.process:<2} {op.kind:<6} {op.key:<5} {value!s:<22} "
        f"{(op.start - origin) / 1e6:>12.3f} .. {(op.end - origin) / 1e6:>12.3f} ms{status}{source}"
    )


def format_violation(violation: Violation) -> str:
    """The violation and the key's history around it, times relative to its first entry."""
    ops = violation.history or [violation.read]
    origin = min(op.start for op in ops)
    lines = [f"{violation.kind}: {_describe(violation.read, origin)}"]
    if violation.source is not None:
        lines.append(f"  value written by: {_describe(violation.source, origin)}")
    if violation.hidden_by is not None:
        lines.append(f"  then acknowledged: {_describe(violation.hidden_by, origin)}")
    lines.append("  history of the key:")
    for op in ops:
        marker = ">>" if op is violation.read else "  "
        lines.append(f"  {marker} {_describe(op, origin)}")
    return "\n".join(lines)
