"""The checker on hand-made histories: what it must accept, what it must reject, and its
fast search against a brute-force reading of the rules on random histories."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from .checker import (
    ADD,
    DELETE,
    FUTURE_VALUE,
    GET,
    INCR,
    INVALIDATE,
    SET,
    STALE_NOTHING,
    STALE_VALUE,
    UNKNOWN_VALUE,
    Op,
    check,
    format_violation,
)
from .runner import History
from .worker import COLUMNS, FALLBACK, JOURNALED, MEMCACHED
from .worker import KINDS as WORKER_KINDS


def op(process: int, kind: str, value: int | None, start: int, end: int, *, key: str = "k",
       ok: bool = True) -> Op:  # fmt: skip
    return Op(process, kind, key, value, start, end, ok)


def kinds(history: list[Op]) -> list[str]:
    return [violation.kind for violation in check(history)]


# -- accepted ----------------------------------------------------------------------------


def test_reads_of_the_latest_write_and_of_nothing_before_any() -> None:
    assert kinds([
        op(0, GET, None, 0, 1),
        op(0, SET, 10, 2, 3),
        op(1, GET, 10, 4, 5),
        op(0, SET, 20, 6, 7),
        op(1, GET, 20, 8, 9),
    ]) == []  # fmt: skip


def test_read_overlapping_an_overwrite_may_see_either_value() -> None:
    history = [op(0, SET, 10, 0, 1), op(0, SET, 20, 2, 10)]
    assert kinds([*history, op(1, GET, 10, 5, 6)]) == []
    assert kinds([*history, op(1, GET, 20, 5, 6)]) == []


def test_concurrent_writes_may_be_read_in_either_order_afterwards() -> None:
    # W1 and W2 overlap: no order between them is forced, whatever was read before.
    assert kinds([
        op(0, SET, 10, 0, 5),
        op(1, SET, 20, 1, 6),
        op(2, GET, 20, 7, 8),
        op(2, GET, 10, 9, 10),
    ]) == []  # fmt: skip


def test_read_overlapping_a_delete_may_see_the_old_value_or_nothing() -> None:
    history = [op(0, SET, 10, 0, 1), op(1, DELETE, None, 2, 10)]
    assert kinds([*history, op(2, GET, 10, 5, 6)]) == []
    assert kinds([*history, op(2, GET, None, 5, 6)]) == []
    assert kinds([*history, op(2, GET, None, 11, 12)]) == []


def test_nothing_while_a_set_is_still_running() -> None:
    assert kinds([op(0, SET, 10, 0, 10), op(1, GET, None, 5, 6)]) == []


def test_nothing_when_a_delete_overlaps_the_last_write() -> None:
    # The delete may have come after the set, so nothing is a correct answer.
    assert kinds([
        op(0, SET, 10, 0, 5),
        op(1, DELETE, None, 4, 6),
        op(2, GET, None, 7, 8),
    ]) == []  # fmt: skip


def test_operations_that_touch_are_concurrent() -> None:
    # The overwrite ends exactly when the read begins: not "before" it.
    assert kinds([op(0, SET, 10, 0, 1), op(0, SET, 20, 2, 5), op(1, GET, 10, 5, 6)]) == []


def test_a_failed_write_may_take_effect_at_any_time_and_hides_nothing() -> None:
    assert kinds([
        op(0, SET, 10, 0, 1),
        op(1, SET, 20, 2, 3, ok=False),
        op(2, GET, 10, 4, 5),  # the failed write need not have happened
        op(2, GET, 20, 6, 7),  # or it happened late
        op(2, GET, 10, 8, 9),  # and the failure is all that is known
    ]) == []  # fmt: skip


def test_a_failed_delete_may_explain_nothing_later() -> None:
    assert kinds([
        op(0, SET, 10, 0, 1),
        op(1, DELETE, None, 2, 3, ok=False),
        op(2, GET, None, 4, 5),
    ]) == []  # fmt: skip


def test_failed_reads_are_ignored() -> None:
    assert kinds([op(0, SET, 10, 0, 1), op(0, SET, 20, 2, 3), op(1, GET, 10, 4, 5, ok=False)]) == []


def test_increments_write_what_they_return_and_read_the_value_before() -> None:
    assert kinds([
        op(0, INCR, None, 0, 1),  # missing
        op(0, SET, 100, 2, 3),
        op(1, INCR, 101, 4, 5),
        op(2, GET, 101, 6, 7),
        op(1, INCR, 102, 8, 9),
        op(0, DELETE, None, 10, 11),
        op(2, INCR, None, 12, 13),
    ]) == []  # fmt: skip


def test_a_failed_increment_may_have_counted_and_others_counted_on_top() -> None:
    # A timed-out incr memcached counted (its count unknown: OutcomeUnknownError), read
    # by another incr and a get before anyone knew.
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(1, INCR, None, 2, 9, ok=False),
        op(2, INCR, 102, 3, 4),  # counted on 101, the failed one's
        op(3, GET, 101, 3, 5),  # the failed one's count, read while 102 was being made
        op(0, GET, 103, 10, 11),
        op(1, INCR, None, 12, 13, ok=False),
    ]) == []  # fmt: skip


def test_keys_are_independent() -> None:
    assert kinds([
        op(0, SET, 10, 0, 1, key="a"),
        op(0, SET, 20, 2, 3, key="b"),
        op(1, DELETE, None, 4, 5, key="b"),
        op(1, GET, 10, 6, 7, key="a"),
    ]) == []  # fmt: skip


# -- rejected ----------------------------------------------------------------------------


def test_a_count_no_failed_increment_explains_is_an_unknown_value() -> None:
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(1, INCR, None, 2, 3, ok=False),
        op(0, GET, 102, 4, 5),  # two counts on 100, one increment that may have counted
        op(0, GET, 201, 6, 7),  # no write of 200
    ]) == [UNKNOWN_VALUE, UNKNOWN_VALUE]  # fmt: skip
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(2, INCR, 102, 3, 4),  # counted on 101, which nothing may have written
        op(1, INCR, None, 5, 6, ok=False),  # began after it
    ]) == [UNKNOWN_VALUE]  # fmt: skip
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(1, INCR, None, 2, 3, ok=False),
        op(0, SET, 500, 4, 5),  # replaced 100, and whatever the failed increment made of it
        op(2, GET, 101, 10, 11),
    ]) == [UNKNOWN_VALUE]  # fmt: skip


def test_value_overwritten_before_the_read_began_is_stale() -> None:
    first, second = op(0, SET, 10, 0, 1), op(1, SET, 20, 2, 3)
    read = op(2, GET, 10, 4, 5)
    [violation] = check([first, second, read])
    assert violation.kind == STALE_VALUE
    assert violation.read == read
    assert violation.source == first
    assert violation.hidden_by == second


def test_value_deleted_before_the_read_began_is_stale() -> None:
    delete = op(1, DELETE, None, 2, 3)
    [violation] = check([op(0, SET, 10, 0, 1), delete, op(2, GET, 10, 4, 5)])
    assert (violation.kind, violation.hidden_by) == (STALE_VALUE, delete)


def test_stale_even_when_the_overwrite_was_by_the_reader_itself() -> None:
    assert kinds([op(0, SET, 10, 0, 1), op(0, SET, 20, 2, 3), op(0, GET, 10, 4, 5)]) == [
        STALE_VALUE
    ]


def test_nothing_after_an_acknowledged_set_is_stale() -> None:
    assert kinds([op(0, SET, 10, 0, 1), op(1, GET, None, 2, 3)]) == [STALE_NOTHING]


def test_nothing_is_stale_when_every_delete_was_followed_by_a_write() -> None:
    # D < W < R: the delete cannot explain the read.
    assert kinds([
        op(0, SET, 10, 0, 1),
        op(1, DELETE, None, 2, 3),
        op(0, SET, 20, 4, 5),
        op(1, GET, None, 6, 7),
    ]) == [STALE_NOTHING]  # fmt: skip


def test_delete_that_began_after_the_read_explains_nothing() -> None:
    assert kinds([
        op(0, SET, 10, 0, 1),
        op(1, GET, None, 2, 3),
        op(2, DELETE, None, 4, 5),
    ]) == [STALE_NOTHING]  # fmt: skip


def test_increment_of_an_overwritten_value_is_stale() -> None:
    # The increment returned 101: it counted on 100, which 200 had replaced.
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(1, SET, 200, 2, 3),
        op(2, INCR, 101, 4, 5),
    ]) == [STALE_VALUE]  # fmt: skip


def test_a_value_an_acknowledged_increment_counted_on_is_stale_afterwards() -> None:
    # A set acknowledged late (it timed out and was made on disk) whose value another
    # process counted on in memcached meanwhile: real time does not order the two, the
    # count does.
    assert kinds([
        op(0, SET, 100, 0, 50),
        op(1, INCR, 101, 10, 11),
        op(2, GET, 100, 5, 12),  # began before the increment ended: either order
        op(2, GET, 100, 60, 61),
    ]) == [STALE_VALUE]  # fmt: skip
    # The same count made twice: the second increment read 100 after the first ended.
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(1, INCR, 101, 2, 3),
        op(2, INCR, 101, 4, 5),
    ]) == [STALE_VALUE]  # fmt: skip


def test_a_counted_on_value_written_twice_or_counted_again_by_failed_increments_may_return(
) -> None:  # fmt: skip
    # Values the runner never repeats; the rule holds only for a value with one write.
    assert kinds([
        op(0, SET, 100, 0, 1),
        op(1, INCR, 101, 2, 3),
        op(0, SET, 100, 4, 5),
        op(2, GET, 100, 6, 7),
    ]) == []  # fmt: skip
    assert kinds([
        op(0, SET, 100, 0, 50),
        op(1, INCR, 101, 2, 3),
        op(2, INCR, None, 4, 60, ok=False),  # may count at any time ...
        op(3, SET, 99, 5, 6),  # ... on this: 100 again
        op(4, GET, 100, 10, 11),
    ]) == []  # fmt: skip
    assert kinds([
        op(0, SET, 100, 0, 50),
        op(1, INCR, 101, 2, 3),
        op(2, INCR, None, 4, 30, ok=False),
        op(3, GET, 100, 10, 11),  # nothing it could count on makes 100 again
    ]) == [STALE_VALUE]  # fmt: skip


def test_increment_refused_after_an_acknowledged_set_is_stale() -> None:
    assert kinds([op(0, SET, 100, 0, 1), op(1, INCR, None, 2, 3)]) == [STALE_NOTHING]


def test_value_nobody_wrote_and_value_from_the_future() -> None:
    assert kinds([op(0, GET, 99, 0, 1)]) == [UNKNOWN_VALUE]
    assert kinds([op(0, GET, 10, 0, 1), op(1, SET, 10, 2, 3)]) == [FUTURE_VALUE]


def test_report_shows_the_read_the_write_and_what_hid_it() -> None:
    history = [
        op(0, SET, 10, 0, 1_000_000),
        op(1, SET, 20, 2_000_000, 3_000_000),
        op(2, GET, 10, 4_000_000, 5_000_000),
    ]
    [violation] = check(history)
    text = format_violation(violation)
    assert text.startswith("stale value: p2")
    assert "value written by: p0  set" in text
    assert "then acknowledged: p1  set" in text
    assert text.count("\n") >= 6  # the key's history follows


def test_history_includes_a_slow_operation_that_began_long_before() -> None:
    slow = op(9, SET, 30, 0, 100)
    history = [slow] + [op(1, GET, None, 10 + i, 10 + i) for i in range(20)]
    history += [op(0, SET, 10, 40, 41), op(0, SET, 20, 42, 43), op(1, GET, 10, 50, 51)]
    stale = [v for v in check(history, context=2) if v.kind == STALE_VALUE]
    assert stale
    assert slow in stale[0].history


# -- the fast search against the rules read literally ------------------------------------


def _brute_force(history: list[Op]) -> list[tuple[str, Op]]:
    def end(o: Op) -> float:
        return o.end if o.ok else math.inf

    found = []
    for read in history:
        if not read.ok or read.kind not in (GET, INCR):
            continue
        same_key = [o for o in history if o.key == read.key and o is not read]
        writes = [o for o in same_key if o.kind == SET or (o.kind == INCR and o.value is not None)]
        mutations = writes + [o for o in same_key if o.kind == DELETE]
        value = read.value if read.kind == GET or read.value is None else read.value - 1
        if value is None:
            deletes = [(-math.inf, -math.inf)] + [
                (o.start, end(o)) for o in same_key if o.kind == DELETE
            ]
            explained = any(
                d_start < read.end
                and not any(w.ok and w.start > d_end and w.end < read.start for w in writes)
                for d_start, d_end in deletes
            )
            if not explained:
                found.append((STALE_NOTHING, read))
            continue
        sources = [w for w in writes if w.value == value]
        possible = [w for w in sources if w.start < read.end]
        failed = [o for o in same_key if o.kind == INCR and not o.ok and o.start < read.end]
        counted = any(
            w.value == value - k
            and w.start < read.end
            and not any(m.ok and m.start > end(w) and m.end < read.start for m in mutations)
            for k in range(1, len(failed) + 1)
            for w in writes
        )
        if not possible and counted:
            continue  # counted by increments that failed: their counts are unknown
        if not possible:
            found.append((FUTURE_VALUE if sources else UNKNOWN_VALUE, read))
        elif all(
            any(m.ok and m.start > end(w) and m.end < read.start for m in mutations)
            for w in possible
        ):
            found.append((STALE_VALUE, read))
        elif (
            len(sources) == 1
            and not counted
            and any(
                o.kind == INCR and o.ok and o.value == value + 1 and o.end < read.start
                for o in same_key
            )
        ):
            found.append((STALE_VALUE, read))  # an increment replaced the only write of it
    return found


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_the_rules_read_literally(seed: int) -> None:
    rng = random.Random(seed)
    history: list[Op] = []
    values = [None, *range(1, 6)]
    for _ in range(rng.randrange(5, 40)):
        start = rng.randrange(0, 100)
        end = start + rng.randrange(0, 15)
        kind = rng.choice([SET, GET, GET, DELETE, INCR])
        key = rng.choice("ab")
        value = None if kind == DELETE else rng.choice(values)
        if kind == SET and value is None:
            value = rng.randrange(1, 6)
        history.append(op(rng.randrange(4), kind, value, start, end, key=key,
                          ok=rng.random() > 0.1))  # fmt: skip
    expected = sorted(_brute_force(history), key=lambda found: (found[1].start, repr(found)))
    got = sorted(
        ((v.kind, v.read) for v in check(history)), key=lambda found: (found[1].start, repr(found))
    )
    assert got == expected


def test_an_add_that_took_writes_its_value_and_a_refused_one_writes_nothing() -> None:
    assert kinds([
        op(0, ADD, 10, 0, 1),
        op(1, GET, 10, 2, 3),
        op(1, ADD, None, 4, 5),  # refused: the key held 10
        op(0, GET, 10, 6, 7),
        op(0, INCR, 11, 8, 9),
    ]) == []  # fmt: skip
    # A value read after a later add took is stale, as after a set.
    assert kinds([
        op(0, SET, 10, 0, 1),
        op(0, DELETE, None, 2, 3),
        op(1, ADD, 20, 4, 5),
        op(1, GET, 10, 6, 7),
    ]) == [STALE_VALUE]  # fmt: skip
    # The counter an add started, lost and started again: a read of nothing after it is due.
    assert kinds([
        op(0, ADD, 30, 0, 1),
        op(1, GET, None, 2, 3),
    ]) == [STALE_NOTHING]  # fmt: skip


def test_a_write_landing_while_an_add_ran_hides_the_adds_value() -> None:
    # get_or_set's lease store (an add that took) overwrote a set acknowledged meanwhile.
    assert kinds([
        op(0, ADD, 10, 0, 10),
        op(1, SET, 20, 2, 3),
        op(1, GET, 10, 11, 12),
    ]) == [STALE_VALUE]  # fmt: skip
    found = check([op(0, ADD, 10, 0, 10), op(1, SET, 20, 2, 3), op(1, GET, 10, 11, 12)])
    assert found[0].hidden_by == op(1, SET, 20, 2, 3)
    # The write's value read afterwards is fine: the add came first, or never took.
    assert kinds([op(0, ADD, 10, 0, 10), op(1, SET, 20, 2, 3), op(1, GET, 20, 11, 12)]) == []


def test_an_adds_value_after_a_concurrent_write_is_explained_by_a_delete_or_loss() -> None:
    history = [op(0, ADD, 10, 0, 10), op(1, SET, 20, 2, 3), op(1, GET, 10, 11, 12)]
    # A delete between the write and the add emptied the key: the add may take after it.
    assert kinds([*history, op(2, DELETE, None, 4, 5)]) == []
    assert kinds([*history, op(2, DELETE, None, 1, 9, ok=False)]) == []
    # A delete that ended before the write began explains nothing.
    assert kinds([*history, op(2, DELETE, None, 0, 1)]) == [STALE_VALUE]
    # An outage during the add may have lost the write (its disk copy in flight).
    assert [v.kind for v in check(history, losses=[(5, 6)])] == []
    assert [v.kind for v in check(history, losses=[(0, 1)])] == [STALE_VALUE]
    assert [v.kind for v in check(history, losses=[(11, 20)])] == [STALE_VALUE]


def test_an_add_is_not_faulted_for_writes_begun_before_it_or_failed_or_read_too_early() -> None:
    # Begun before the add: memcached may have lost it (the documented miss).
    assert kinds([op(0, ADD, 10, 5, 10), op(1, SET, 20, 2, 6), op(1, GET, 10, 11, 12)]) == []
    # Not acknowledged: it may never have landed.
    assert kinds([op(0, ADD, 10, 0, 10), op(1, SET, 20, 2, 3, ok=False),
                  op(1, GET, 10, 11, 12)]) == []  # fmt: skip
    # Still running when the read began: either order.
    assert kinds([op(0, ADD, 10, 0, 10), op(1, SET, 20, 2, 13), op(1, GET, 10, 11, 12)]) == []
    # A write of a value that may never have landed (a failed one) is not an add.
    assert kinds([op(0, SET, 10, 0, 10, ok=False), op(1, SET, 20, 2, 3),
                  op(1, GET, 10, 11, 12)]) == []  # fmt: skip


def test_an_add_that_took_over_an_acknowledged_value_is_a_read_of_nothing() -> None:
    assert kinds([op(0, SET, 10, 0, 1), op(1, ADD, 20, 2, 3)]) == [STALE_NOTHING]
    assert kinds([op(0, SET, 10, 0, 1), op(0, DELETE, None, 1, 2), op(1, ADD, 20, 2, 3)]) == []


def test_an_invalidate_hides_nothing_explains_misses_and_empties_the_key_for_an_add() -> None:
    # Plain reads may still return the value marked stale; a later miss is explained.
    assert kinds([op(0, SET, 10, 0, 1), op(1, INVALIDATE, None, 2, 3),
                  op(1, GET, 10, 4, 5), op(0, GET, None, 6, 7)]) == []  # fmt: skip
    # get_or_set won the stale value's lease and stored (an add): fine after the invalidate...
    history = [op(0, SET, 10, 0, 1), op(1, INVALIDATE, None, 2, 3), op(0, ADD, 20, 4, 10)]
    assert kinds([*history, op(1, GET, 20, 11, 12)]) == []
    # ...but not over a write that landed while it computed, after the invalidate.
    assert kinds([*history, op(2, SET, 30, 5, 6), op(1, GET, 20, 11, 12)]) == [STALE_VALUE]
    # An invalidate running alongside the write may have come after it.
    assert kinds([*history[:1], op(1, INVALIDATE, None, 2, 7), history[2],
                  op(2, SET, 30, 5, 6), op(1, GET, 20, 11, 12)]) == []  # fmt: skip


def test_an_increment_while_an_add_ran_does_not_hide_the_adds_value() -> None:
    # An incr of a value invalidate() marked stale leaves it stale: get_or_set then wins
    # its lease and replaces it, after the increment.
    assert kinds([op(0, SET, 10, 0, 1), op(1, INVALIDATE, None, 2, 3), op(0, ADD, 20, 4, 10),
                  op(2, INCR, 11, 5, 6), op(1, GET, 20, 11, 12)]) == []  # fmt: skip


def test_an_outage_the_workers_found_is_a_loss_like_an_injected_one() -> None:
    # The soak's case: a node judged out under load, outside any injected fault. A set that
    # memcached acknowledged (its disk copy still queued) while an add was journaled; the
    # add took, and its value was read after.
    rows = [
        (ADD, 10, 0, 10, JOURNALED),
        (SET, 20, 2, 3, MEMCACHED),
        (GET, 10, 11, 12, MEMCACHED),
        (GET, 10, 1, 2, FALLBACK),  # a read from disk alone shows no outage
    ]
    log = {name: array(code) for name, code in COLUMNS.items()}
    for kind, value, start, end, source in rows:
        for name, item in zip(
            COLUMNS, (WORKER_KINDS.index(kind), 0, value, start, end, 1, source), strict=True
        ):
            log[name].append(item)
    history = History([log], ["k"])
    assert history.outages_seen() == [(0, 10.0)]
    assert [v.kind for v in history.check()] == [STALE_VALUE]
    assert history.check(history.outages_seen()) == []
