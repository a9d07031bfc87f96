"""What a forked child must do with the event loops and sockets it inherited.

After ``fork()`` the child shares its parent's sockets *and* its parent's epoll instance.
Closing or garbage-collecting the inherited transports or loops in the child would
unregister the parent's sockets from that shared epoll instance and stall the parent. So
the child never touches them: each registered owner hands over what it inherited, which
is kept alive (deliberately leaked) for the life of the child, and starts afresh.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def _forget_after_fork(self) -> object: ...


_owners: weakref.WeakSet[ForkAware] = weakref.WeakSet()
# Referenced from here for the rest of the child's life; never closed, never collected.
_inherited: list[object] = []


def register(owner: ForkAware) -> None:
    """Have ``owner._forget_after_fork()`` called in every child forked from now on."""
    _owners.add(owner)


def _after_fork_in_child() -> None:
    for owner in list(_owners):
        _inherited.append(owner._forget_after_fork())
    keep_forever(_inherited)


def keep_forever(obj: object) -> None:
    """Reference ``obj`` for the rest of the process's life, interpreter shutdown included."""
    # An extra reference that is never dropped: even interpreter shutdown in the child
    # must not deallocate (and so unregister) what belongs to the parent's epoll set.
    # (ctypes is imported with this module: importing it in the child loads a shared
    # library, which hangs when another thread of the parent held the loader's lock.)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


os.register_at_fork(after_in_child=_after_fork_in_child)
