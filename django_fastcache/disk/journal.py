"""The outage journal: which keys were written or deleted while a node was out.

Kept in its own SQLite database in the disk tier's directory, shared by every process on
the host and durable across a process restart (WAL, ``synchronous=NORMAL``). Before a node
that was out serves reads again, every key journaled for it is deleted from it: a node
that was partitioned rather than restarted still holds the values from before the outage.

The journal's write lock (``BEGIN IMMEDIATE``) is also what makes "record while out" and
"replay and bring back" mutually exclusive across processes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator

from ..client import forksafe
from . import forkgate
from .store import DiskError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    node TEXT NOT NULL,
    key BLOB NOT NULL,
    PRIMARY KEY (node, key)
) WITHOUT ROWID
"""


class Journal:
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        self._pid = os.getpid()
        forksafe.register(self)

    def _forget_after_fork(self) -> object:
        """In a forked child: another thread of the parent may have held the lock (a
        journaled write, a replay) at the fork, and nothing in the child would ever release
        it. The inherited SQLite connection is handed over, never used or closed here:
        closing it could checkpoint the parent's database from under it."""
        self._lock = threading.RLock()
        inherited, self._connection = self._connection, None
        return inherited

    def _connect(self) -> sqlite3.Connection:
        connection = self._connection
        if connection is None or self._pid != os.getpid():
            # Several processes opening a new journal at once (the first outage) race to
            # switch it to WAL, and SQLite answers the losers "database is locked" at once,
            # without waiting for its busy timeout: try again until the timeout.
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    connection = self._open()
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" in str(exc) and time.monotonic() < deadline:
                        time.sleep(0.001)
                        continue
                    raise DiskError(f"cannot open the outage journal {self.path}: {exc}") from exc
                except sqlite3.Error as exc:
                    raise DiskError(f"cannot open the outage journal {self.path}: {exc}") from exc
            self._connection, self._pid = connection, os.getpid()
        return connection

    def _open(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(_SCHEMA)
        except BaseException:
            connection.close()
            raise
        return connection

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The journal's host-wide write lock, held until the block ends (commit on success)."""
        with self._lock, forkgate.writing():
            connection = self._connect()
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise DiskError(f"cannot lock the outage journal: {exc}") from exc
            try:
                yield connection
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                raise
            try:
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DiskError(f"cannot commit to the outage journal: {exc}") from exc

    @staticmethod
    def record(connection: sqlite3.Connection, node_id: str, keys: Iterable[bytes]) -> None:
        """Within :meth:`transaction`: note keys written or deleted while ``node_id`` is out."""
        connection.executemany(
            "INSERT OR IGNORE INTO journal (node, key) VALUES (?, ?)",
            [(node_id, key) for key in keys],
        )

    @staticmethod
    def keys(connection: sqlite3.Connection, node_id: str) -> list[bytes]:
        rows = connection.execute("SELECT key FROM journal WHERE node = ?", (node_id,))
        return [bytes(row[0]) for row in rows]

    @staticmethod
    def forget(connection: sqlite3.Connection, node_id: str) -> None:
        connection.execute("DELETE FROM journal WHERE node = ?", (node_id,))

    def length(self, node_id: str | None = None) -> int:
        """Keys waiting to be replayed (for one node, or for all)."""
        with self._lock, forkgate.writing():  # opening it may create it: a write
            try:
                connection = self._connect()
                if node_id is None:
                    row = connection.execute("SELECT COUNT(*) FROM journal").fetchone()
                else:
                    row = connection.execute(
                        "SELECT COUNT(*) FROM journal WHERE node = ?", (node_id,)
                    ).fetchone()
            except sqlite3.Error as exc:
                raise DiskError(f"cannot read the outage journal: {exc}") from exc
        return int(row[0])

    def clear(self) -> None:
        with self.transaction() as connection:
            connection.execute("DELETE FROM journal")

    def close(self) -> None:
        """Close this process's connection (the next use opens a new one)."""
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None and self._pid == os.getpid():
                connection.close()
