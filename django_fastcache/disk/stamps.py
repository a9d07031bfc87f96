"""Write stamps: which disk entry of a key is its latest, known to every process on the host.

The disk tier is written behind memcached (:mod:`.writebehind`): a write is acknowledged once
memcached has it, and its disk copy lands a little later. So that a disk entry older than
an acknowledged write or delete is never served, every write and delete first *stamps* its
key: it puts a new 62-bit stamp, random but for its lowest bits, in the key's slot of a
table in shared memory (a hash of the key picks one of about a million slots). A disk entry
carries the stamp it was written under, and it answers a read only while that stamp is
still its slot's. The writer behind lands a write only while its stamp is still current, so
one that was overtaken is skipped.

Properties the tier relies on:

* A stamp is a plain store to memory, no lock: the request path pays a hash and a store.
* Stamps are random and never 0, and a table starts zeroed, so an entry never matches a
  slot by accident (a torn or lost store, or a new table, only makes entries stop
  answering: a miss).
* A stamp's lowest bit says what stamped it: 1 a write of a value, 0 a delete (or a
  failure). No entry is ever written under a delete's stamp, so a slot whose stamp is a
  delete's (or 0) answers nothing without the disk being read: a miss on a deleted key
  costs no disk read.
* Keys sharing a slot hide each other's older entries: a collision costs a miss, never an
  old value.
* memcached orders a slot's writes by arrival, the stamps by when they were taken: a write
  or delete that finds, after memcached's reply, its slot stamped by another meanwhile
  stamps it gone rather than queueing its copy (the tier's ``_behind``).
* The table outlives processes: a process killed with writes still queued leaves their
  stamps behind, so the older entries of those keys stay hidden (misses).

Where the table lives. Every process of a tier directory must stamp the same table: one
stamping another table would leave the entries it overtakes answering the others (an old
value). The directory holds a one-page *anchor* (``stamps.anchor``), mapped by every
process, that names the table: a random table id, where it lives, and the boot it was made
in. The table itself (8 MiB) is preferably a file in ``/dev/shm``: tmpfs pages are never
written back, so a stamp never takes the write fault (journal handle, mtime update, at
times over a millisecond) a store to a written-back page of a file on disk takes. Every
:meth:`WriteStamps.bump` and :meth:`WriteStamps.current` first compares the anchor's id,
and the id in the header of the table it maps, with that table's (two memory reads), and
follows a new table before going on.

* A reboot may leave the directory's files older than the values (their pages and SQLite's
  are written back independently), so an anchor from another boot (Linux's ``boot_id``)
  gets a new, zeroed table: every entry from before the reboot misses. On systems without
  a boot id the table is kept.
* A table named by the anchor that is gone or not ours (systemd-logind removes a user's
  ``/dev/shm`` files with ``RemoveIPC=yes`` when the user's last session ends; an admin; a
  process seeing another ``/dev/shm``, as containers sharing the directory can) is
  replaced by a new one, with a warning: entries written before miss. The new one is a
  file in the directory, and stays there until the next boot: processes that see different
  ``/dev/shm`` then all meet at the directory's file instead of taking turns replacing
  each other's tables. Without a usable ``/dev/shm`` (missing, full, or the user's
  directory in it not private) the table is a file in the directory from the start.
* The anchor is written only when a table is made: the maintenance thread touches it (and
  the table) once a minute, so that an age-based temp cleaner leaves it alone. One removed
  all the same under running processes (the next process then makes another) is found by
  the check of the files (:meth:`WriteStamps.replaced`: a call's, once its process's last
  check is 0.1 s old, and the maintenance thread's, every second), which moves
  the process to the directory's anchor; the first to move zeroes the id in the anchor it
  left, so that the others still on it follow at their next call. Sooner: the process that
  makes the new table *retires* the tables made in its mount namespace that name the same
  anchor path (in SHM_ROOT and in the directory): it zeroes the id in their header, which
  every stamp and read compares too, and removes them, so the processes on them follow at
  their next call. A table it cannot retire (removed with its directory where there is no
  usable ``/dev/shm``; made in another mount namespace, or for the directory reached by
  another path; its maker killed between naming the new table and retiring) is left to
  the check of the files: until the first of its processes moves, a process started since
  stamps another table (the window of a directory deleted and made again,
  docs/disk-tier.md).
* Every process of the directory stamps the table the anchor names, or stamps nothing:
  one that can neither open nor make it cannot build the tier (OSError), and a running one
  that cannot follow it now (out of descriptors), or cannot open the anchor that replaced
  its own, tries again every :data:`RETRY_INTERVAL` and meanwhile answers no read from
  disk (``current`` says 0) and refuses writes (:class:`StampsUnavailable` from ``bump``).
* Each table pins its 8 MiB of memory while it exists, and while a process that left it
  still runs (it stays mapped there); a directory removed with its anchor leaves its table
  behind: whoever makes a table in ``/dev/shm`` also removes the tables there neither made
  nor touched for :data:`SWEEP_AGE` seconds that no anchor names any more.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import mmap
import os
import random
import stat
import struct
import threading
import time
import weakref
import zlib
from typing import Final

from .._mypyc import mypyc_attr
from ..handles import Handle
from ..logs import logger
from .store import DiskError

#: Where the tables go when it is usable: a private directory per user under it.
SHM_ROOT = "/dev/shm"
#: Seconds since a table in SHM_ROOT was last made or touched before a sweep may remove
#: it: every process using a table touches it once a minute (its maintenance thread), so a
#: table named by a path that no longer resolves (a directory renamed, or reached by
#: another path in a container) is kept while it is in use.
SWEEP_AGE = 600.0
#: Seconds between two tries to follow the anchor's table, while it cannot be opened.
RETRY_INTERVAL = 0.05
#: Slots of the table: 2**20 (8 MiB), few enough collisions for a million live keys.
SLOT_BITS: Final = 20
_SLOT_MASK: Final = (1 << SLOT_BITS) - 1
_WORD: Final = 8
_PAGE: Final = mmap.PAGESIZE
#: Words before the slots: the table's header page (magic, id, its anchor's path).
_HEADER_WORDS: Final = _PAGE // _WORD
_SIZE: Final = _PAGE + (1 << SLOT_BITS) * _WORD
_TABLE_MAGIC: Final = 0x32_70_6D_61_74_73_63_66  # "fcstamp2", little-endian
_ANCHOR_MAGIC: Final = 0x31_72_63_6E_61_73_63_66  # "fcsanch1", little-endian
#: The anchor's words. (``Final``, here and below: compiled, a constant is read where it
#: is used, not looked up in the module's namespace.)
_A_MAGIC: Final = 0
_A_BOOT: Final = 1
_A_ID: Final = 2
_A_MODE: Final = 3
#: Where the table lives: a file in SHM_ROOT, or a file in the tier's directory.
SHM: Final = 1
FILE: Final = 2
#: A table's header: magic, id, length of the anchor's path (its bytes follow).
_HEADER: Final = struct.Struct("=QQQ")
#: The word of a table's id in its header: every stamp and read compares it with the id
#: the process mapped, as it does the anchor's. A process that makes a table zeroes it in
#: the other tables naming the same anchor path, which the directory's new anchor no longer
#: names: a process still on one (its anchor or whole directory removed) follows at its
#: next stamp or read, not at its next check of the files.
_T_ID: Final = 1
#: The word, last of the header page, holding the mount namespace a table was made in (the
#: inode of ``/proc/self/ns/mnt``; 0 where unknown). A path names one directory only within
#: one mount namespace: processes of two sites in namespaces of their own (containers,
#: systemd's PrivateTmp) may have directories at one path and share ``/dev/shm``, so a
#: table is retired only by a process of the namespace it was made in.
_T_NAMESPACE: Final = _HEADER_WORDS - 1
_NAMESPACE_AT: Final = _T_NAMESPACE * _WORD
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: The previous format's table, in the directory itself.
_OLD_TABLE = "stamps.state"
_MAP_FLAGS: Final = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)

# One generator for the process, seeded from the OS and again in every forked child, so
# that no two processes ever draw the same sequence (an application seeding ``random``
# itself does not reach it).
_random: Final = random.Random()
os.register_at_fork(after_in_child=_random.seed)
_random_bits: Final = _random.getrandbits
_crc32: Final = zlib.crc32
#: Bits of a stamp and of a table's id. Not 64: compiled, an int of up to 62 bits is a
#: machine integer, a wider one a Python object, made and compared through the
#: interpreter's calls on every write (about 1,500 instructions of a tiered set). A table
#: stores any width, so processes drawing 64-bit stamps can share it.
STAMP_BITS: Final = 62


def holds_value(stamp: int) -> bool:
    """Whether an entry may answer under ``stamp`` (a write's, not a delete's or 0)."""
    return bool(stamp & 1)


def slot_of(key: bytes) -> int:
    return _HEADER_WORDS + (_crc32(key) & _SLOT_MASK)


def _boot_id() -> int:
    """This boot of the host as a number; 0 when the system does not say."""
    try:
        with open(_BOOT_ID, "rb") as file:
            return int(file.read().strip().replace(b"-", b"")[:16], 16)
    except (OSError, ValueError):
        return 0


class StampsUnavailable(DiskError):
    """This process cannot stamp the table the directory's processes use now (out of
    descriptors or memory while following a new one): a write would not hide their older
    disk entries, so it is refused."""


def shm_directory(shm_root: str = SHM_ROOT) -> str:
    """This user's directory of tables under ``shm_root``."""
    return os.path.join(shm_root, f"django-fastcache-{os.getuid()}")


def _usable_shm_directory(shm_root: str) -> str | None:
    """This user's directory under ``shm_root``, made if need be; None unless it is a
    real directory only this user can enter (a table in it must not be another's)."""
    directory = shm_directory(shm_root)
    try:
        if not os.path.isdir(shm_root):
            return None
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        info = os.lstat(directory)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        logger.debug("write stamps: %s is not a private directory; table on disk", directory)
        return None
    return directory


def _is_ours(fd: int, size: int | None = None) -> bool:
    info = os.fstat(fd)
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.getuid()
        and (size is None or info.st_size == size)
    )


def table_anchor(path: str) -> tuple[int, str] | None:
    """The id and anchor path in the header of the table at ``path``; None when the file
    holds no table's header. OSError when it cannot be read or is not this user's file."""
    found = table_header(path)
    return None if found is None else (found[0], found[1])


def table_header(path: str) -> tuple[int, str, int] | None:
    """:func:`table_anchor`, and the mount namespace the table was made in (0: unknown)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not _is_ours(fd):
            raise OSError(errno.EPERM, "not a file of this user", path)
        header = os.pread(fd, _PAGE, 0)  # (not the size: a read past the end is short)
    finally:
        os.close(fd)
    if len(header) < _HEADER.size:
        return None
    magic, ident, length = _HEADER.unpack_from(header)
    if magic != _TABLE_MAGIC or length > len(header) - _HEADER.size:
        return None
    namespace = 0
    if len(header) == _PAGE and _HEADER.size + length <= _NAMESPACE_AT:
        namespace = struct.unpack_from("=Q", header, _NAMESPACE_AT)[0]
    return ident, os.fsdecode(header[_HEADER.size : _HEADER.size + length]), namespace


def mount_namespace() -> int:
    """This process's mount namespace (the inode of ``/proc/self/ns/mnt``); 0 where the
    system does not say."""
    try:
        return os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return 0


def _named(ident: int, anchor: str) -> bool:
    """Whether the anchor at ``anchor`` names table ``ident`` (its word, read from the
    file: it may be short or not an anchor at all)."""
    try:
        fd = os.open(anchor, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        word = os.pread(fd, _WORD, _A_ID * _WORD)
    finally:
        os.close(fd)
    return len(word) == _WORD and struct.unpack("=Q", word)[0] == ident


def sweep(directory: str, keep: str) -> None:
    """Remove the tables in ``directory`` (but ``keep``) neither made nor touched for
    :data:`SWEEP_AGE` seconds that no anchor names any more, or that never got a header (a
    creation cut short): each pins its memory while it exists. The directory is this
    user's alone, so nothing else lives there. Errors leave a table in place."""
    cutoff = time.time() - SWEEP_AGE
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not entry.name.endswith(".stamps") or entry.path == keep:
            continue
        try:
            # (Modification time: set when the table is made, and by every touch.)
            if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            found = table_anchor(entry.path)
            if found is None or not _named(*found):
                os.unlink(entry.path)
        except OSError:
            continue


def _allocate(fd: int, size: int, *, strict: bool) -> None:
    """Blocks (tmpfs: pages) allocated now, not on a first store to the mapping: a full
    disk or /dev/shm then would kill the process with SIGBUS. ``strict``: nothing else
    will do (else a file system that cannot preallocate gets a plain size)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except (AttributeError, OSError) as exc:  # AttributeError: no posix_fallocate here
        if strict or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
            raise OSError(getattr(exc, "errno", errno.EOPNOTSUPP), str(exc)) from exc
        os.ftruncate(fd, size)


#: How many tries in all an opener makes at locking the file at the anchor's path while
#: it is replaced under it (each time by another process making the directory's table:
#: rare); and how many times a clear zeroes a table retired while it zeroed it.
_OPEN_ATTEMPTS = 5


def _still_at(fd: int, path: str) -> bool:
    """Whether the file open at ``fd`` is still the one at ``path``."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    opened = os.fstat(fd)
    return (info.st_dev, info.st_ino) == (opened.st_dev, opened.st_ino)


def _retire(path: str) -> None:
    """Zero the id in the header of the table at ``path`` and remove it (no anchor names
    it any more): a process still stamping it then finds its table's id changed at its next
    stamp or read, and follows the anchor at its path. A table that cannot be opened (not
    this user's) is only removed; errors are ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if _is_ours(fd, _SIZE):
                os.pwrite(fd, bytes(_WORD), _T_ID * _WORD)
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(path)  # (named by no anchor now, whether or not it could be zeroed)


def _retire_tables_of(directory: str, anchor: str, keep: str, namespace: int) -> None:
    """:func:`_retire` the tables in ``directory`` (but ``keep``) made in mount namespace
    ``namespace`` whose header names the anchor at path ``anchor``, which names another
    table now. Called by the process that made that table, under the anchor's lock."""
    if not namespace:
        return  # (tables of another namespace cannot be told apart)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.path == keep or not entry.name.endswith((".stamps", ".table")):
            continue
        try:
            found = table_header(entry.path)
        except OSError:
            continue
        if found is not None and found[0] != 0 and found[1:] == (anchor, namespace):
            logger.debug("write stamps: %s retired (its anchor was replaced)", entry.path)
            _retire(entry.path)


def _create_table(path: str, ident: int, anchor: str, *, strict: bool) -> mmap.mmap:
    """A new zeroed table at ``path`` (OSError when it cannot be made; nothing is left)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _allocate(fd, _SIZE, strict=strict)
        table = mmap.mmap(fd, _SIZE, flags=_MAP_FLAGS)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    name = os.fsencode(anchor)
    table[_HEADER.size : _HEADER.size + len(name)] = name
    if _HEADER.size + len(name) <= _NAMESPACE_AT:
        struct.pack_into("=Q", table, _NAMESPACE_AT, mount_namespace())
    _HEADER.pack_into(table, 0, _TABLE_MAGIC, ident, len(name))
    return table


def _open_table(path: str, ident: int) -> tuple[mmap.mmap | None, str]:
    """The table at ``path`` if it is ``ident``'s; else None and why it is gone (missing,
    another user's or not a file, another table's header). Any other failure (out of
    descriptors or memory) raises OSError: the table may well be there, and must not be
    replaced for it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None, "no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "a symbolic link"
        raise
    try:
        if not _is_ours(fd, _SIZE):
            return None, "not a table of this user"
        table = mmap.mmap(fd, _SIZE, flags=_MAP_FLAGS)
    finally:
        os.close(fd)
    magic, found, _length = _HEADER.unpack_from(table)
    if magic != _TABLE_MAGIC or found != ident:
        table.close()
        return None, "another table's header"
    return table, ""


def _new_id() -> int:
    return _random.getrandbits(STAMP_BITS) or 1


class _Opened:
    """What a process maps of a directory's stamps: the anchor, and the table it names."""

    def __init__(
        self,
        anchor: mmap.mmap,
        table: mmap.mmap,
        ident: int,
        mode: int,
        path: str,
        identity: tuple[int, int] | None = None,
    ):
        self.anchor = anchor
        self.table = table
        self.ident = ident
        self.mode = mode
        self.path = path
        #: (device, inode) of the anchor file.
        self.identity = identity


# Tests twin it (tests/twins.py): a subclass of theirs replaces some methods.
@mypyc_attr(allow_interpreted_subclasses=True)
class WriteStamps:
    """The host-wide table of write stamps named by the anchor at ``path`` (made when
    missing); a new table goes in ``shm_root`` when that is usable.

    OSError when neither the anchor nor a table can be opened or made (a full disk, a file
    of another user): a process whose writes stamped a table of its own would leave the
    other processes' older entries answering, so it must not run with the tier."""

    def __init__(self, path: str, *, shm_root: str = SHM_ROOT) -> None:
        self.path = path
        self.shm_root = shm_root
        #: Tables (and anchors) replaced, kept mapped: another thread may be between
        #: reading ``_words`` and storing to it.
        self._retired: list[mmap.mmap] = []
        #: The lock of a move to another table, in a holder the fork hook reaches.
        self._guard = Handle(threading.Lock())
        _guards.add(self._guard)
        #: ``time.monotonic()`` of the latest warning that the anchor's table could not be
        #: followed, and from when to try again.
        self._warned = -math.inf
        self._retry_at = -math.inf
        try:
            opened = self._open()
        except OSError as exc:
            fix = (
                "keep temp cleaners and deploys from removing files in the directory"
                if exc.errno == errno.EAGAIN
                else "free space in the directory (or /dev/shm), check that its files are "
                "this user's and the process's descriptor limit"
            )
            raise OSError(
                exc.errno,
                f"the disk tier's write stamps (anchor {path}) could not be opened or made: "
                f"{exc.strerror or exc}; every process sharing the directory must stamp one "
                f"table. Fix: {fix}, or set disk_tier to False",
            ) from exc
        self._install(opened)

    # -- the per-call check -----------------------------------------------------------------
    def bump(self, key: bytes, gone: bool = False) -> int:
        """Give ``key``'s slot a new stamp (before the write is acknowledged); return it.
        ``gone``: the key is deleted (or its disk copy lost): a delete's stamp.
        :class:`StampsUnavailable` when the anchor's table cannot be followed now."""
        return self.bump_slot(slot_of(key), gone)

    def current(self, key: bytes) -> int:
        """The stamp of ``key``'s slot now (0: never written, or the anchor's table cannot
        be followed: nothing on disk answers then)."""
        return self.current_slot(slot_of(key))

    # A call that reads and stamps one key's slot several times finds the slot once (the
    # checksum is most of a look's cost) and passes it to these. A slot is the same in
    # every table, so one found before a move to another table is still the key's after.
    def bump_slot(self, slot: int, gone: bool = False) -> int:
        """:meth:`bump` of the slot :func:`slot_of` gave (a word's index in the table, its
        header's words counted: no other number may be passed)."""
        if (
            self._anchor[_A_ID] != self._id or self._words[_T_ID] != self._id
        ) and not self._follow():
            raise self._unavailable()
        stamp = _random_bits(STAMP_BITS)
        stamp = (stamp & ~1) | 2 if gone else stamp | 1
        self._words[slot] = stamp
        return stamp

    def replace_slot(self, slot: int, gone: bool = False) -> tuple[int, int]:
        """:meth:`bump_slot`, returning the stamp it replaced too: (before, new). For a
        call that reads the slot's stamp just before stamping it (a delete, which answers
        from the entry under the stamp before), with one check of the anchor for both."""
        if (
            self._anchor[_A_ID] != self._id or self._words[_T_ID] != self._id
        ) and not self._follow():
            raise self._unavailable()
        before: int = self._words[slot]
        stamp = _random_bits(STAMP_BITS)
        stamp = (stamp & ~1) | 2 if gone else stamp | 1
        self._words[slot] = stamp
        return before, stamp

    def current_slot(self, slot: int) -> int:
        """:meth:`current` of the slot :func:`slot_of` gave (as for :meth:`bump_slot`)."""
        if (
            self._anchor[_A_ID] != self._id or self._words[_T_ID] != self._id
        ) and not self._follow():
            return 0
        stamp: int = self._words[slot]
        return stamp

    def words_now(self) -> memoryview | None:
        """The table's words, indexed by :func:`slot_of`'s slots, once the checks of
        :meth:`current_slot` pass (None when the anchor's table cannot be followed now): for
        a reader of many slots at once that can take answers a moment old (the writer
        behind's sorting of a batch, whose landing checks each write again)."""
        if (
            self._anchor[_A_ID] != self._id or self._words[_T_ID] != self._id
        ) and not self._follow():
            return None
        return self._words

    def reset(self) -> None:
        """Hide every disk entry (a whole-tier failure, a clear: nothing on disk may
        answer)."""
        for _attempt in range(_OPEN_ATTEMPTS):
            if (
                self._anchor[_A_ID] != self._id or self._words[_T_ID] != self._id
            ) and not self._follow():
                break
            # The table zeroed and the ids checked after are one table's, whatever another
            # thread of the process installs meanwhile.
            ident, anchor, words = self._id, self._anchor, self._words
            words[_HEADER_WORDS:] = memoryview(bytes(_SIZE - _PAGE)).cast("Q")
            # Retired while it was zeroed: the table the others moved to holds the stamps
            # of entries written before this call, which must not answer either.
            if anchor[_A_ID] == ident and words[_T_ID] == ident:
                return
        raise self._unavailable()

    def _follow(self) -> bool:
        """The anchor names another table than the one mapped: map that one (a write
        stamped in the old table meanwhile is stamped gone in the new one when memcached
        answers it: its stamp is not the slot's there). False when it cannot be opened
        now: a call from RETRY_INTERVAL on tries again."""
        if time.monotonic() < self._retry_at:
            return False
        with self._guard.target:
            if self._anchor[_A_ID] == self._id and self._words[_T_ID] == self._id:
                return True  # another thread moved first
            return self._move()

    def _unavailable(self) -> StampsUnavailable:
        return StampsUnavailable(
            f"the disk tier's write stamps at {self.path} cannot follow the table the "
            "directory's processes use (see the warning logged); the write is refused"
        )

    def reopen(self) -> bool:
        """Map the anchor at ``path`` again, and the table it names, once the directory
        was removed or replaced under this process: the processes using the directory's
        files stamp that table, and a write of this process stamped in the removed one
        would leave their older entries answering. False when they cannot be opened now:
        the anchor mapped is then marked as naming no table, so that until a later call
        follows, reads from disk miss and writes are refused."""
        with self._guard.target:
            if self._move():
                return True
            self._anchor[_A_ID] = 0  # not the directory's any more: nothing follows it
            return False

    def replaced(self, unknown: bool = False) -> bool:
        """Whether the anchor this process mapped is no longer the one at ``path``: the
        directory was made again, or the anchor alone was removed (it is written only when
        a table is made, so an age-based temp cleaner may take it while the processes run,
        and the next process would make another table). One ``stat``; ``unknown`` is the
        answer when it fails otherwise (the maintenance thread does not move for a failed
        ``stat``; the tier's copies in memory do not answer after one)."""
        identity = self._identity
        if identity is None:
            return False
        try:
            info = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:
            return unknown  # cannot tell
        return (info.st_dev, info.st_ino) != identity

    def touch(self) -> None:
        """Mark the anchor and the table as in use (their modification time now): the
        anchor is written only when a table is made, and an age-based temp cleaner would
        otherwise take it while the processes run; a table touched lately is not swept. The
        maintenance thread calls this once a minute."""
        for path in (self.path, self.table_path):
            with contextlib.suppress(OSError):
                os.utime(path)

    # -- opening ----------------------------------------------------------------------------
    def _move(self) -> bool:
        left, left_identity = self._anchor, self._identity
        try:
            opened = self._open()
        except OSError as exc:
            # Out of descriptors or memory, say. The table mapped stays; reads from disk
            # miss and writes land nothing until a later call follows (``current`` says 0).
            now = time.monotonic()
            self._retry_at = now + RETRY_INTERVAL
            if now - self._warned >= 60.0:
                self._warned = now
                logger.warning(
                    "the disk tier's write stamps at %s could not be followed to the table "
                    "the directory's processes use (%s); until this process can, it answers "
                    "no read from disk and refuses writes (StampsUnavailable), which would "
                    "not hide the others' older disk entries",
                    self.path,
                    exc,
                )
            return False
        self._retired.extend([self._map, self._anchor_map])
        self._install(opened)
        if self._identity != left_identity:
            # The anchor left is no longer the directory's: the processes still on it
            # follow at their next stamp or read (its id 0 names no table), not at their
            # own check of the files.
            left[_A_ID] = 0
        return True

    def _install(self, opened: _Opened) -> None:
        # The table first: a thread passing the check against the old anchor then stores
        # to the new table, never the new id with the old table.
        self._map = opened.table
        self._words = memoryview(opened.table).cast("Q")
        self._anchor_map = opened.anchor
        self._anchor = memoryview(opened.anchor).cast("Q")
        self._id = opened.ident
        self._identity = opened.identity
        #: SHM or FILE, and the table's path.
        self.mode = opened.mode
        self.table_path = opened.path

    def _open(self) -> _Opened:
        """The anchor at ``path`` and the table it names (made if need be); OSError when
        they cannot be opened or made."""
        for _attempt in range(_OPEN_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                if not _is_ours(fd):
                    raise OSError(errno.EPERM, "not a regular file of this user")
                # One process at a time reads the anchor, makes a table and writes it.
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _still_at(fd, self.path):
                    return self._open_locked(fd)
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            # The anchor was removed (and perhaps made again) while this process waited for
            # its lock: one no longer at the path names a table the others have left, and
            # a table made for it would retire theirs. The one at the path now, then.
        raise OSError(errno.EAGAIN, f"the anchor at {self.path} kept being replaced while opened")

    def _open_locked(self, fd: int) -> _Opened:
        """:meth:`_open`'s work, the anchor ``fd`` open and locked."""
        if os.fstat(fd).st_size < _PAGE:
            _allocate(fd, _PAGE, strict=False)
        anchor = mmap.mmap(fd, _PAGE, flags=_MAP_FLAGS)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(os.path.dirname(self.path), _OLD_TABLE))
        try:
            opened = self._open_named(anchor)
        except BaseException:
            anchor.close()  # (at once: a failing follow is tried again and again)
            raise
        info = os.fstat(fd)
        opened.identity = (info.st_dev, info.st_ino)
        return opened

    def _table_path(self, mode: int, ident: int) -> str:
        if mode == SHM:
            return os.path.join(shm_directory(self.shm_root), f"{ident:016x}.stamps")
        return os.path.join(os.path.dirname(self.path), f"stamps-{ident:016x}.table")

    def _open_named(self, anchor: mmap.mmap) -> _Opened:
        """The table the anchor names, or a new one (the anchor's lock held)."""
        words = memoryview(anchor).cast("Q")
        magic, boot, ident, mode = words[_A_MAGIC], words[_A_BOOT], words[_A_ID], words[_A_MODE]
        words.release()
        this_boot = _boot_id()
        # (A boot id that cannot be read now, 0, keeps the table.)
        if (
            magic != _ANCHOR_MAGIC
            or ident == 0
            or mode not in (SHM, FILE)
            or (this_boot and boot != this_boot)
        ):
            # A new directory, or one from before a reboot, whose stamps may be older than
            # its entries: a new table (every entry then misses).
            previous = self._table_path(mode, ident) if magic == _ANCHOR_MAGIC and ident else ""
            wanted = SHM if _usable_shm_directory(self.shm_root) else FILE
            return self._make(anchor, this_boot, wanted, previous)
        path = self._table_path(mode, ident)
        if mode == SHM and _usable_shm_directory(self.shm_root) is None:
            table, why = None, "its directory is not private"
        else:
            table, why = _open_table(path, ident)
        if table is not None:
            return _Opened(anchor, table, ident, mode, path)
        logger.warning(
            "the disk tier's write stamps table %s (named by %s) cannot be used (%s): "
            "something removed it (systemd-logind with RemoveIPC=yes when the user's last "
            "session ends, a cleaner), or this process sees another /dev/shm than the "
            "process that made it. A new table in the directory replaces it, and disk "
            "entries written before miss. Fix: RemoveIPC=no in logind.conf or a system "
            "user for the service, and one /dev/shm for every process sharing the directory",
            path,
            self.path,
            why,
        )
        return self._make(anchor, this_boot, FILE, path)

    def _make(self, anchor: mmap.mmap, boot: int, mode: int, previous: str) -> _Opened:
        """A new table (in shm when ``mode`` says so and it can be made there), named by
        the anchor from now on; the table at ``previous`` removed."""
        ident = _new_id()
        name = os.path.abspath(self.path)
        table: mmap.mmap | None = None
        path = self._table_path(SHM, ident)
        if mode == SHM and _HEADER.size + len(os.fsencode(name)) <= _PAGE:
            try:
                table = _create_table(path, ident, name, strict=True)
            except OSError as exc:  # ENOSPC, EFBIG, EOPNOTSUPP...: the disk will do
                logger.debug("write stamps: no table in %s (%s); table on disk", path, exc)
        if table is None:
            mode, path = FILE, self._table_path(FILE, ident)
            table = _create_table(path, ident, name, strict=False)
        words = memoryview(anchor).cast("Q")
        # The id last, as the others read it without the lock; and 0 first, so that an
        # opener after a crash in between makes a table rather than trusting the rest.
        words[_A_ID] = 0
        words[_A_BOOT] = boot
        words[_A_MODE] = mode
        words[_A_MAGIC] = _ANCHOR_MAGIC
        words[_A_ID] = ident
        words.release()
        if previous:
            _retire(previous)  # mapped where it is used, but named no more
        # The tables of an anchor removed before this one was made (by a temp cleaner, or
        # with the whole directory), made in this mount namespace: the processes still on
        # them follow now.
        directories = [os.path.dirname(self.path)]
        if mode == SHM or _usable_shm_directory(self.shm_root):
            directories.append(shm_directory(self.shm_root))
        namespace = mount_namespace()
        for directory in directories:
            _retire_tables_of(directory, name, keep=path, namespace=namespace)
        if mode == SHM:
            sweep(os.path.dirname(path), path)
        return _Opened(anchor, table, ident, mode, path)


#: Every instance's lock holder, held weakly (the holders, not the instances: a compiled
#: instance cannot be referenced weakly).
_guards: weakref.WeakSet[Handle[threading.Lock]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held a lock at the fork: in the child nothing
    # would ever release it, and the first follow would hang. A new lock, not the old one
    # released: a thread of the child inside ``with`` releases the lock it took.
    for guard in list(_guards):
        guard.target = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
