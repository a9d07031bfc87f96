"""Each thread's blocking connections, by node index.

A module of its own, never compiled: ``threading.local`` gives every thread a fresh
instance by calling ``__init__`` again in it, which a mypyc-compiled subclass does not do
(every thread would share one set of sockets).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blocking import BlockingConnection


class ThreadConnections(threading.local):
    """The calling thread's connections; each thread sees its own ``by_node``."""

    def __init__(self) -> None:
        self.by_node: dict[int, BlockingConnection] = {}
        # Every thread's dict, reachable from other threads for drop_nodes().
        _threads_of(self).append((weakref.ref(threading.current_thread()), self.by_node))

    def drop_nodes(self, nodes: tuple[int, ...]) -> None:
        """Close every thread's connections to ``nodes`` (nodes that left the cluster).

        A connection its thread is using right now (a request routed just before the
        change) is only taken out of the thread's dict, so that the request is not failed:
        the socket is closed when the request lets go of the connection (by the garbage
        collector, which may warn about it with a ResourceWarning)."""
        entries = _threads_of(self)
        entries[:] = [(thread, conns) for thread, conns in entries if thread() is not None]
        for _thread, connections in entries:
            for node in nodes:
                connection = connections.pop(node, None)
                # Held only by this frame and getrefcount's argument: nobody is using it.
                if connection is not None and sys.getrefcount(connection) <= 2:
                    connection.close()

    def _forget_after_fork(self) -> object:
        # Plain sockets: closing the child's copies leaves the parent's connections open.
        # (Only the forking thread lives on in the child; other threads' entries go with
        # their threads.)
        for connection in self.by_node.values():
            connection.close()
        self.by_node = {}
        # Only this thread lives on in the child.
        _threads_of(self)[:] = [(weakref.ref(threading.current_thread()), self.by_node)]
        return None


_registries: weakref.WeakKeyDictionary[
    ThreadConnections, list[tuple[weakref.ref[threading.Thread], dict[int, BlockingConnection]]]
] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def _threads_of(
    local: ThreadConnections,
) -> list[tuple[weakref.ref[threading.Thread], dict[int, BlockingConnection]]]:
    with _registries_lock:
        entries = _registries.get(local)
        if entries is None:
            entries = _registries[local] = []
        return entries
