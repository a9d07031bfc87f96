"""Counters of 2**63 or more that memcached refuses by mistake, and their count made here.

memcached reads a counter with a helper that, for a number of 2**63 or more (negative as a
signed 64-bit number), looks for a minus sign with ``strchr`` from the value's first byte:
past the value's end, through whatever an earlier item left in the same slab chunk, up to
the first NUL byte. Where it meets a ``-`` there, ``incr``, ``decr`` and ``ma`` answer
``CLIENT_ERROR cannot increment or decrement non-numeric value`` for a perfectly good
counter (seen with memcached 1.6.18; the helper has not changed since). Whether they do
depends on what the memory held before, so the same counter counts at one moment and is
refused at the next.

A refusal of a value that memcached's own rules read as a number from 2**63 to 2**64 - 1
is this mistake and nothing else: the client then makes the count itself, by memcached's
rules (an increment wraps past 2**64 - 1, a decrement stops at 0), and stores it with the
item's flags and TTL only if the item did not change since it was read (its CAS): as
atomic as memcached's own count. That takes the meta protocol (``mg`` and ``ms``); without
it the refusal stands. This module is the sans-IO part: what to read, whether the value is
such a counter, and the store that counts it.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from ..expiry import memcached_exptime
from .meta import MetaReply, MetaStatus, meta_delete_command, meta_get_command, meta_set_command

#: The counters memcached may refuse by mistake: 2**63 to 2**64 - 1.
FIRST_MISREAD: Final = 2**63
_UINT64: Final = 2**64

# What memcached's strtoull() reads: blanks, an optional sign, digits; the next byte must
# be a blank or a NUL (the value's end is followed by "\r\n" in memcached's memory).
_NUMBER: Final = re.compile(rb"[ \t\n\v\f\r]*\+?([0-9]+)")
_ENDS_A_NUMBER: Final = frozenset(b" \t\n\v\f\r\0")

#: How many times a count made here may find the item changed (a write landing between
#: its read and its store) before the refusal is raised: each time the command is sent
#: again, and memcached counts it, refuses it again, or it changes again.
RECOUNT_TRIES: Final = 5


class Recount(NamedTuple):
    """A refused count made here: ``value`` the new value, ``ttl`` the seconds left (-1:
    none), ``cas`` the stored item's CAS. ``value`` None: the item changed (or went) while
    it was counted, nothing was stored, and the caller sends its count again."""

    value: int | None
    ttl: int | None = None
    cas: int | None = None


def misread_counter(data: bytes) -> int | None:
    """The number a value holds when memcached may have refused to count it by mistake
    (memcached's rules read it as a number from 2**63 to 2**64 - 1, with no ``-`` before
    its first NUL byte); None for any other value, whose refusal is memcached's right."""
    if b"-" in data.split(b"\0", 1)[0]:
        return None  # memcached refuses it with any memory behind it
    found = _NUMBER.match(data)
    if found is None:
        return None
    end = found.end()
    if end < len(data) and data[end] not in _ENDS_A_NUMBER:
        return None
    number = int(found.group(1))
    return number if FIRST_MISREAD <= number < _UINT64 else None


def counted_by_memcacheds_rules(number: int, delta: int) -> int:
    """``number`` plus ``delta`` (negative: minus) as memcached counts: an increment wraps
    past 2**64 - 1, a decrement stops at 0."""
    return max(0, number + delta) if delta < 0 else (number + delta) % _UINT64


def recount_read_command(key: bytes, base64_key: bool = False) -> bytes:
    """The read before a count made here: value, CAS, flags and TTL left."""
    return meta_get_command(
        key, value=True, cas=True, client_flags=True, ttl=True, base64_key=base64_key
    )


def recount_store(
    key: bytes, read: MetaReply, delta: int, now: float, base64_key: bool = False
) -> tuple[bytes, int, int] | None:
    """The ``ms`` that stores the count of ``key`` by ``delta`` made here, from the reply
    to :func:`recount_read_command` (a hit) read at ``now`` (Unix time), with the new value
    and the TTL it keeps: ``(command, value, seconds left or -1)``. None when memcached's
    refusal stands: the value is not a counter memcached misreads (a stub of a lease, a
    stale item, text, a number beyond 2**64 - 1)."""
    if read.value is None or read.cas is None or read.stale:
        return None
    number = misread_counter(read.value)
    if number is None:
        return None
    value = counted_by_memcacheds_rules(number, delta)
    # The TTL left as memcached's exptime: beyond 30 days it wants a Unix time. (A live
    # item has a second left at least.)
    ttl = -1 if read.ttl is None or read.ttl < 0 else max(read.ttl, 1)
    command = meta_set_command(
        key,
        b"%d" % value,
        client_flags=read.client_flags or 0,
        ttl=None if ttl < 0 else memcached_exptime(ttl, now),
        compare_cas=read.cas,
        return_cas=True,
        base64_key=base64_key,
    )
    return command, value, ttl


def give_back_command(key: bytes, read: MetaReply, base64_key: bool = False) -> bytes | None:
    """What hands back the win a read took (``mg`` on a stale item gives the first reader
    the right to recompute it, which is a ``get_or_set``'s to take): the item marked stale
    again (``md … I C<cas>``: a new CAS, and the next reader wins). None when the read took
    no win."""
    if not read.win or read.cas is None:
        return None
    return meta_delete_command(key, compare_cas=read.cas, invalidate=True, base64_key=base64_key)


def recounted(stored: MetaReply, value: int, ttl: int) -> Recount:
    """What the reply to :func:`recount_store`'s ``ms`` says: counted (HD), or the item
    changed or went meanwhile (EX, NF, NS): count again."""
    if stored.status is MetaStatus.HD:
        return Recount(value, ttl, stored.cas)
    return Recount(None)


__all__ = [
    "FIRST_MISREAD",
    "RECOUNT_TRIES",
    "Recount",
    "counted_by_memcacheds_rules",
    "give_back_command",
    "misread_counter",
    "recount_read_command",
    "recount_store",
    "recounted",
]
