"""Which memcached nodes are out, shared by every process on the host.

One byte per node in a small memory-mapped file in the disk tier's directory: reading it
costs about as much as reading an attribute, so every request can check it. When one
process finds a node failing, every process on the host sends that node's keys to the disk
tier from then on, and none of them reads the node again until its journal is replayed.
"""

from __future__ import annotations

import hashlib
import mmap
import os

_OUT = 1
_UP = 0


class NodeStates:
    def __init__(self, directory: str, node_ids: tuple[str, ...]) -> None:
        self.node_ids = node_ids
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._maps: list[mmap.mmap] = []
        for node_id in node_ids:
            name = hashlib.blake2b(node_id.encode(), digest_size=16).hexdigest()
            path = os.path.join(directory, f"{name}.state")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < mmap.PAGESIZE:
                    os.ftruncate(fd, mmap.PAGESIZE)
                self._maps.append(mmap.mmap(fd, mmap.PAGESIZE))
            finally:
                os.close(fd)

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
