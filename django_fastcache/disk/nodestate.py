"""Which memcached nodes are out, and which disk entries must not answer, shared by every
process on the host.

One byte per node in a small memory-mapped file in the disk tier's directory: reading it
costs about as much as reading an attribute, so every request can check it. When one
process finds a node failing, every process on the host sends that node's keys to the disk
tier from then on, and none of them reads the node again until its journal is replayed.

Another page holds the disk entries' *distrust stamps*. When the disk tier fails to write
or delete a key (locked past waiting, read-only, full, corrupt) its entry may be older than
the value acknowledged: the key's slot (a hash of the key picks one of a few hundred) is
stamped with the time of the failure, and from then on no entry of that slot written at or
before the stamp answers a read, in any process. A later successful write is newer than the
stamp and answers again. A stamp is a plain write to memory: it cannot fail when the disk
does. (Two processes stamping one slot in the same instant may leave the earlier stamp.)

Each node's page also counts its outages, so that a replay can tell that the probe it acted
on was answered in the current outage, and a read that memcached answered, that its node
did not go out while it waited. And the files can be removed under the processes
(a temp cleaner, a deleted directory made again): :meth:`NodeStates.replaced` notices, and
:meth:`NodeStates.reopen` maps the directory's files again, carrying over what it knew. A
process that moves marks the pages it leaves as distrusting every entry, so that the
processes still on them stop trusting the disk at once, without a ``stat``.
"""

from __future__ import annotations

import errno
import hashlib
import math
import mmap
import os
import struct
import sys
import time
import zlib
from typing import Final

from .._mypyc import mypyc_attr
from .location import make_private

_OUT: Final = 1
_UP: Final = 0
# Native byte order: trusts() reads the page as a memoryview of float64s.
_STAMP: Final = struct.Struct("=d")
#: In a node's page: byte 0 its state; at _OUTAGES, how many times it went out (native
#: byte order: epoch() reads the page as a memoryview of uint64s).
_COUNT: Final = struct.Struct("=Q")
#: ``time.monotonic``, bound once (see tiered's ``_now``): :meth:`NodeStates.trusts` runs
#: per read from disk.
_monotonic: Final = time.monotonic
_OUTAGES: Final = 8
#: In a node's page: set when a write or delete made while the node was out could not be
#: journaled (the journal locked past waiting, a full disk): the journal then does not
#: name every key that changed, and the node's replay flushes it whole instead. A plain
#: write to memory, like the distrust stamps: it cannot fail when the disk does.
_FLUSH: Final = 16
#: In a node's page: set by the replay that took the flush request (clearing _FLUSH) until
#: its flush is done. A replaying process killed meanwhile (the OOM killer, a deploy)
#: leaves it set, and the next replay flushes: the request is never lost with the process.
_FLUSHING: Final = 17
#: In a node's page: the id of the outage journal this outage's writes were journaled in
#: (0: none yet, or an older process that does not keep it). A replay that finds another
#: journal at the path, the one they went to having been removed while no process ran to
#: carry it over, flushes the node whole: the keys it named are lost.
_JOURNAL: Final = 24
#: In a node's page: 1 once a process asked the journal whether it names keys of the node
#: (0 in a page just made, the file having been missing or truncated: the node may have
#: been out, with writes journaled, and reads as up; see TieredStore.recover_lost_states).
_CHECKED: Final = 32
_COUNT_WORD: Final = _OUTAGES // 8
#: Where the state byte lies in the page's first uint64, in the host's byte order.
_STATE_SHIFT: Final = 0 if sys.byteorder == "little" else 56
_crc32: Final = zlib.crc32
#: Distrust slots: the page holds one float64 per slot, the last one for the whole tier.
_SLOTS: Final = mmap.PAGESIZE // _STAMP.size - 1
_WHOLE_TIER: Final = _SLOTS
#: Seconds between two checks, by a read from disk, that the files are still the
#: directory's: a ``stat`` per read cost about a sixth of a read during an outage.
CHECK_INTERVAL = 0.005


def _page(path: str) -> tuple[mmap.mmap, tuple[int, int]]:
    """A page of ``path`` mapped read-write (created zeroed), and the file's (device,
    inode). OSError when it cannot be had."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        info = os.fstat(fd)
        if info.st_size < mmap.PAGESIZE:
            # Blocks allocated now, not on the first write to the mapping: a full disk
            # then would kill the process with SIGBUS.
            try:
                os.posix_fallocate(fd, 0, mmap.PAGESIZE)
            except (AttributeError, OSError) as exc:  # no posix_fallocate here
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    raise
                os.ftruncate(fd, mmap.PAGESIZE)
        return mmap.mmap(fd, mmap.PAGESIZE), (info.st_dev, info.st_ino)
    finally:
        os.close(fd)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


# Tests twin it (tests/twins.py): a subclass of theirs replaces some methods.
@mypyc_attr(allow_interpreted_subclasses=True)
class NodeStates:
    def __init__(self, directory: str, node_ids: tuple[str, ...]) -> None:
        """OSError when the directory's files cannot be mapped: states of this process's
        own would not see the outages the others mark (it would read memcached for keys
        they are journaling), so there is no tier without them."""
        self.node_ids = node_ids
        self.directory = directory
        names = [hashlib.blake2b(n.encode(), digest_size=16).hexdigest() for n in node_ids]
        self._paths = [os.path.join(directory, f"{name}.state") for name in names]
        self._stamps_path = os.path.join(directory, "distrust.state")
        #: (device, inode) of the distrust page this process mapped, and of each node's
        #: page: the files in the directory must be the ones every process maps (see
        #: :meth:`replaced`).
        self._identity: tuple[int, int] | None = None
        self._node_identities: list[tuple[int, int]] = []
        #: Pages replaced by :meth:`reopen`, kept mapped: another thread may still read them.
        self._retired: list[mmap.mmap] = []
        #: Times this process found the files replaced and mapped the new ones.
        self.reopened = 0
        #: ``time.monotonic()`` from which :meth:`trusts` checks the files again.
        self._next_check = 0.0
        self._maps, self._node_identities, self._stamps, self._identity = self._open_all()
        #: Each node's page as uint64s: what :meth:`epoch` reads, twice per request (and
        #: :meth:`is_out`, once per write).
        self._words = [memoryview(page).cast("Q") for page in self._maps]
        #: The distrust page as float64s: what :meth:`trusts` reads, per read.
        self._times = memoryview(self._stamps).cast("d")

    def _open_all(
        self,
    ) -> tuple[list[mmap.mmap], list[tuple[int, int]], mmap.mmap, tuple[int, int]]:
        """The directory's pages (made if need be) and their files' identities: the nodes'
        pages, then the distrust page."""
        opened: list[mmap.mmap] = []
        identities: list[tuple[int, int]] = []
        try:
            make_private(self.directory)  # 0700, parents too (the tier's may be gone)
            for path in self._paths:
                page, node_identity = _page(path)
                opened.append(page)
                identities.append(node_identity)
            stamps, identity = _page(self._stamps_path)
        except OSError as exc:
            for page in opened:
                page.close()
            where = exc.filename or self.directory
            raise OSError(
                exc.errno or 0,
                f"the disk tier's node states at {self.directory} cannot be mapped "
                f"({where}: {exc.strerror or exc}); every process on the host must share them",
            ) from exc
        return opened, identities, stamps, identity

    # -- the files under the processes -------------------------------------------------------
    def replaced(self) -> bool:
        """Whether the state files this process mapped are no longer the directory's: the
        directory was removed (and perhaps made again by another process), or a temp
        cleaner removed the files. Processes that map different files no longer see each
        other's outages and distrust stamps. One ``stat`` per file: each is checked, as a
        cleaner may remove one a process made a moment before (it listed the old one), and
        the process that made it would keep a page no later process maps."""
        identity = self._identity
        if identity is None:
            return False
        if _identity(self._stamps_path) != identity:
            return True
        return any(
            _identity(path) != mapped
            for path, mapped in zip(self._paths, self._node_identities, strict=True)
        )

    def reopen(self, now: float) -> None:
        """Map the directory's files (made again if need be) in place of the replaced ones,
        carrying over what this process knew: nodes out stay out (their journals must be
        replayed before they serve again), and every disk entry written before ``now``
        stops answering, host-wide (this process's writes since the split went to files
        the others never saw, and theirs to files this process never saw)."""
        if not self.replaced():
            return  # another thread of this process moved first
        old_maps, old_stamps, old_identity = self._maps, self._stamps, self._identity
        # OSError (out of descriptors, the directory unusable): the old pages stay, and
        # replaced() still says so, so that the next check tries again.
        maps, node_identities, stamps, identity = self._open_all()
        for old, new in zip(old_maps, maps):
            if old[_FLUSH] or old[_FLUSHING]:
                new[_FLUSH] = 1
            # The journal this process's outage writes went to. Where the new page names
            # another (processes started on the new files journaled there), writes of
            # one outage are in two journals, and a replay of the new one alone (before
            # this process carried its own over, or if it dies first) would miss the
            # keys of the other: the node is flushed instead.
            journal: int = _COUNT.unpack_from(old, _JOURNAL)[0]
            recorded: int = _COUNT.unpack_from(new, _JOURNAL)[0]
            if journal and recorded and recorded != journal:
                new[_FLUSH] = 1
            if journal:
                _COUNT.pack_into(new, _JOURNAL, journal)
            if old[0] == _OUT:
                # And its count: a replay that probed before the move must not take the
                # new page's count for another outage. Unless the node was up there with
                # that count already (another process moved first and brought it back):
                # it goes out anew then, with a count of its own, so that a read that took
                # the epoch before and checks it after sees the change (the same count
                # would read as "up, unchanged" once the node is back).
                ours: int = _COUNT.unpack_from(old, _OUTAGES)[0]
                theirs: int = _COUNT.unpack_from(new, _OUTAGES)[0]
                anew = new[0] != _OUT and theirs >= ours
                new[0] = _OUT
                _COUNT.pack_into(new, _OUTAGES, max(ours, theirs) + anew)
        for slot in range(_SLOTS + 1):
            offset = slot * _STAMP.size
            known: float = _STAMP.unpack_from(old_stamps, offset)[0]
            # (Not the mark of pages another process left: the new ones are current.)
            if math.isfinite(known) and known > _STAMP.unpack_from(stamps, offset)[0]:
                _STAMP.pack_into(stamps, offset, known)
        self._retired.extend([*old_maps, old_stamps])
        words = [memoryview(page).cast("Q") for page in maps]
        self._maps, self._words, self._stamps, self._identity = maps, words, stamps, identity
        self._node_identities = node_identities
        self._times = memoryview(stamps).cast("d")
        self.distrust(None, now)
        if self._identity is not None and self._identity != old_identity:
            # The pages left behind distrust every entry from now on: the processes still
            # on them read no disk entry until they move too (see trusts()). Only pages
            # known to be gone from the directory: marking its current ones would stop
            # every process's disk reads for good.
            _STAMP.pack_into(old_stamps, _WHOLE_TIER * _STAMP.size, math.inf)
        self._next_check = 0.0
        self.reopened += 1

    def is_out(self, node: int) -> bool:
        # Through the words epoch() reads, not the mapping's own indexing: every get runs
        # that code, so a write's check finds it in the CPU's caches.
        return self._words[node][0] >> _STATE_SHIFT & 0xFF == _OUT

    def any_out(self) -> bool:
        return any(m[0] == _OUT for m in self._maps)

    def mark_out(self, node: int) -> bool:
        """Mark ``node`` out; True when this call changed it (a new outage began)."""
        states = self._maps[node]
        if states[0] == _OUT:
            return False
        # The state first: an epoch() read between the two sees the node out already (the
        # count first would read as "up" with the new count, the epoch the node has once
        # it is back: an out-and-back missed).
        states[0] = _OUT
        _COUNT.pack_into(states, _OUTAGES, _COUNT.unpack_from(states, _OUTAGES)[0] + 1)
        return True

    def outages(self, node: int) -> int:
        """How many times ``node`` went out (host-wide): what tells one outage from the
        next, for a replay that must not act on a probe answered in an earlier one."""
        return int(_COUNT.unpack_from(self._maps[node], _OUTAGES)[0])

    def epoch(self, node: int) -> int:
        """``node``'s state and outage count as one number, odd while it is out, that
        changes whenever the node goes out or comes back: a request that reads it before
        it is sent and again after its reply knows whether the node went out meanwhile.
        (Read halfway through :meth:`mark_out`, which sets the state before the count, it
        is odd: out, and unlike any epoch the node has before or after.)"""
        words = self._words[node]
        # The count, then the state: the other order than mark_out's writes, so that a
        # read across them never pairs the new count with the state from before.
        outages: int = words[_COUNT_WORD]
        state: int = words[0] >> _STATE_SHIFT & 0xFF
        return outages << 1 | state

    def mark_up(self, node: int) -> None:
        """``node`` serves again (its journal replayed, or the node flushed whole)."""
        page = self._maps[node]
        _COUNT.pack_into(page, _JOURNAL, 0)
        page[0] = _UP

    def journal_of(self, node: int) -> int:
        """The id of the outage journal ``node``'s writes of this outage went to (0: none
        yet)."""
        return int(_COUNT.unpack_from(self._maps[node], _JOURNAL)[0])

    def journaled_in(self, node: int, journal_id: int, carried_from: int = 0) -> None:
        """``node``'s writes of this outage went to the journal ``journal_id`` (carried
        there from ``carried_from``, a journal removed under a process). Another journal
        recorded already, one removed since with writes of this outage that no process
        carried over, asks for the node's flush at its replay."""
        page = self._maps[node]
        recorded = _COUNT.unpack_from(page, _JOURNAL)[0]
        if recorded not in (0, journal_id, carried_from):
            page[_FLUSH] = 1
        _COUNT.pack_into(page, _JOURNAL, journal_id)

    def journaled_in_by_id(self, node_id: str, journal_id: int, carried_from: int = 0) -> None:
        if node_id in self.node_ids:
            self.journaled_in(self.node_ids.index(node_id), journal_id, carried_from)

    def unchecked(self) -> list[int]:
        """The nodes whose pages no process has asked the journal about (see _CHECKED)."""
        return [node for node, page in enumerate(self._maps) if not page[_CHECKED]]

    def checked(self, node: int) -> None:
        self._maps[node][_CHECKED] = 1

    def must_flush(self, node: int) -> None:
        """A key of ``node`` changed while it was out, and the journal could not take it:
        its replay must flush the node whole."""
        self._maps[node][_FLUSH] = 1

    def must_flush_by_id(self, node_id: str) -> None:
        if node_id in self.node_ids:
            self.must_flush(self.node_ids.index(node_id))

    def flush_needed(self, node: int) -> bool:
        page = self._maps[node]
        return page[_FLUSH] != 0 or page[_FLUSHING] != 0

    def flushing(self, node: int) -> None:
        """The replay about to flush ``node`` takes the request (before flushing: one made
        meanwhile is kept for the next replay), and holds it as its own until
        :meth:`flush_done`: a replay that dies in between leaves it asked."""
        page = self._maps[node]
        page[_FLUSHING] = 1
        page[_FLUSH] = 0

    def flush_done(self, node: int) -> None:
        """``node`` was flushed by the replay that took its request (:meth:`flushing`)."""
        self._maps[node][_FLUSHING] = 0

    def mark_out_by_id(self, node_id: str) -> None:
        if node_id in self.node_ids:
            self.mark_out(self.node_ids.index(node_id))

    # -- disk entries ------------------------------------------------------------------------
    @staticmethod
    def _slot(key: bytes) -> int:
        return _crc32(key) % _SLOTS

    def distrust(self, key: bytes | None, now: float) -> None:
        """No entry of ``key`` (None: of any key) written at or before ``now`` may answer."""
        slot = _WHOLE_TIER if key is None else self._slot(key)
        if _STAMP.unpack_from(self._stamps, slot * _STAMP.size)[0] < now:
            _STAMP.pack_into(self._stamps, slot * _STAMP.size, now)

    def trusts(self, key: bytes, written_at: float) -> bool:
        """Whether an entry of ``key`` written at ``written_at`` may answer a read.

        None answers while the state files were replaced under this process (until the
        maintenance thread maps the new ones): its disk tier may no longer be the one the
        other processes write to. Noticed at once when another process on these files
        moved first (it marked them); otherwise by a ``stat``, made at most every
        :data:`CHECK_INTERVAL` seconds (and by every read while they are replaced)."""
        if _monotonic() >= self._next_check:
            if self.replaced():
                return False
            self._next_check = _monotonic() + CHECK_INTERVAL
        times = self._times  # (the slot as _slot says, inline: this runs per read)
        return written_at > times[_crc32(key) % _SLOTS] and written_at > times[_WHOLE_TIER]
