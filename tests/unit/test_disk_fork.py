"""The disk tier's SQLite connections across fork(): a fork at any moment of another thread's
connect leaves a child that works, and a child drops the connections it inherited without
closing them (SQLite's rule: closing one may checkpoint or remove files from under the
parent). No servers: the disk store alone, forked children that exit with a status."""

from __future__ import annotations

import _thread
import contextlib
import gc
import os
import signal
import sqlite3
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_fastcache.disk import DiskStore, forkgate

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

#: Seconds a child may take; one that takes longer is stuck, and is killed.
CHILD_DEADLINE = 20.0


def _wait(pid: int) -> int:
    """The child's exit status; -1 when it had to be killed (it hung)."""
    deadline = time.monotonic() + CHILD_DEADLINE
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.005)


def _database_files(directory: str) -> dict[int, str]:
    """This process's open descriptors of the SQLite files of the disk tier at
    ``directory``."""
    found: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(directory) and "cache.db" in target:
            found[int(name)] = target
    return found


def test_forks_while_a_thread_opens_the_disk_tier_again_and_again_never_hang_a_child(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "disk")
    # The process's own disk tier, open throughout (as its writer behind keeps it).
    kept = DiskStore(directory)
    kept.set(b"k", b"v", 0, None)
    stop = threading.Event()

    def open_again_and_again() -> None:
        # What the writer behind does on its first batch: open the shards, land, and here
        # close them again, so that forks keep landing inside SQLite's connect and close.
        while not stop.is_set():
            store = DiskStore(directory)
            store.land([(b"w", 1, b"v", 0, None, time.time())], lambda key: 1)
            store.close()

    thread = threading.Thread(target=open_again_and_again, daemon=True)
    thread.start()
    statuses: list[int] = []
    try:
        for round_ in range(40):
            pid = os.fork()
            if pid == 0:  # the child: a store of its own on the same files
                code = 1
                try:
                    own = DiskStore(directory)
                    own.set(b"child", b"%d" % round_, 0, None)
                    entry = own.get(b"child")
                    code = 0 if entry is not None and entry.data == b"%d" % round_ else 2
                except BaseException:
                    os.write(2, traceback.format_exc().encode())
                    raise
                finally:
                    os._exit(code)
            statuses.append(_wait(pid))
    finally:
        stop.set()
        thread.join()
    assert statuses == [0] * len(statuses), f"children that hung (-1) or failed: {statuses}"
    entry = kept.get(b"child")
    assert entry is not None
    kept.close()


def test_a_forked_child_closes_the_parents_connections_before_it_opens_its_own(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "disk")
    store = DiskStore(directory)
    store.set(b"k", b"parent", 0, None)  # this thread's connections
    # Another thread's too: CPython frees the other threads' locals in a forked child.
    opened, stop = threading.Event(), threading.Event()

    def read_and_stay() -> None:
        store.get(b"k")
        opened.set()
        stop.wait()

    thread = threading.Thread(target=read_and_stay, daemon=True)
    thread.start()
    assert opened.wait(10)
    inherited = _database_files(directory)
    assert inherited
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                still_open = _database_files(directory)
                closed = all(still_open.get(fd) != target for fd, target in inherited.items())
                store.set(b"k", b"child", 0, None)  # the child's own connections
                entry = store.get(b"k")
                store.close()
                code = 0 if closed and entry is not None and entry.data == b"child" else 2
            finally:
                os._exit(code)
        assert _wait(pid) == 0, "the child kept connections it inherited"
    finally:
        stop.set()
        thread.join()
    # The parent's connections work on, and its last close leaves sound databases.
    entry = store.get(b"k")
    assert entry is not None
    assert entry.data == b"child"
    store.close()
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name, "cache.db")
        if os.path.exists(path):
            with contextlib.closing(sqlite3.connect(path)) as con:
                assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_forks_while_threads_read_the_disk_tier_never_hang_a_child(tmp_path: Path) -> None:
    directory = str(tmp_path / "disk")
    store = DiskStore(directory)
    for number in range(50):
        store.set(b"k%d" % number, b"v" * 200, 0, None)
    stop = threading.Event()

    def read_again_and_again() -> None:
        # SQLite takes process-wide mutexes inside every call (its allocator's among
        # them): a fork must not land while one is held.
        while not stop.is_set():
            for number in range(50):
                store.get(b"k%d" % number)
            store.volume()

    threads = [threading.Thread(target=read_again_and_again, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    statuses: list[int] = []
    try:
        for round_ in range(40):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    own = DiskStore(directory)
                    own.set(b"child", b"%d" % round_, 0, None)
                    code = 0 if own.get(b"k1") is not None else 2
                except BaseException:
                    os.write(2, traceback.format_exc().encode())
                    raise
                finally:
                    os._exit(code)
            statuses.append(_wait(pid))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert statuses == [0] * len(statuses), f"children that hung (-1) or failed: {statuses}"
    store.close()


# -- a connection's close is a call into SQLite too ---------------------------------------------


def _record_closes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """From now on, each SQLite connection opened records, when its last reference goes
    (which is what closes it), whether no fork could land meanwhile (the fork gate held)."""
    closes: list[bool] = []

    class Recorded(sqlite3.Connection):
        def __del__(self) -> None:
            closes.append(forkgate.held())

    connect = sqlite3.connect

    def recorded(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, factory=Recorded, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", recorded)
    return closes


def _in_a_thread_that_ends(work: Callable[[], object]) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    gc.collect()  # whatever the thread left is gone now, unless something holds it


def test_the_connections_of_a_thread_that_ended_are_closed_only_inside_the_fork_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython closes a connection wherever its last reference goes, with the GIL released
    for the close: the locals of a thread that ends (a request thread of a threaded
    server). A fork meanwhile left a child hung for good on SQLite's allocator mutex."""
    closes = _record_closes(monkeypatch)
    store = DiskStore(str(tmp_path / "disk"))
    store.set(b"k", b"v", 0, None)
    settled = len(closes)  # (diskcache's own set-up opens and closes some: in the gate)
    _in_a_thread_that_ends(lambda: store.get(b"k"))  # the thread's own connection
    assert all(closes), "closed where a fork could land"
    assert len(closes) == settled
    # Closed by the next connection held (another thread's first read).
    _in_a_thread_that_ends(lambda: store.get(b"k"))
    assert all(closes)
    assert len(closes) == settled + 1
    # Or by the next fork, before it forks.
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os._exit(0 if store.get(b"k") is not None else 2)
    assert _wait(pid) == 0
    assert all(closes)
    assert len(closes) == settled + 2
    store.close()


def _closed(connection: sqlite3.Connection) -> bool:
    try:
        connection.execute("SELECT 1")
    except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
        return True
    return False


def test_the_connections_of_a_thread_not_started_by_threading_are_closed_once_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that C code started (here by ``_thread``) is a "dummy" Thread to
    ``threading``, alive for ever as far as ``is_alive()`` says: its connections are
    closed all the same once it ended, not kept open (descriptors, files) for good."""
    closes = _record_closes(monkeypatch)
    store = DiskStore(str(tmp_path / "disk"))
    store.set(b"k", b"v", 0, None)
    done = threading.Event()
    errors: list[str] = []
    opened: list[sqlite3.Connection] = []
    ended: list[Any] = []

    def work() -> None:
        try:
            assert isinstance(threading.current_thread(), threading._DummyThread)
            assert store.get(b"k") is not None
            me = threading.get_ident()
            opened.extend(c for (_, thread), (_, _, c) in forkgate._open.items() if thread == me)
            ended.append(weakref.ref(forkgate._local.calls))  # goes with the thread's state
        except BaseException:
            errors.append(traceback.format_exc())
        finally:
            done.set()

    _thread.start_new_thread(work, ())
    assert done.wait(CHILD_DEADLINE)
    assert not errors, errors[0]
    assert opened
    assert not any(_closed(connection) for connection in opened)
    deadline = time.monotonic() + CHILD_DEADLINE
    while ended[0]() is not None:  # the thread's state is cleared after work() returned
        assert time.monotonic() < deadline, "the thread never ended"
        time.sleep(0.005)
    # By the next connection held, from this thread (whose id the ended one never had).
    other = DiskStore(str(tmp_path / "other"))
    other.set(b"k", b"v", 0, None)
    other.close()
    assert all(_closed(connection) for connection in opened)
    assert all(closes), "closed where a fork could land"
    store.close()


def test_a_collected_disk_tier_has_its_connections_closed_only_inside_the_fork_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed tier's shards collected wherever the garbage collector runs (in any
    thread, while another forks) take their threads' connections with them."""
    closes = _record_closes(monkeypatch)
    stores = [DiskStore(str(tmp_path / "disk"))]  # (the thread keeps no reference)
    stores[0].set(b"k", b"v", 0, None)
    opened, stop = threading.Event(), threading.Event()

    def read_and_stay() -> None:
        stores[0].get(b"k")
        opened.set()
        stop.wait()

    thread = threading.Thread(target=read_and_stay)
    thread.start()
    try:
        assert opened.wait(10)
        stores.pop().close()  # this thread's connections: closed (inside the gate)
        gc.collect()
        assert all(closes), "closed where a fork could land"
        closed = len(closes)
        DiskStore(str(tmp_path / "other")).set(b"k", b"v", 0, None)  # opens, holds: drops
        assert len(closes) > closed
        assert all(closes)
    finally:
        stop.set()
        thread.join()
