"""Seconds to live as memcached's exptime: rounding, the 30-day line and its cap."""

from __future__ import annotations

import pytest

from django_fastcache.expiry import (
    MAX_EXPTIME,
    MAX_RELATIVE_EXPIRY,
    memcached_exptime,
    seconds_to_live,
)

NOW = 1_800_000_000.25


@pytest.mark.parametrize(
    ("ttl", "exptime"),
    [
        (None, 0),  # forever
        (0.0, -1),  # already expired
        (-3.0, -1),
        (1e-9, 1),  # a fraction rounds up: "a while", not "gone"
        (0.5, 1),
        (1.0, 1),  # whole seconds stay as they are
        (1.000001, 2),
        (299.999, 300),
        (300.0, 300),
        (300, 300),  # an int, as a caller may pass
        (float(MAX_RELATIVE_EXPIRY), MAX_RELATIVE_EXPIRY),
    ],
)
def test_seconds_to_live_round_up_to_whole_seconds(ttl: float | None, exptime: int) -> None:
    result = memcached_exptime(ttl, NOW)
    assert result == exptime
    assert type(result) is int


def test_past_thirty_days_the_exptime_is_a_unix_time() -> None:
    ttl = MAX_RELATIVE_EXPIRY + 0.5
    assert memcached_exptime(ttl, NOW) == int(NOW) + MAX_RELATIVE_EXPIRY + 1


def test_an_absolute_exptime_is_capped_at_the_latest_memcached_holds() -> None:
    assert memcached_exptime(float(MAX_EXPTIME), NOW) == MAX_EXPTIME


def test_a_timeout_becomes_seconds_to_live() -> None:
    assert seconds_to_live(None, NOW) is None
    assert seconds_to_live(0, NOW) == 0.0
    assert seconds_to_live(-1, NOW) == 0.0
    assert seconds_to_live(2.5, NOW) == 2.5
    assert seconds_to_live(10**30, NOW) == MAX_EXPTIME - NOW
