"""The host-wide write stamps table: moving to the directory's file once it was replaced."""

from __future__ import annotations

import os
from pathlib import Path

from django_fastcache.disk.stamps import WriteStamps


def test_reopen_moves_to_the_file_now_at_the_path(tmp_path: Path) -> None:
    path = str(tmp_path / "stamps.state")
    moving = WriteStamps(path)
    os.unlink(path)  # the directory's file removed under the process...
    staying = WriteStamps(path)  # ...and made again by a process started afterwards
    before = moving.bump(b"k")
    assert staying.current(b"k") != before  # stamped in the removed file: unseen
    moving.reopen()
    assert moving.shared
    stamp = moving.bump(b"k")
    assert staying.current(b"k") == stamp == moving.current(b"k")
    assert staying.bump(b"j") == moving.current(b"j")


def test_reopen_on_a_file_it_cannot_open_keeps_a_table_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "stamps.state"
    stamps = WriteStamps(str(path))
    path.unlink()
    path.mkdir()  # not a file: it cannot be opened
    stamps.reopen()
    assert not stamps.shared
    stamp = stamps.bump(b"k")
    assert stamps.current(b"k") == stamp
