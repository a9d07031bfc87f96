"""The outage journal's file, removed while a process opens it.

A temp cleaner removes the journal (written only during outages) and another process
carries its journal over to a new file at the same path. A process whose open straddled
the two must end up on the file at the path, the one every other process locks and
replays; if it took the new file's identity for the one its connection opened, it would
journal, and take the host-wide lock, in the removed file, never found replaced (the
consistency checker's machine faults found this as stale reads).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from django_fastcache.disk.journal import Journal
from django_fastcache.disk.store import DiskError


def remove_journal_files(directory: Path) -> None:
    for name in os.listdir(directory):
        if name.startswith("journal"):
            os.unlink(directory / name)


def test_a_journal_replaced_while_it_is_opened_is_opened_again_where_it_stays(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "journal.sqlite3")
    first = Journal(path)  # a process on the journal before the cleaner
    with first.transaction():
        pass
    carried: list[Journal] = []

    class OpenedAsTheFileIsReplaced(Journal):
        def _open(self):  # type: ignore[no-untyped-def]
            connection = super()._open()
            if not carried:
                # Right after this open: the cleaner, then another process making the
                # journal again at the path (and keeping it open, as a process does).
                remove_journal_files(tmp_path)
                other = Journal(path)
                with other.transaction():
                    pass
                carried.append(other)
            return connection

    racing = OpenedAsTheFileIsReplaced(path)
    with racing.transaction() as connection:
        Journal.record(connection, "node", [b"key"])
    assert carried, "the open was not raced"
    assert not racing.replaced()
    with carried[0].transaction() as connection:
        assert Journal.keys(connection, "node") == [b"key"]
    # And the host-wide lock is the file's: while it holds it, another waits, in vain.
    impatient = Journal(path, timeout=0.05)
    with (
        racing.transaction(),
        pytest.raises(DiskError, match="cannot lock"),
        impatient.transaction(),
    ):
        pass
    for journal in (first, racing, carried[0], impatient):
        journal.close()


def test_a_journal_whose_wal_and_index_were_removed_is_found_replaced(tmp_path: Path) -> None:
    # The cleaner's listing was made before another process made the journal again: it
    # removes that process's WAL and index, and leaves the database.
    path = str(tmp_path / "journal.sqlite3")
    journal = Journal(path)
    with journal.transaction() as connection:  # made by its own open, and kept
        Journal.record(connection, "node", [b"key"])
    assert not journal.replaced()
    for suffix in ("-wal", "-shm"):
        os.unlink(path + suffix)
    assert journal.replaced()
    with journal.transaction() as connection:  # carried over first
        Journal.record(connection, "node", [b"second"])
    assert not journal.replaced()
    assert journal.carried_over == 1
    other = Journal(path)
    with other.transaction() as connection:
        assert sorted(Journal.keys(connection, "node")) == [b"key", b"second"]
    for each in (journal, other):
        each.close()


def test_a_journal_has_an_id_of_its_own_file(tmp_path: Path) -> None:
    # What a node's state records of the journal its outage's writes went to.
    path = str(tmp_path / "journal.sqlite3")
    first, second = Journal(path), Journal(path)
    try:
        assert first.length() == second.length() == 0  # (opened)
        assert first.id == second.id != 0
        first.close()
        second.close()
        remove_journal_files(tmp_path)
        again = Journal(path)
        again.length()
        assert again.id not in (0, first.id)
        again.close()
    finally:
        first.close()
        second.close()
