"""Write stamps: which disk entry of a key is its latest, known to every process on the host.

The disk tier is written behind memcached (:mod:`.writebehind`): a write is acknowledged once
memcached has it, and its disk copy lands a little later. So that a disk entry older than
an acknowledged write or delete is never served, every write and delete first *stamps* its
key: it puts a new random 64-bit stamp in the key's slot of a table in shared memory (a
memory-mapped file in the disk tier's directory; a hash of the key picks one of about a
million slots). A disk entry carries the stamp it was written under, and it answers a read
only while that stamp is still its slot's. The writer behind lands a write only while its
stamp is still current, so one that was overtaken is skipped.

Properties the tier relies on:

* A stamp is a plain store to memory, no lock: the request path pays a hash and a store.
* Stamps are random and never 0, and the table starts zeroed, so an entry never matches a
  slot by accident (a torn or lost store only makes entries stop answering: a miss).
* A stamp's lowest bit says what stamped it: 1 a write of a value, 0 a delete (or a
  failure). No entry is ever written under a delete's stamp, so a slot whose stamp is a
  delete's (or 0) answers nothing without the disk being read: a miss on a deleted key
  costs no disk read.
* Keys sharing a slot hide each other's older entries: a collision costs a miss, never an
  old value.
* memcached orders a slot's writes by arrival, the stamps by when they were taken: a write
  or delete that finds, after memcached's reply, its slot stamped by another meanwhile
  stamps it gone rather than queueing its copy (the tier's ``_behind``).
* The table outlives processes (it is a file): a process killed with writes still queued
  leaves their stamps behind, so the older entries of those keys stay hidden (misses).
* A host restart may leave the file older than the values (its pages and SQLite's are
  written back independently), so the table is reset when the host's boot id changes:
  after a reboot every entry from before misses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import random
import zlib

#: Slots of the table: 2**20 (8 MiB), few enough collisions for a million live keys.
SLOT_BITS = 20
_SLOT_MASK = (1 << SLOT_BITS) - 1
#: Words before the slots: a magic word and the boot id the table was made under.
_HEADER_WORDS = 4
_WORD = 8
_SIZE = (_HEADER_WORDS + (1 << SLOT_BITS)) * _WORD
_MAGIC = 0x31_70_6D_61_74_73_63_66  # "fcstamp1", little-endian
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

# One generator for the process, seeded from the OS and again in every forked child, so
# that no two processes ever draw the same sequence (an application seeding ``random``
# itself does not reach it).
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)


def holds_value(stamp: int) -> bool:
    """Whether an entry may answer under ``stamp`` (a write's, not a delete's or 0)."""
    return bool(stamp & 1)


def slot_of(key: bytes) -> int:
    return _HEADER_WORDS + (zlib.crc32(key) & _SLOT_MASK)


def _boot_id() -> int:
    """This boot of the host as a number; 0 when the system does not say."""
    try:
        with open(_BOOT_ID, "rb") as file:
            return int(file.read().strip().replace(b"-", b"")[:16], 16)
    except (OSError, ValueError):
        return 0


class WriteStamps:
    """The host-wide table of write stamps in ``path`` (created when missing)."""

    def __init__(self, path: str) -> None:
        self.path = path
        #: False when the file could not be opened (a read-only or unusable directory): the
        #: table is then this process's own memory, and other processes do not see its
        #: stamps.
        self.shared = True
        table = self._open(path)
        if table is None:
            self.shared = False
            table = mmap.mmap(-1, _SIZE)
        self._map = table
        self._words = memoryview(table).cast("Q")
        #: Tables replaced by :meth:`reopen`, kept mapped: another thread may be between
        #: reading ``_words`` and writing to it.
        self._retired: list[mmap.mmap] = []

    def reopen(self) -> None:
        """Map the file at ``path`` again, once the directory was removed or replaced
        under this process: the processes using the directory's files stamp that file, and
        a write of this process stamped in the removed one would leave their older entries
        answering. (A write stamped in the old table while this runs is stamped gone in
        the new one when memcached answers it: its stamp is not the slot's any more.)"""
        table = self._open(self.path)
        shared = table is not None
        if table is None:
            table = mmap.mmap(-1, _SIZE)
        self._retired.append(self._map)
        self._map = table
        self._words = memoryview(table).cast("Q")
        self.shared = shared

    @staticmethod
    def _open(path: str) -> mmap.mmap | None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            # One process at a time sizes the file and checks its header.
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size < _SIZE:
                # Blocks allocated now, not on a first write to the mapping (a full disk
                # then would kill the process with SIGBUS).
                try:
                    os.posix_fallocate(fd, 0, _SIZE)
                except (AttributeError, OSError) as exc:
                    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                        raise
                    os.ftruncate(fd, _SIZE)
            table = mmap.mmap(fd, _SIZE)
            words = memoryview(table).cast("Q")
            boot = _boot_id()
            if words[0] != _MAGIC or words[1] != boot:
                # A new table, or one from before a reboot, whose stamps may be older than
                # the disk entries: forget them all (every entry then misses).
                table[_HEADER_WORDS * _WORD :] = bytes(_SIZE - _HEADER_WORDS * _WORD)
                words[1] = boot
                words[0] = _MAGIC
            words.release()
            return table
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def bump(self, key: bytes, gone: bool = False) -> int:
        """Give ``key``'s slot a new stamp (before the write is acknowledged); return it.
        ``gone``: the key is deleted (or its disk copy lost): a delete's stamp."""
        stamp = _random.getrandbits(64)
        stamp = (stamp & ~1) | 2 if gone else stamp | 1
        self._words[_HEADER_WORDS + (zlib.crc32(key) & _SLOT_MASK)] = stamp
        return stamp

    def current(self, key: bytes) -> int:
        """The stamp of ``key``'s slot now (0: never written)."""
        stamp: int = self._words[_HEADER_WORDS + (zlib.crc32(key) & _SLOT_MASK)]
        return stamp

    def reset(self) -> None:
        """Hide every disk entry (a whole-tier failure: nothing on disk may answer)."""
        self._map[_HEADER_WORDS * _WORD :] = bytes(_SIZE - _HEADER_WORDS * _WORD)
