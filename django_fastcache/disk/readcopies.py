"""Copies of the disk entries this process read lately, kept in its memory.

A disk entry is written once under its write stamp and never changed under it: every
write and delete of a key gives the key's slot a new random stamp first (:mod:`.stamps`),
and an entry answers only while the stamp it was written under is still its slot's. So a
copy of an entry, kept with that stamp, may answer exactly when the entry itself may, and
the read then costs a dict lookup instead of a SQLite query. The tier checks a copy as it
checks an entry read from disk (the slot's stamp, then age, expiry and distrust), so a
copy answers where the entry would, with two exceptions: an entry the disk no longer
answers for another reason than its stamp (evicted to stay under the size limit, a read
that failed) may still answer from its copy, which is still the key's latest write on this
host; and a process on a new stamps anchor stamps another table, so the copies answer only
while the tier found its own anchor in place lately (``TieredStore._copies_hold``).

Bounded by ``limit`` bytes (values and keys, plus a fixed overhead per copy): when a new
copy would pass it, every copy is dropped and they gather again (the keys read most come
back first). An entry larger than an eighth of the limit is not copied. Compiled, a call
runs whole under the interpreter's lock; in pure Python, threads keeping copies at once
may miscount by a copy or two until the next drop.
"""

from __future__ import annotations

from typing import Final

from .store import Fields

#: Bytes of copies a process keeps by default (``disk_read_copies``).
LIMIT: Final = 4 * 1024**2
#: Bytes counted per copy on top of its key and value: the dict slot, the tuple and its
#: fields (a float, an int, the bytes objects' headers).
OVERHEAD: Final = 200


class ReadCopies:
    """The copies one disk tier's reads made in this process (shared by its threads)."""

    __slots__ = ("_copies", "_size", "limit")

    def __init__(self, limit: int) -> None:
        #: Bytes the copies may take; 0: none are kept.
        self.limit = limit
        self._copies: dict[bytes, Fields] = {}
        self._size = 0

    def get(self, key: bytes, stamp: int) -> Fields | None:
        """The copy of ``key``'s entry written under ``stamp``, if one is kept."""
        copy = self._copies.get(key)
        if copy is not None and copy[4] == stamp:
            return copy
        return None

    def keep(self, key: bytes, fields: Fields) -> None:
        """Keep a copy of ``key``'s entry as read from disk (its fields, stamp last)."""
        size = len(key) + len(fields[0]) + OVERHEAD
        if size > self.limit >> 3:
            return
        copies = self._copies
        replaced = copies.get(key)
        if replaced is not None:
            self._size -= len(key) + len(replaced[0]) + OVERHEAD
        if self._size + size > self.limit:
            copies.clear()
            self._size = 0
        copies[key] = fields
        self._size += size

    def clear(self) -> None:
        self._copies.clear()
        self._size = 0

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def size(self) -> int:
        """Bytes the copies count for now (as :attr:`limit` counts them)."""
        return self._size


__all__ = ["LIMIT", "OVERHEAD", "ReadCopies"]
