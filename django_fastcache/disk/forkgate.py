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

Reads, and opening and closing a connection, are gated too: SQLite takes process-wide
mutexes inside every call (its allocator's among them), and a child inheriting one held
would hang on its first use of SQLite. Each thread counts its own calls in flight, so
passing the gate takes no lock: only a fork (and a call meeting one) does.

Closing a connection is a call into SQLite too, and one left to be collected is closed by
the garbage collector (CPython's connections are in a reference cycle with their statement
cache), in whatever thread it happens to run, with the GIL released for the close: a fork
then could cut through it (a child hung for good in ``sqlite3.connect``, on SQLite's
allocator mutex, held at the fork by a thread that only ran the collector). So every
connection the disk tier opens is :func:`hold`-en here (opened with
``check_same_thread=False``, so that any thread may close it), and closed explicitly, inside
the gate, once its thread ended or its owner is gone: by the next connection held, or the
next fork. A connection already closed costs SQLite nothing when it is collected.

A child closes every connection its parent opened, at once, before it opens its own (see
``_after_fork_in_child``): one kept open across the fork leaves SQLite's record of the file's
locks in the child claiming locks the child does not hold, and the child's own connections
then write without them (a shard was corrupted that way).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from ..logs import logger

#: Seconds a fork waits, at most, for the disk writes in flight to end.
FORK_WAIT = 10.0

_condition = threading.Condition(threading.Lock())
_forking = False
_local = threading.local()
#: This process's id, kept current by the fork hook (no getpid() per use).
pid = os.getpid()


class Closable(Protocol):
    def close(self) -> None: ...


#: Every connection the disk tier opened, by (owner, thread; 0 for one shared by every
#: thread): the owner (weakly), the thread's :class:`_Calls` (weakly: gone when the thread
#: ended; None when shared), the connection.
_open: dict[tuple[int, int], tuple[weakref.ref[Any], weakref.ref[Any] | None, Closable]] = {}
#: Taken by the fork hook: every held connection, referenced across the fork.
_at_fork: list[Closable] | None = None


def hold(owner: object, connection: Closable, *, shared: bool = False) -> None:
    """Record ``connection`` (opened with ``check_same_thread=False``), opened by this
    thread for ``owner`` (``shared``: used by every thread), in place of the one held for
    them before; call inside the gate. It is closed here, inside the gate, once ``owner``
    is gone or the thread ended, when another connection is held or a fork comes. A child
    forked while it is held never closes it."""
    enter()
    try:
        if shared:
            key, thread = (id(owner), 0), None
        else:
            # The thread's own record of its calls (held by its threading.local, as the
            # thread's state holds that) goes when the thread ends, whoever started it:
            # a thread not started by threading (by C code) is a "dummy" Thread, which
            # stays alive for ever as far as is_alive() says.
            calls: _Calls = _local.calls
            key, thread = (id(owner), threading.get_ident()), weakref.ref(calls)
        previous = _open.get(key)
        _open[key] = (weakref.ref(owner), thread, connection)
        if previous is not None and previous[2] is not connection:
            _close(previous[2])
        _drop_unused()
    finally:
        leave()


def _drop_unused() -> None:
    """Close the connections whose owner is gone or whose thread ended (inside the gate)."""
    for key, (owner, thread, connection) in list(_open.items()):
        unused = owner() is None or (thread is not None and _ended(thread))
        if unused and _open.pop(key, None) is not None:
            _close(connection)


def _close(connection: Closable) -> None:
    # Explicitly, here: a connection left to be collected is closed by the garbage
    # collector (CPython's are in a reference cycle with their statement cache), in
    # whatever thread it runs, with the GIL released for the close.
    with contextlib.suppress(Exception):  # closing it is all that is left to do
        connection.close()


def _ended(thread: weakref.ref[Any]) -> bool:
    return thread() is None


class _Calls:
    """One thread's calls into SQLite in flight: a depth only it writes, the fork hook
    reads."""

    __slots__ = ("__weakref__", "depth")

    def __init__(self) -> None:
        self.depth = 0


#: Every thread's :class:`_Calls` (held weakly: a thread that ends lets its own go).
_calls: weakref.WeakSet[_Calls] = weakref.WeakSet()


def _own_calls() -> _Calls:
    calls = _Calls()
    with _condition:  # not while the fork hook reads the registry
        _calls.add(calls)
    _local.calls = calls
    return calls


# enter and leave are on the read path: no lock unless a fork is under way. A thread
# first raises its own depth, then reads _forking; the fork hook first sets _forking, then
# reads every depth. Under the GIL each sees the other's write in that order, so either the
# thread sees the fork (and backs off) or the hook sees the call (and waits for its
# leave), or both; never neither.
def enter() -> None:
    """A call into SQLite begins (nested calls only count); pair with :func:`leave`. Waits
    while a fork is under way."""
    try:
        calls: _Calls = _local.calls
    except AttributeError:
        calls = _own_calls()
    depth = calls.depth
    calls.depth = depth + 1
    if _forking and depth == 0:
        _wait_for_fork(calls)


def _wait_for_fork(calls: _Calls) -> None:
    with _condition:
        while _forking:
            calls.depth = 0  # backed off: the fork hook no longer waits for this call
            _condition.notify_all()
            _condition.wait()
            calls.depth = 1


def leave() -> None:
    """The call into SQLite that :func:`enter` began has ended."""
    calls: _Calls = _local.calls
    depth = calls.depth - 1
    calls.depth = depth
    if _forking and depth == 0:
        with _condition:  # the fork hook waits for this call: tell it
            _condition.notify_all()


def held() -> bool:
    """Whether no fork can land now: this thread is inside the gate, or is the one forking."""
    calls: _Calls | None = getattr(_local, "calls", None)
    return (calls is not None and calls.depth > 0) or _forking


def _in_flight(own: _Calls | None) -> int:
    """How many other threads are inside SQLite now."""
    return sum(1 for calls in list(_calls) if calls.depth and calls is not own)


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Around a write to one of the disk tier's databases (nested calls cost nothing)."""
    enter()
    try:
        yield
    finally:
        leave()


def _before_fork() -> None:
    global _forking
    _condition.acquire()  # held through the fork: no write starts meanwhile
    _forking = True
    own: _Calls | None = getattr(_local, "calls", None)  # forking from inside a call
    deadline = time.monotonic() + FORK_WAIT
    while in_flight := _in_flight(own):
        left = deadline - time.monotonic()
        if left <= 0:
            logger.warning(
                "fork() went ahead with %d disk tier write(s) still in flight after %.0f s: "
                "the child may find those database files locked",
                in_flight,
                FORK_WAIT,
            )
            break
        _condition.wait(left)
    # No connection opens or closes now (both are gated): what is held crosses the fork,
    # after the unused ones are closed (here, with no SQLite call in flight).
    global _at_fork
    _drop_unused()
    _at_fork = [connection for _owner, _thread, connection in _open.values()]


def _after_fork_in_parent() -> None:
    global _forking, _at_fork
    _at_fork = None
    _forking = False
    _condition.notify_all()
    _condition.release()


def _after_fork_in_child() -> None:
    global _condition, _forking, _calls, _open, _at_fork, pid
    # The parent's other threads are not in the child: nothing of theirs is in flight here
    # (the forking thread's own calls, if it forked from inside one, still end in leave()).
    _condition = threading.Condition(threading.Lock())
    _forking = False
    own: _Calls | None = getattr(_local, "calls", None)
    _calls = weakref.WeakSet()
    if own is not None:
        _calls.add(own)
    pid = os.getpid()
    # The parent's connections are closed here, before the child can open its own: kept
    # open, their records in SQLite's table of this process's files would say locks are
    # held that the child does not hold (fcntl locks do not cross a fork), a connection the
    # child opens would then take no real lock, and the parent's checkpoint on its last
    # close would remove the WAL under the child's writes (a malformed database). Closing
    # is safe now: no SQLite call was in flight at the fork, and a checkpoint on close
    # needs an exclusive lock the parent's own connections deny.
    inherited, _at_fork = _at_fork, None
    for connection in inherited or ():
        _close(connection)
    _open = {}


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
