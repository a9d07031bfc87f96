"""The disk tier's SQLite connections across fork(): a fork at any moment of another thread's
connect leaves a child that works, and a child drops the connections it inherited without
closing them (SQLite's rule: closing one may checkpoint or remove files from under the
parent). No servers: the disk store alone, forked children that exit with a status."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import traceback
from pathlib import Path

import pytest

from django_fastcache.disk import DiskStore

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


def test_a_forked_child_drops_the_parents_connections_and_never_closes_them(
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
                store.set(b"k", b"child", 0, None)  # the child's own connections
                entry = store.get(b"k")
                gc.collect()  # whatever the child dropped is gone now
                store.close()
                still_open = {fd: target for fd, target in _database_files(directory).items()}
                kept = all(still_open.get(fd) == target for fd, target in inherited.items())
                code = 0 if kept and entry is not None and entry.data == b"child" else 2
            finally:
                os._exit(code)
        assert _wait(pid) == 0, "the child closed connections it inherited"
    finally:
        stop.set()
        thread.join()
    # The parent's connections work on.
    entry = store.get(b"k")
    assert entry is not None
    assert entry.data == b"child"
    store.close()


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
