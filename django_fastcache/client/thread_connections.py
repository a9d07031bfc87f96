"""Each thread's blocking connections, by node index.

A module of its own, never compiled: ``threading.local`` gives every thread a fresh
instance by calling ``__init__`` again in it, which a mypyc-compiled subclass does not do
(every thread would share one set of sockets).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blocking import BlockingConnection


class ThreadConnections(threading.local):
    """The calling thread's connections; each thread sees its own ``by_node``."""

    def __init__(self) -> None:
        self.by_node: dict[int, BlockingConnection] = {}

    def _forget_after_fork(self) -> object:
        # Plain sockets: closing the child's copies leaves the parent's connections open.
        # (Only the forking thread lives on in the child; other threads' entries go with
        # their threads.)
        for connection in self.by_node.values():
            connection.close()
        self.by_node = {}
        return None
