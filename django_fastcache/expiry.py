"""Lifetimes: Django's timeouts, seconds to live, and memcached's exptime."""

from __future__ import annotations

#: memcached treats a relative expiry above 30 days as a Unix timestamp.
MAX_RELATIVE_EXPIRY = 60 * 60 * 24 * 30
#: memcached's expiry is a signed 32-bit number: the latest absolute time it can hold.
MAX_EXPTIME = 2**31 - 1


def seconds_to_live(timeout: float | None, now: float) -> float | None:
    """A Django timeout (already defaulted) as seconds to live: None forever, 0 gone."""
    if timeout is None:
        return None
    if timeout <= 0:
        return 0.0
    return float(min(timeout, MAX_EXPTIME - now))  # (min first: an int past float's range)


def memcached_exptime(ttl: float | None, now: float) -> int:
    """Seconds to live as memcached's exptime: 0 never expires, -1 is already expired.

    Fractions round up (half a second still means "a while"); beyond 30 days memcached
    wants an absolute time, capped at the latest it can hold."""
    if ttl is None:
        return 0
    if ttl <= 0:
        return -1
    # Rounded up by hand: compiled, math.ceil is a call into another library on every
    # tiered write.
    seconds = int(ttl)
    if seconds < ttl:
        seconds += 1
    if seconds > MAX_RELATIVE_EXPIRY:
        return min(int(now) + seconds, MAX_EXPTIME)
    return seconds
