"""Values sealed with a keyed BLAKE2b tag, so that only values this site wrote are loaded.

Anyone who can reach memcached (it has no authentication by default) or write to the disk
tier's directory can put bytes under a key. Unpickling them would run their code in the
Django process. So every value the backend stores, except a raw integer, carries a tag
over the key, the flags and the bytes, keyed from ``SECRET_KEY`` (or the ``signing_key``
option); a value whose tag is missing or wrong, or that was moved from another key, is
refused before the serializer sees it: the read is a miss, counted and logged.

Raw integers stay unsealed: memcached's ``incr``/``decr`` rewrite them in place, and
reading one back runs no code (``int()``).

Wire format of a sealed value: the 16-byte tag, then the serializer's bytes; the flags get
:data:`FLAG_SEALED`. The tag's first byte is stored with its high bit set: memcached's
``incr``/``decr`` take any value that starts with digits (after blanks) as a number, and a
tag starting with a digit then a blank ("3\v...") would be counted, and the value lost,
where they must refuse it. A first byte of 0x80 or more starts no number. Tags stored before
(the high bit as the hash made it) still open: the bit is left out of the comparison. See
docs/security.md.
"""

from __future__ import annotations

import hmac
import logging
import time
from hashlib import blake2b
from typing import Final

from .serializers import FLAG_INTEGER, FLAG_LONG

#: Set in the flags of a sealed value (the serializer's own flags use the bits below it).
FLAG_SEALED: Final = 64
TAG_SIZE: Final = 16
#: Seconds between two warnings about refused values (each says how many there were).
WARN_INTERVAL = 10.0

# Separates this use of SECRET_KEY from every other (Django's signing, sessions...).
_PERSON: Final = b"fastcache-value"
_UNSEALED_OK: Final = (FLAG_INTEGER, FLAG_LONG)
# The serializer's flags (all below FLAG_SEALED) as tagged, made once.
_FLAG_FIELDS: Final = tuple(b" %d " % flags for flags in range(FLAG_SEALED))

_compare_digest: Final = hmac.compare_digest

logger = logging.getLogger("django_fastcache.values")


def derive_key(secret: str | bytes) -> bytes:
    """The 32-byte sealing key for a secret (``SECRET_KEY`` or ``signing_key``)."""
    raw = secret.encode("utf-8", "surrogatepass") if isinstance(secret, str) else secret
    return blake2b(raw, digest_size=32, person=_PERSON).digest()


def _tag_matches(data: bytes, expected: bytes) -> bool:
    """Whether the tag ``data`` starts with is ``expected``, the first byte's high bit left
    out (set when stored, or as the hash made it in tags stored before), in a time that
    does not depend on where they differ. (No copy of either tag with the bit set: those
    took about an eighth of a sealed get's instructions.)"""
    rest_matches = _compare_digest(data[1:TAG_SIZE], expected[1:])
    first_matches = not (data[0] ^ expected[0]) & 0x7F
    return rest_matches & first_matches


class Refusals:
    """Values refused by this process: counted, and warned about at most every
    :data:`WARN_INTERVAL` seconds (a flood of planted values must not flood the log)."""

    __slots__ = ("_last_warning", "count", "since_warning")

    def __init__(self) -> None:
        self.count = 0
        self.since_warning = 0
        self._last_warning = -WARN_INTERVAL

    def refuse(self, wire_key: bytes, why: str) -> None:
        self.count += 1
        self.since_warning += 1
        now = time.monotonic()
        if now - self._last_warning < WARN_INTERVAL:
            return
        logger.warning(
            "refused the cached value of %r: %s; read as a miss (%d refused since the last"
            " warning). See the security page of the docs.",
            wire_key.decode("utf-8", "replace"),
            why,
            self.since_warning,
        )
        self._last_warning = now
        self.since_warning = 0


class Sealer:
    """Seals values on the way out and opens them on the way in, for one key."""

    __slots__ = ("_fallbacks", "_mac", "refusals")

    def __init__(
        self, key: bytes, refusals: Refusals | None = None, fallbacks: tuple[bytes, ...] = ()
    ) -> None:
        """``fallbacks``: keys of secrets being rotated out (``SECRET_KEY_FALLBACKS``),
        whose seals are still opened; values are sealed with ``key`` alone."""
        # Copying a hasher that already holds the key skips keying it per value.
        self._mac = blake2b(key=key, digest_size=TAG_SIZE)
        self._fallbacks = [blake2b(key=k, digest_size=TAG_SIZE) for k in fallbacks]
        self.refusals = Refusals() if refusals is None else refusals

    @staticmethod
    def _tag(keyed: blake2b, wire_key: bytes, flags: int, data: bytes) -> bytes:
        """The tag of a value, by the hasher ``keyed`` with a sealing key."""
        mac = keyed.copy()
        # A key never holds a space: no (key, flags, value) can pass for another. (The
        # key and flags in one update, one call fewer; the value, maybe large, not copied.)
        mac.update(wire_key + _FLAG_FIELDS[flags])
        mac.update(data)
        return mac.digest()

    def seal(self, wire_key: bytes, data: bytes, flags: int) -> tuple[bytes, int]:
        """``(data, flags)`` as stored: tagged, unless a raw integer. ``flags`` are the
        serializer's, below :data:`FLAG_SEALED`."""
        if flags in _UNSEALED_OK:
            return data, flags
        tag = self._tag(self._mac, wire_key, flags, data)
        return b"%c%s%s" % (tag[0] | 0x80, tag[1:], data), flags | FLAG_SEALED

    def open(self, wire_key: bytes, data: bytes, flags: int) -> tuple[bytes, int] | None:
        """The serializer's ``(data, flags)`` of a value read back, or None when it must
        not be loaded (no tag, a wrong one, or another key's)."""
        if flags & FLAG_SEALED:
            flags ^= FLAG_SEALED
            payload = data[TAG_SIZE:]
            if len(data) >= TAG_SIZE and flags < FLAG_SEALED:
                if _tag_matches(data, self._tag(self._mac, wire_key, flags, payload)):
                    return payload, flags
                for fallback in self._fallbacks:  # (a rotation's older secrets)
                    if _tag_matches(data, self._tag(fallback, wire_key, flags, payload)):
                        return payload, flags
            self.refusals.refuse(
                wire_key,
                "its seal does not match (written with another secret, or for another key)",
            )
            return None
        # memcached pads a counter that got shorter with spaces ("10" decremented: "9 ").
        if flags in _UNSEALED_OK and data.rstrip(b" ").isdigit():
            return data, flags
        if not data and not flags:
            return None  # a get_or_set lease's stub (see stampede.py): a miss, not a refusal
        self.refusals.refuse(wire_key, f"it is not sealed (flags {flags})")
        return None


__all__ = ["FLAG_SEALED", "TAG_SIZE", "Refusals", "Sealer", "derive_key"]
