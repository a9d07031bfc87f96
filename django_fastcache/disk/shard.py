"""A disk tier shard: diskcache's ``Cache``, its SQLite connections opened and closed (and
its reads made) inside the fork gate, and never closed in a forked child (see
:mod:`.forkgate`).

diskcache opens a connection per thread on first use, and closes the one a thread holds
when it finds the process id changed. Both are what a fork must not cut through, or a child
must not do: here a connection is opened (and closed) with no fork under way, held for the
fork hook, and one inherited over a fork is dropped, never closed.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import diskcache

from . import forkgate


class Shard(diskcache.Cache):  # type: ignore[misc]
    """A ``Cache`` whose connections are fork-safe (see the module's docstring)."""

    @property
    def _con(self) -> sqlite3.Connection:
        local = self._local
        con: sqlite3.Connection | None = getattr(local, "con", None)
        if con is not None and local.pid == forkgate.pid:
            return con
        return self._connect()

    def _connect(self) -> sqlite3.Connection:
        with forkgate.writing():  # SQLite's process-wide mutexes: no fork meanwhile
            local = self._local
            if getattr(local, "pid", None) != os.getpid():
                # Opened by the parent: dropped (the fork hook keeps it), never closed.
                local.__dict__.pop("con", None)
                local.pid = os.getpid()
            con: sqlite3.Connection | None = getattr(local, "con", None)
            if con is None:
                con = local.con = self._open()
            forkgate.hold(self, con)
            return con

    def _open(self) -> sqlite3.Connection:
        """diskcache's own connection (its ``_con``), but one any thread may close: the
        fork gate closes those of ended threads (see :mod:`.forkgate`)."""
        con = sqlite3.connect(
            os.path.join(self._directory, diskcache.core.DBNAME),
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        self._local.con = con
        # The pragmas that hold per connection, as diskcache sets them on its own.
        try:
            settings = con.execute("SELECT key, value FROM Settings").fetchall()
        except sqlite3.OperationalError:
            pass
        else:
            for key, value in settings:
                if key.startswith("sqlite_"):
                    self.reset(key, value, update=False)
        return con

    # The shard's reads the disk tier makes outside the gate of its writes.
    def get(self, *args: Any, **kwargs: Any) -> Any:
        forkgate.enter()
        try:
            return super().get(*args, **kwargs)
        finally:
            forkgate.leave()

    def volume(self) -> int:
        forkgate.enter()
        try:
            return int(super().volume())
        finally:
            forkgate.leave()

    def close(self) -> None:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.__dict__.pop("con", None)  # the parent's: dropped, never closed
            return
        with forkgate.writing():
            super().close()


def adopt(fanout: diskcache.FanoutCache) -> tuple[Shard, ...]:
    """Make ``fanout``'s shards :class:`Shard` s (just built, in this thread, inside the
    fork gate). The connections their construction opened are diskcache's own, which only
    this thread may close: closed now, and opened again as :class:`Shard` s open theirs."""
    shards: tuple[Any, ...] = tuple(fanout._shards)
    for shard in shards:
        shard.close()  # (diskcache's close, still: the class is not switched yet)
        shard.__class__ = Shard
    return shards
