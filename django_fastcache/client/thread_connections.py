"""Each thread's blocking connections, by node index.

A module of its own, never compiled: its objects are weakly referenced (the registry of
every thread's dict, and the fork hook), which a mypyc-compiled class does not allow.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blocking import BlockingConnection


class ThreadConnections:
    """Every thread's connections: :attr:`by_node` is the calling thread's.

    A plain ``threading.local`` holds each thread's dict (as ``tls.by_node``), not a
    subclass of it: reading an attribute of a subclass instance adds a type look-up and
    the generic attribute machinery, about 200 instructions per request."""

    def __init__(self) -> None:
        #: The calling thread's ``by_node`` dict, once :meth:`new_thread` made it.
        self.tls = threading.local()

    @property
    def by_node(self) -> dict[int, BlockingConnection]:
        """The calling thread's connections, by node index."""
        try:
            by_node: dict[int, BlockingConnection] = self.tls.by_node
        except AttributeError:
            return self.new_thread()
        return by_node

    def new_thread(self) -> dict[int, BlockingConnection]:
        """The calling thread's dict of connections, new (its first request)."""
        by_node: dict[int, BlockingConnection] = {}
        self.tls.by_node = by_node
        # Every thread's dict, reachable from other threads for drop_nodes().
        _threads_of(self).append((weakref.ref(threading.current_thread()), by_node))
        return by_node

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
        by_node: dict[int, BlockingConnection] = {}
        self.tls.by_node = by_node
        # Only this thread lives on in the child.
        _threads_of(self)[:] = [(weakref.ref(threading.current_thread()), by_node)]
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
