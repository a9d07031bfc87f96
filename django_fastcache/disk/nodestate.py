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
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import struct
import zlib

_OUT = 1
_UP = 0
_STAMP = struct.Struct("<d")
#: Distrust slots: the page holds one float64 per slot, the last one for the whole tier.
_SLOTS = mmap.PAGESIZE // _STAMP.size - 1
_WHOLE_TIER = _SLOTS


def _page(path: str) -> mmap.mmap | None:
    """A page of ``path`` mapped read-write (created zeroed); None when it cannot be."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < mmap.PAGESIZE:
            # Blocks allocated now, not on the first write to the mapping: a full disk
            # then would kill the process with SIGBUS.
            try:
                os.posix_fallocate(fd, 0, mmap.PAGESIZE)
            except (AttributeError, OSError) as exc:  # no posix_fallocate here
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    raise
                os.ftruncate(fd, mmap.PAGESIZE)
        return mmap.mmap(fd, mmap.PAGESIZE)
    except OSError:
        return None
    finally:
        os.close(fd)


class NodeStates:
    def __init__(self, directory: str, node_ids: tuple[str, ...]) -> None:
        self.node_ids = node_ids
        #: False when the files could not be opened (a read-only or unusable directory):
        #: the states are then this process's own, in memory. The breaker still works,
        #: for this process only, and no request fails because of the disk.
        self.shared = True
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError:
            self.shared = False
        names = [hashlib.blake2b(n.encode(), digest_size=16).hexdigest() for n in node_ids]
        self._maps = [self._open(os.path.join(directory, f"{name}.state")) for name in names]
        self._stamps = self._open(os.path.join(directory, "distrust.state"))

    def _open(self, path: str) -> mmap.mmap:
        page = _page(path)
        if page is None:
            self.shared = False
            page = mmap.mmap(-1, mmap.PAGESIZE)
        return page

    def is_out(self, node: int) -> bool:
        return self._maps[node][0] == _OUT

    def any_out(self) -> bool:
        return any(m[0] == _OUT for m in self._maps)

    def mark_out(self, node: int) -> bool:
        """Mark ``node`` out; True when this call changed it."""
        states = self._maps[node]
        if states[0] == _OUT:
            return False
        states[0] = _OUT
        return True

    def mark_up(self, node: int) -> None:
        self._maps[node][0] = _UP

    # -- disk entries ------------------------------------------------------------------------
    @staticmethod
    def _slot(key: bytes) -> int:
        return zlib.crc32(key) % _SLOTS

    def distrust(self, key: bytes | None, now: float) -> None:
        """No entry of ``key`` (None: of any key) written at or before ``now`` may answer."""
        slot = _WHOLE_TIER if key is None else self._slot(key)
        if _STAMP.unpack_from(self._stamps, slot * _STAMP.size)[0] < now:
            _STAMP.pack_into(self._stamps, slot * _STAMP.size, now)

    def trusts(self, key: bytes, written_at: float) -> bool:
        """Whether an entry of ``key`` written at ``written_at`` may answer a read."""
        stamps = self._stamps
        own: float = _STAMP.unpack_from(stamps, self._slot(key) * _STAMP.size)[0]
        whole: float = _STAMP.unpack_from(stamps, _WHOLE_TIER * _STAMP.size)[0]
        return written_at > own and written_at > whole
