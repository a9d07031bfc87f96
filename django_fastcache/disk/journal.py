"""The outage journal: which keys were written or deleted while a node was out.

Kept in its own SQLite database in the disk tier's directory, shared by every process on
the host and durable across a process restart (WAL, ``synchronous=NORMAL``). Before a node
that was out serves reads again, every key journaled for it is deleted from it: a node
that was partitioned rather than restarted still holds the values from before the outage.

The journal's write lock (``BEGIN IMMEDIATE``) is also what makes "record while out" and
"replay and bring back" mutually exclusive across processes.

A journal file removed under a running process (a temp cleaner: it is written only during
outages) would keep what that process records away from every other process's replay: a
transaction that finds its file replaced carries it over to the journal at the path first.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from ..client import forksafe
from ..logs import logger
from . import forkgate
from .store import DiskError, as_blob

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    node TEXT NOT NULL,
    key BLOB NOT NULL,
    PRIMARY KEY (node, key)
) WITHOUT ROWID
"""


#: The journal's id, drawn by whichever process makes the file: the node states record the
#: id of the journal an outage's writes went to, so that a replay can tell the journal at
#: the path from one removed while no process ran to carry it over.
_ID_SCHEMA = "CREATE TABLE IF NOT EXISTS identity (id INTEGER NOT NULL)"
_ID_DRAWN = "INSERT INTO identity (id) SELECT ? WHERE NOT EXISTS (SELECT 1 FROM identity)"

#: Journaled in place of a key: "flush the whole node" (the tier's FLUSH_MARK).
_FLUSH = b""


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


#: The journal's files: the database, and the WAL and its index, which SQLite keeps while
#: any connection is open (it removes them at the last one's close) and through which it
#: locks. A cleaner that removes the database, then, from a listing made before, the WAL
#: and index another process made meanwhile, leaves that process writing, and locking,
#: where the next process to open the journal does not.
_SUFFIXES = ("", "-wal", "-shm")

Identity = tuple[tuple[int, int] | None, ...]


def _files_identity(path: str) -> Identity:
    return tuple(_file_identity(path + suffix) for suffix in _SUFFIXES)


class Journal:
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        self._pid = os.getpid()
        #: (device, inode) of each of the files this process's connection opened.
        self._identity: Identity | None = None
        #: The nodes journaled for, and how to mark one out: set by whoever runs the tier
        #: (:mod:`django_fastcache.maintenance`), for carrying a replaced journal over.
        self.node_ids: tuple[str, ...] = ()
        self.mark_out: Callable[[str], None] | None = None
        #: And how to ask for a node's flush at its replay (keys of it lost with a
        #: replaced journal that could not be carried over).
        self.must_flush: Callable[[str], None] | None = None
        #: And how to record, for a node whose keys were carried over, the journal they
        #: are in now: (node id, the new journal's id, the removed one's).
        self.journaled_in: Callable[[str, int, int], None] | None = None
        #: The id of the journal this process's connection opened (0: none open yet).
        self.id = 0
        #: Run at the start of every transaction, under the journal's lock: how the node
        #: states are made current (files replaced under the process) before a journaled
        #: write or a replay reads them.
        self.on_transaction: Callable[[], None] | None = None
        #: Times this process found its journal file replaced and carried it over.
        self.carried_over = 0
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
            connection, identity = self._open_where_it_stays()
            try:  # (read before the connection is kept: its id is the file's, or none)
                row = connection.execute("SELECT id FROM identity").fetchone()
                if row is None:
                    raise sqlite3.DatabaseError("its id is missing")
                journal_id = int(row[0])
            except sqlite3.Error as exc:
                connection.close()
                raise DiskError(f"cannot read the outage journal's id: {exc}") from exc
            self._connection, self._pid = connection, os.getpid()
            forkgate.hold(self, connection, shared=True)  # closed only inside the gate
            self._identity = identity
            self.id = journal_id
        return connection

    def _open_where_it_stays(self) -> tuple[sqlite3.Connection, Identity]:
        """A connection to the journal at ``path`` and the identity of the file it opened.

        SQLite does not say which file it opened: the file at the path before and after the
        open, when they are the same one, is. A file removed and made again meanwhile (a
        temp cleaner, and another process carrying its journal over) would otherwise be
        taken for this connection's, which then journals, and takes the host's lock, in a
        file no other process uses, never found replaced (the consistency checker found
        this). A file made by this open is opened again, to see it stay. The WAL and its
        index, which the open may make, are those at their paths once it is done."""
        # Several processes opening a new journal at once (the first outage) race to
        # switch it to WAL, and SQLite answers the losers "database is locked" at once,
        # without waiting for its busy timeout: try again until the timeout.
        deadline = time.monotonic() + self.timeout
        while True:
            before = _file_identity(self.path)
            try:
                connection = self._open()
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) and time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
                raise DiskError(f"cannot open the outage journal {self.path}: {exc}") from exc
            except sqlite3.Error as exc:
                raise DiskError(f"cannot open the outage journal {self.path}: {exc}") from exc
            after = _files_identity(self.path)
            if before is not None and before == after[0]:
                return connection, after
            connection.close()  # no transaction open: it holds no lock
            if time.monotonic() >= deadline:
                raise DiskError(
                    f"cannot open the outage journal {self.path}: the file kept being "
                    "removed or replaced while it was opened"
                )

    # -- the file removed under the process (an age-based temp cleaner, say) ------------------
    def replaced(self) -> bool:
        """Whether the file this process has open is no longer the journal's path: removed
        (what a temp cleaner does to a file written only during outages) or replaced. What
        this process journals there, no other process will ever replay. A ``stat`` of each
        of its files."""
        return self._connection is not None and _files_identity(self.path) != self._identity

    def _carry_over(self) -> sqlite3.Connection:
        """Copy what the replaced file holds into the journal at the path (made again if
        need be) and return the new connection, inside a new transaction (``BEGIN
        IMMEDIATE``) for the caller: the keys carried are committed before it begins.

        The nodes concerned are marked out again, in the directory's node states: another
        process may have found the new, empty journal and brought them back meanwhile, and
        they must be replayed with these keys before they serve again. A replaced file that
        cannot be read leaves "flush" marks for every node instead (losing a node's content
        is safe, an old value not); so does a carry-over that fails, for the nodes of the
        keys it read."""
        old = self._connection
        assert old is not None
        try:
            rows = [(str(n), bytes(k)) for n, k in old.execute("SELECT node, key FROM journal")]
        except sqlite3.Error:
            rows = [(node_id, _FLUSH) for node_id in self.node_ids]
        with contextlib.suppress(sqlite3.Error):
            old.execute("ROLLBACK")
        with contextlib.suppress(sqlite3.Error):
            old.close()
        self._connection = None
        carried_from = self.id
        nodes = {node_id for node_id, _key in rows}
        try:
            connection = self._connect()
            try:
                connection.execute("BEGIN IMMEDIATE")
                connection.executemany(
                    "INSERT OR IGNORE INTO journal (node, key) VALUES (?, ?)", rows
                )
                self._mark_carried(nodes, carried_from)  # under the lock: no replay between
                # Committed now, not with the caller's transaction: a caller whose own work
                # fails rolls that back, and these keys must not go with it.
                connection.execute("COMMIT")
            except BaseException as exc:
                # Not left open: the transaction would hold the host's journal lock.
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                self.close()
                if isinstance(exc, sqlite3.Error):
                    raise DiskError(
                        f"cannot carry the outage journal over to {self.path}: {exc}"
                    ) from exc
                raise
        except BaseException:
            # The keys read from the removed file are in no journal now: their nodes are
            # flushed whole at their replays instead (asked in the node states, which
            # cannot fail), and kept out until then: on the pages mapped now, then on the
            # directory's if they were removed too (a move carries both marks over).
            self._flush_at_replay(nodes)
            if self.on_transaction is not None:
                with contextlib.suppress(Exception):
                    self.on_transaction()
                self._flush_at_replay(nodes)
            raise
        self.carried_over += 1
        logger.warning(
            "the outage journal %s was removed or replaced under this process; carried %d "
            "journaled key(s) over to a new one (a temp cleaner must leave the disk tier's "
            "directory alone)",
            self.path,
            len(rows),
        )
        try:
            connection.execute("BEGIN IMMEDIATE")  # the caller's transaction
        except sqlite3.Error as exc:
            raise DiskError(f"cannot lock the outage journal: {exc}") from exc
        return connection

    def _mark_carried(self, node_ids: set[str], carried_from: int) -> None:
        """Mark the nodes of keys carried over out again, on the node states every process
        reads now: removed with the journal, those this process maps may be a copy no
        other process reads any more (the cleaner struck after this transaction's own
        check), and a node marked out there only would be brought back, and read, without
        these keys replayed."""
        if self.on_transaction is not None:
            self.on_transaction()
        for node_id in node_ids:
            if self.mark_out is not None:
                self.mark_out(node_id)
            if self.journaled_in is not None:
                self.journaled_in(node_id, self.id, carried_from)  # (the new connection's)

    def _flush_at_replay(self, node_ids: set[str]) -> None:
        for node_id in node_ids:
            if self.must_flush is not None:
                self.must_flush(node_id)
            if self.mark_out is not None:
                self.mark_out(node_id)

    def carry_over_if_replaced(self) -> bool:
        """:meth:`_carry_over` if the file was replaced (the maintenance thread's check)."""
        with self._lock, forkgate.writing():
            if not self.replaced():
                return False
            connection = self._connection
            assert connection is not None
            with contextlib.suppress(sqlite3.Error):
                connection.execute("BEGIN IMMEDIATE")
            connection = self._carry_over()
            try:
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DiskError(f"cannot commit to the outage journal: {exc}") from exc
            return True

    def _open(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(_SCHEMA)
            connection.execute(_ID_SCHEMA)
            # Drawn by the open that finds none (a write: not where one is, as a write
            # would wait for a process holding the journal's lock).
            if connection.execute("SELECT 1 FROM identity").fetchone() is None:
                connection.execute(_ID_DRAWN, (random.getrandbits(62) | 1,))
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
                if self.replaced():
                    connection = self._carry_over()
                if self.on_transaction is not None:
                    self.on_transaction()
                yield connection
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                raise
            try:
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DiskError(f"cannot commit to the outage journal: {exc}") from exc
            # Removed while this transaction ran: what it committed went to a file no other
            # process will read. Carried over before the caller acknowledges anything.
            if self.replaced():
                self.carry_over_if_replaced()

    @staticmethod
    def record(connection: sqlite3.Connection, node_id: str, keys: Iterable[bytes]) -> None:
        """Within :meth:`transaction`: note keys written or deleted while ``node_id`` is out."""
        connection.executemany(
            "INSERT OR IGNORE INTO journal (node, key) VALUES (?, ?)",
            [(node_id, as_blob(key)) for key in keys],
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
        with self._lock, forkgate.writing():  # SQLite's mutexes: no fork meanwhile
            connection, self._connection = self._connection, None
            if connection is not None and self._pid == os.getpid():
                connection.close()
