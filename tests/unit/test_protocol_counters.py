"""The counters memcached refuses by mistake (protocol/counters.py): which values are such
counters, memcached's counting rules, and the store that makes a count in their place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_fastcache.protocol.counters import (
    counted_by_memcacheds_rules,
    give_back_command,
    misread_counter,
    recount_read_command,
    recount_store,
    recounted,
)
from django_fastcache.protocol.meta import MetaReply, MetaStatus

U64 = 2**64
NOW = 1_800_000_000.5  # a Unix time


@pytest.mark.parametrize(
    ("data", "number"),
    [
        (b"9223372036854775808", 2**63),
        (b"18446744073709551615", U64 - 1),
        (b"9223372036854775808     ", 2**63),  # padded by memcached's own in-place count
        (b"  +9223372036854775809", 2**63 + 1),  # strtoull's blanks and sign
        (b"9223372036854775808 and words", 2**63),  # memcached reads up to the blank
        (b"9223372036854775808\0-", 2**63),  # the search for '-' stops at a NUL
    ],
)
def test_a_number_memcached_may_misread_is_recognised(data: bytes, number: int) -> None:
    assert misread_counter(data) == number


@pytest.mark.parametrize(
    "data",
    [
        b"9223372036854775807",  # below 2**63: memcached never misreads it
        b"5",
        b"18446744073709551616",  # beyond 2**64 - 1: refused by right
        b"-9223372036854775808",  # a sign memcached refuses
        b"9223372036854775808 -",  # a '-' in the value itself
        b"9223372036854775808x",  # not followed by a blank
        b"",  # a lease's stub
        b"x9223372036854775808",
        b"\x80sealed",
    ],
)
def test_any_other_value_keeps_its_refusal(data: bytes) -> None:
    assert misread_counter(data) is None


@pytest.mark.parametrize(
    ("number", "delta", "result"),
    [
        (U64 - 1, 3, 2),  # an increment wraps
        (2**63, -(2**63) - 5, 0),  # a decrement stops at 0
        (2**63, 1, 2**63 + 1),
        (2**63, -1, 2**63 - 1),
    ],
)
def test_the_count_follows_memcacheds_rules(number: int, delta: int, result: int) -> None:
    assert counted_by_memcacheds_rules(number, delta) == result


@given(st.integers(0, U64 - 1), st.integers(-(U64 - 1), U64 - 1))
def test_a_count_stays_within_memcacheds_range(number: int, delta: int) -> None:
    assert 0 <= counted_by_memcacheds_rules(number, delta) < U64


def test_the_read_asks_for_value_cas_flags_and_ttl() -> None:
    assert recount_read_command(b"k") == b"mg k v c f t\r\n"


def test_the_store_keeps_flags_and_ttl_and_needs_the_cas_read() -> None:
    read = MetaReply(MetaStatus.VA, b"18446744073709551615", cas=41, client_flags=2, ttl=300)
    store = recount_store(b"k", read, 3, NOW)
    assert store is not None
    command, value, ttl = store
    assert (value, ttl) == (2, 300)
    line, data = command.split(b"\r\n")[:2]
    assert set(line.split()) == {b"ms", b"k", b"1", b"F2", b"T300", b"C41", b"c"}
    assert data == b"2"


def test_a_counter_without_expiry_is_stored_without_one() -> None:
    read = MetaReply(MetaStatus.VA, b"9223372036854775808", cas=7, client_flags=0, ttl=-1)
    store = recount_store(b"k", read, 1, NOW)
    assert store is not None
    command, value, ttl = store
    assert (value, ttl) == (2**63 + 1, -1)
    assert not any(token.startswith(b"T") for token in command.split(b"\r\n")[0].split())


def test_a_ttl_beyond_30_days_is_stored_as_the_unix_time_it_ends() -> None:
    # memcached takes an exptime above 30 days for a Unix time: a TTL sent as it is would
    # name a moment long past, and the counter would expire at once.
    sixty_days = 60 * 86400
    read = MetaReply(MetaStatus.VA, b"9223372036854775808", cas=7, client_flags=0, ttl=sixty_days)
    store = recount_store(b"k", read, 1, NOW)
    assert store is not None
    assert store[2] == sixty_days
    assert b" T%d" % (int(NOW) + sixty_days) in store[0]


def test_a_won_read_is_handed_back_and_any_other_is_not() -> None:
    stale = MetaReply(MetaStatus.VA, b"text", cas=12, stale=True, win=True)
    command = give_back_command(b"k", stale)
    assert command is not None
    assert set(command.split()) == {b"md", b"k", b"I", b"C12"}
    assert give_back_command(b"k", stale._replace(win=False)) is None


@pytest.mark.parametrize(
    "read",
    [
        MetaReply(MetaStatus.VA, b"5", cas=7, client_flags=0, ttl=-1),  # memcached's right
        MetaReply(MetaStatus.VA, b"", cas=7, client_flags=0, ttl=30, won_elsewhere=True),
        MetaReply(MetaStatus.VA, b"9223372036854775808", cas=7, ttl=-1, stale=True),
        MetaReply(MetaStatus.VA, b"9223372036854775808", cas=None, ttl=-1),
    ],
)
def test_no_store_when_the_refusal_stands(read: MetaReply) -> None:
    assert recount_store(b"k", read, 1, NOW) is None


def test_only_a_stored_count_counts() -> None:
    assert recounted(MetaReply(MetaStatus.HD, cas=9), 5, 300) == (5, 300, 9)
    for status in (MetaStatus.EX, MetaStatus.NF, MetaStatus.NS):
        assert recounted(MetaReply(status), 5, 300).value is None
