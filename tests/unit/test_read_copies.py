"""The copies a disk tier keeps of the entries it read (django_fastcache.disk.readcopies)."""

from __future__ import annotations

from django_fastcache.disk.readcopies import OVERHEAD, ReadCopies
from django_fastcache.disk.store import Fields


def entry(data: bytes, stamp: int) -> Fields:
    return (data, 0, 1000.0, None, stamp)


def test_a_copy_answers_only_for_the_stamp_it_was_written_under() -> None:
    copies = ReadCopies(1 << 20)
    copies.keep(b"k", entry(b"v", 7))
    assert copies.get(b"k", 7) == entry(b"v", 7)
    assert copies.get(b"k", 9) is None  # the slot moved on: a newer write, or a delete
    assert copies.get(b"other", 7) is None


def test_a_newer_copy_of_a_key_replaces_the_older_and_its_size() -> None:
    copies = ReadCopies(1 << 20)
    copies.keep(b"k", entry(b"v" * 100, 7))
    copies.keep(b"k", entry(b"w" * 10, 9))
    assert copies.get(b"k", 7) is None
    assert copies.get(b"k", 9) == entry(b"w" * 10, 9)
    assert len(copies) == 1
    assert copies.size == len(b"k") + 10 + OVERHEAD


def test_the_copies_stay_within_the_limit_by_starting_over() -> None:
    each = len(b"k0") + 100 + OVERHEAD
    copies = ReadCopies(10 * each)
    for n in range(10):
        copies.keep(b"k%d" % n, entry(b"v" * 100, n + 1))
    assert len(copies) == 10
    assert copies.size == 10 * each
    copies.keep(b"k10", entry(b"v" * 99, 11))  # one more would pass the limit
    assert len(copies) == 1
    assert copies.get(b"k10", 11) is not None
    assert copies.get(b"k0", 1) is None
    assert copies.size <= copies.limit


def test_an_entry_over_an_eighth_of_the_limit_is_not_copied() -> None:
    copies = ReadCopies(8000)
    copies.keep(b"big", entry(b"v" * 1000, 3))
    assert len(copies) == 0
    copies.keep(b"small", entry(b"v" * 100, 3))
    assert len(copies) == 1


def test_a_limit_of_zero_keeps_nothing() -> None:
    copies = ReadCopies(0)
    copies.keep(b"k", entry(b"", 5))
    assert copies.get(b"k", 5) is None
    assert len(copies) == 0
    assert copies.size == 0


def test_clear_drops_every_copy() -> None:
    copies = ReadCopies(1 << 20)
    copies.keep(b"k", entry(b"v", 5))
    copies.clear()
    assert copies.get(b"k", 5) is None
    assert copies.size == 0
