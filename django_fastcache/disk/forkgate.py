"""No SQLite write in flight when the process forks.

SQLite keeps, per process, a table of the locks its connections hold on each database file
(POSIX locks belong to a process, so SQLite tracks which of its connections holds what). A
child forked while another thread of the parent is inside a write transaction inherits a
copy of that table saying the lock is held, by a connection that will never release it in
the child: every write the child then makes to that file waits for it, until its busy
timeout and for ever after (the first cache call of a prefork worker hung, or failed and
lost a write). So every write to the disk tier's databases runs inside :func:`writing`, and
a fork waits (at most ``FORK_WAIT`` seconds) until none is in flight, holding new ones back
meanwhile. A write holds its lock for a memcached round trip at most, so the wait is short.

The gate costs a lock round trip per disk write; reads are not gated (a read lock copied
into the child blocks no writer).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from ..logs import logger

#: Seconds a fork waits, at most, for the disk writes in flight to end.
FORK_WAIT = 10.0

_condition = threading.Condition(threading.Lock())
_active = 0
_forking = False
_local = threading.local()


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Around a write to one of the disk tier's databases (nested calls cost nothing)."""
    global _active
    local = _local
    depth: int = getattr(local, "depth", 0)
    if depth == 0:
        with _condition:
            while _forking:
                _condition.wait()
            _active += 1
    local.depth = depth + 1
    try:
        yield
    finally:
        local.depth = depth
        if depth == 0:
            with _condition:
                _active -= 1
                if _active == 0:
                    _condition.notify_all()


def _before_fork() -> None:
    global _forking
    _condition.acquire()  # held through the fork: no write starts meanwhile
    _forking = True
    own = 1 if getattr(_local, "depth", 0) else 0  # forking from inside a write
    deadline = time.monotonic() + FORK_WAIT
    while _active > own:
        left = deadline - time.monotonic()
        if left <= 0:
            logger.warning(
                "fork() went ahead with %d disk tier write(s) still in flight after %.0f s: "
                "the child may find those database files locked",
                _active - own,
                FORK_WAIT,
            )
            break
        _condition.wait(left)


def _after_fork_in_parent() -> None:
    global _forking
    _forking = False
    _condition.notify_all()
    _condition.release()


def _after_fork_in_child() -> None:
    global _condition, _active, _forking, _local
    # The parent's writers are not in the child: nothing is in flight here.
    _condition = threading.Condition(threading.Lock())
    _active = 0
    _forking = False
    _local = threading.local()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
