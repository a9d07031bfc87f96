"""The host-wide write stamps table: named by the anchor in the tier's directory, kept in
shared memory (a directory standing in for /dev/shm, but in one test), followed by every
process when it moves, and swept when no anchor names it any more."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from django_fastcache import compiled
from django_fastcache.disk import stamps
from django_fastcache.disk.stamps import FILE, SHM, WriteStamps, shm_directory


@pytest.fixture
def shm(tmp_path: Path) -> str:
    root = tmp_path / "shm"
    root.mkdir()
    return str(root)


@pytest.fixture
def anchor(tmp_path: Path) -> str:
    directory = tmp_path / "disk"
    directory.mkdir()
    return str(directory / "stamps.anchor")


def test_two_instances_on_one_anchor_stamp_one_table_in_shared_memory(
    anchor: str, shm: str
) -> None:
    first, second = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    assert first.mode == SHM
    assert first.table_path == second.table_path
    assert os.path.dirname(first.table_path) == shm_directory(shm)
    assert os.stat(shm_directory(shm)).st_mode & 0o777 == 0o700
    assert first.bump(b"k") == second.current(b"k")
    assert second.bump(b"j", gone=True) == first.current(b"j")
    assert os.listdir(os.path.dirname(anchor)) == ["stamps.anchor"]  # nothing else on disk


def test_stamps_and_table_ids_take_62_bits_and_a_wider_stamp_still_matches(
    anchor: str, shm: str
) -> None:
    """Stamps and table ids are drawn in STAMP_BITS bits (compiled, they then stay machine
    integers), over the whole width; a table word holds any 64-bit value, so a process that
    draws wider stamps (an earlier release) shares the table with this one."""
    first, second = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    drawn = [first.bump(b"k%d" % n, gone=n % 2 == 0) for n in range(2000)]
    assert max(drawn) < 2**stamps.STAMP_BITS
    assert max(drawn) >= 2 ** (stamps.STAMP_BITS - 8)  # not a narrower draw
    assert 0 < first._id < 2**stamps.STAMP_BITS
    assert second._id == first._id
    wide = 2**64 - 1  # a write's stamp (lowest bit set) of the full width
    first._words[stamps.slot_of(b"wide")] = wide
    assert second.current(b"wide") == wide
    assert stamps.holds_value(second.current(b"wide"))


def test_the_default_root_is_dev_shm(anchor: str) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    first = WriteStamps(anchor)
    try:
        assert first.mode == SHM
        assert first.table_path.startswith(shm_directory("/dev/shm") + os.sep)
        stamp = first.bump(b"k")
        assert WriteStamps(anchor).current(b"k") == stamp
    finally:
        os.unlink(first.table_path)


def test_a_process_on_a_removed_anchor_follows_the_new_one_at_its_next_stamp(
    anchor: str, shm: str
) -> None:
    moving = WriteStamps(anchor, shm_root=shm)
    old_table = moving.table_path
    os.unlink(anchor)  # the directory's anchor removed under the process...
    staying = WriteStamps(anchor, shm_root=shm)  # ...made again by a process started later
    assert staying.table_path != old_table
    assert not os.path.exists(old_table)  # retired by the process that made the new table
    stamp = moving.bump(b"k")  # its table's id is zeroed: it follows first
    assert moving.table_path == staying.table_path
    assert staying.current(b"k") == stamp
    assert not moving.replaced()
    assert moving.reopen()  # on the directory's anchor already: it stays
    assert moving.table_path == staying.table_path
    assert staying.bump(b"j") == moving.current(b"j")


def test_an_opener_whose_anchor_is_replaced_while_it_waits_for_the_lock_takes_the_new_one(
    anchor: str, shm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process opening the directory while a temp cleaner removes the anchor and another
    process makes it again locks the removed one: it names a table retired meanwhile, and
    a table made for it would retire the one the directory's processes now use."""
    running = WriteStamps(anchor, shm_root=shm)
    first_table = running.table_path
    flock = stamps.fcntl.flock
    made: list[WriteStamps] = []
    armed = [True]

    def replaced_before_the_lock(fd: int, operation: int) -> None:
        if operation == stamps.fcntl.LOCK_EX and armed[0]:
            armed[0] = False
            os.unlink(anchor)  # the cleaner...
            made.append(WriteStamps(anchor, shm_root=shm))  # ...and a process started then
        flock(fd, operation)

    monkeypatch.setattr(stamps.fcntl, "flock", replaced_before_the_lock)
    opener = WriteStamps(anchor, shm_root=shm)
    monkeypatch.undo()
    [maker] = made
    assert maker.table_path != first_table
    assert os.path.exists(maker.table_path)  # not retired by the opener
    assert opener.table_path == maker.table_path
    assert not opener.replaced()
    stamp = maker.bump(b"k")
    assert opener.current(b"k") == stamp
    assert maker.table_path == opener.table_path  # the maker did not have to move
    assert running.bump(b"j") == opener.current(b"j")  # the first follows at its next stamp
    assert running.table_path == maker.table_path
    assert set(os.listdir(shm_directory(shm))) == {os.path.basename(maker.table_path)}


def test_an_anchor_replaced_at_every_attempt_is_a_clear_error_and_leaves_the_tables_alone(
    anchor: str, shm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = WriteStamps(anchor, shm_root=shm)
    stamp = running.bump(b"k")
    flock = stamps.fcntl.flock
    swaps = [0]

    def replaced_before_every_lock(fd: int, operation: int) -> None:
        if operation == stamps.fcntl.LOCK_EX:
            swaps[0] += 1
            os.unlink(anchor)  # another file at the path each time
            Path(anchor).touch(mode=0o600)
        flock(fd, operation)

    monkeypatch.setattr(stamps.fcntl, "flock", replaced_before_every_lock)
    with pytest.raises(OSError, match="kept being replaced") as raised:
        WriteStamps(anchor, shm_root=shm)
    monkeypatch.undo()
    assert raised.value.errno == errno.EAGAIN
    assert "Fix: keep temp cleaners and deploys from removing files" in str(raised.value)
    assert swaps[0] == stamps._OPEN_ATTEMPTS
    assert running.current(b"k") == stamp  # its table untouched
    assert os.listdir(shm_directory(shm)) == [os.path.basename(running.table_path)]


def test_a_table_left_in_a_removed_directory_is_followed_at_the_check_of_the_files(
    anchor: str, shm: str
) -> None:
    """Without /dev/shm the table is a file in the directory: removed with it, no process
    can reach it to retire it, and a process still on it stamps it until its check of the
    files finds the anchor replaced and moves it (reopen). The first to move marks the
    anchor it left, and the others on it follow at their next call."""
    _missing(shm)
    moving, other = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    assert moving.mode == FILE
    shutil.rmtree(os.path.dirname(anchor))
    os.mkdir(os.path.dirname(anchor))
    staying = WriteStamps(anchor, shm_root=shm)  # a process started afterwards
    before = moving.bump(b"k")
    assert staying.current(b"k") != before  # stamped in the table removed: unseen
    assert moving.replaced()
    assert moving.reopen()
    assert moving.table_path == staying.table_path
    stamp = moving.bump(b"k")
    assert staying.current(b"k") == stamp == moving.current(b"k")
    assert other.current(b"k") == stamp  # followed the anchor the mover marked
    assert other.table_path == staying.table_path
    assert staying.bump(b"j") == moving.current(b"j") == other.current(b"j")


def test_an_anchor_removed_without_shared_memory_has_its_table_in_the_directory_retired(
    anchor: str, shm: str
) -> None:
    _missing(shm)  # the table is a file in the directory, and stays there with the anchor gone
    moving = WriteStamps(anchor, shm_root=shm)
    old_table = moving.table_path
    os.unlink(anchor)
    staying = WriteStamps(anchor, shm_root=shm)
    assert staying.mode == FILE
    assert staying.table_path != old_table
    assert not os.path.exists(old_table)
    left = set(os.listdir(os.path.dirname(anchor)))
    assert left == {"stamps.anchor", os.path.basename(staying.table_path)}
    stamp = moving.bump(b"k")  # follows first
    assert moving.table_path == staying.table_path
    assert staying.current(b"k") == stamp


def test_a_table_made_in_another_mount_namespace_is_not_retired(anchor: str, shm: str) -> None:
    """A path names one directory only within one mount namespace: another site's process,
    in a namespace of its own (a container, systemd's PrivateTmp) sharing /dev/shm, may
    have its own directory at the same path. Its table is left alone, and it stays on it."""
    assert stamps.mount_namespace() != 0
    found = stamps.table_header(WriteStamps(anchor, shm_root=shm).table_path)
    assert found is not None
    assert found[2] == stamps.mount_namespace()
    elsewhere = WriteStamps(anchor, shm_root=shm)
    with open(elsewhere.table_path, "r+b") as table:  # as made in another namespace
        table.seek(stamps._NAMESPACE_AT)
        table.write(struct.pack("=Q", stamps.mount_namespace() + 1))
    stamp = elsewhere.bump(b"k")
    os.unlink(anchor)  # here, a directory made again at the same path
    here = WriteStamps(anchor, shm_root=shm)
    assert here.table_path != elsewhere.table_path
    assert os.path.exists(elsewhere.table_path)
    assert elsewhere.current(b"k") == stamp  # still on its own table
    assert elsewhere.table_path != here.table_path


def test_retiring_leaves_the_tables_of_other_anchors_and_non_tables_alone(
    tmp_path: Path, shm: str
) -> None:
    def make(name: str) -> WriteStamps:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        return WriteStamps(str(directory / "stamps.anchor"), shm_root=shm)

    kept, removed = make("kept"), make("removed")
    stamp = kept.bump(b"k")
    tables = shm_directory(shm)
    odd = {
        "0000000000000002.stamps": lambda path: Path(path).write_bytes(b"x" * 64),
        "0000000000000003.stamps": os.mkdir,
        "0000000000000004.stamps": os.mkfifo,
        "0000000000000005.stamps": lambda path: os.symlink(removed.table_path, path),
    }
    for name, put in odd.items():
        put(os.path.join(tables, name))
    os.unlink(tmp_path / "removed" / "stamps.anchor")
    replacing = make("removed")
    assert not os.path.exists(removed.table_path)
    left = set(os.listdir(tables))
    assert left == {
        os.path.basename(kept.table_path),
        os.path.basename(replacing.table_path),
        *odd,
    }
    assert kept.current(b"k") == stamp  # its table is untouched: nothing to follow
    assert kept.table_path != replacing.table_path
    assert removed.bump(b"j") == replacing.current(b"j")
    assert replacing.table_path == removed.table_path


def test_an_anchor_removed_under_the_processes_is_noticed_and_the_first_to_move_pulls_the_rest(
    anchor: str, shm: str
) -> None:
    mover, other = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    assert not mover.replaced()
    os.unlink(anchor)  # a temp cleaner: the anchor is written only when a table is made
    assert mover.replaced()
    newer = WriteStamps(anchor, shm_root=shm)  # a process started afterwards
    assert mover.replaced()
    assert other.replaced()
    mover.reopen()
    assert not mover.replaced()
    assert mover.table_path == newer.table_path
    stamp = newer.bump(b"k")
    assert other.current(b"k") == stamp  # it followed at once: the mover marked the anchor
    assert other.table_path == newer.table_path
    assert not other.replaced()


def test_a_slot_found_before_the_table_moved_stamps_and_reads_the_key_in_the_new_table(
    anchor: str, shm: str
) -> None:
    # A tiered set or delete finds its key's slot once, then stamps and reads it by slot
    # around the round trip to memcached; the process may move to another table in between.
    mover, reader, writer = (WriteStamps(anchor, shm_root=shm) for _ in range(3))
    slot = stamps.slot_of(b"k")
    assert mover.bump_slot(slot) == reader.current(b"k")
    assert reader.bump(b"k", gone=True) == mover.current_slot(slot)
    assert mover.bump(b"j") != mover.current_slot(slot)  # another key's slot
    os.unlink(anchor)
    old_table = mover.table_path
    mover.bump_slot(slot)  # stamped in the table it maps: no other is named yet
    newer = WriteStamps(anchor, shm_root=shm)  # a process started afterwards retires it
    assert mover.current_slot(slot) == newer.current(b"k") == 0  # the new table's, unwritten
    assert mover.table_path == newer.table_path != old_table
    written = mover.bump_slot(slot)
    assert newer.current(b"k") == written
    assert stamps.holds_value(written)
    # The others follow too (their table retired), each at its first call: a read, a write.
    assert reader.current_slot(slot) == written
    deleted = writer.bump_slot(slot, gone=True)
    assert writer.table_path == newer.table_path
    assert newer.current(b"k") == deleted == mover.current_slot(slot)
    assert not stamps.holds_value(deleted)


def test_replace_slot_stamps_the_slot_and_returns_the_stamp_it_replaced(
    anchor: str, shm: str
) -> None:
    # A tiered delete reads its key's stamp (the entry it may answer from) and stamps the
    # slot gone, in one call.
    first, second = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    slot = stamps.slot_of(b"k")
    before, written = first.replace_slot(slot)
    assert before == 0  # never written
    assert second.current(b"k") == written
    assert stamps.holds_value(written)
    before, deleted = second.replace_slot(slot, gone=True)
    assert before == written
    assert first.current(b"k") == deleted != written
    assert not stamps.holds_value(deleted)


def test_replace_slot_follows_a_moved_table_first_and_refuses_when_it_cannot(
    anchor: str, shm: str, monkeypatch: Any
) -> None:
    monkeypatch.setattr(stamps, "RETRY_INTERVAL", 0.0)  # every call tries again
    old = WriteStamps(anchor, shm_root=shm)
    slot = stamps.slot_of(b"k")
    left_behind = old.bump_slot(slot)
    os.unlink(old.table_path)
    new = WriteStamps(anchor, shm_root=shm)  # another table, named by the anchor
    written = new.bump(b"k")
    before, deleted = old.replace_slot(slot, gone=True)
    assert before == written != left_behind  # the table the others stamp, not its own
    assert new.current(b"k") == deleted
    assert old.table_path == new.table_path
    os.unlink(new.table_path)
    newer = WriteStamps(anchor, shm_root=shm)

    def out_of_descriptors(path: Any, *args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", out_of_descriptors)
    with pytest.raises(stamps.StampsUnavailable):
        old.replace_slot(slot, gone=True)
    assert old._words[slot] == deleted  # not stamped in the table it could not leave
    monkeypatch.undo()
    assert newer.current(b"k") == 0


def test_reopen_on_the_directory_s_anchor_moves_nobody(anchor: str, shm: str) -> None:
    first, second = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    table = first.table_path
    first.reopen()
    stamp = second.bump(b"k")
    assert first.current(b"k") == stamp
    assert first.table_path == second.table_path == table


def test_reopen_after_the_directory_was_removed_and_made_again(anchor: str, shm: str) -> None:
    moving = WriteStamps(anchor, shm_root=shm)
    shutil.rmtree(os.path.dirname(anchor))
    os.mkdir(os.path.dirname(anchor))
    staying = WriteStamps(anchor, shm_root=shm)
    moving.reopen()
    assert moving.table_path == staying.table_path
    assert moving.bump(b"k") == staying.current(b"k")
    assert staying.bump(b"k") == moving.current(b"k")


def test_reopen_on_an_anchor_it_cannot_open_refuses_writes_rather_than_stamp_alone(
    anchor: str, shm: str, monkeypatch: Any
) -> None:
    monkeypatch.setattr(stamps, "RETRY_INTERVAL", 0.0)
    staying = WriteStamps(anchor, shm_root=shm)
    moving = WriteStamps(anchor, shm_root=shm)
    os.unlink(anchor)
    os.mkdir(anchor)  # not a file: it cannot be opened
    assert not moving.reopen()  # no table of its own, and the anchor it left names none
    for each in (moving, staying):
        assert each.current(b"k") == 0
        with pytest.raises(stamps.StampsUnavailable):
            each.bump(b"k")
    os.rmdir(anchor)  # an anchor can be made again: both follow it at their next call
    stamp = moving.bump(b"k")
    assert staying.current(b"k") == stamp
    assert moving.table_path == staying.table_path


def test_an_anchor_that_is_a_symlink_is_refused(anchor: str, shm: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.anchor"
    WriteStamps(str(elsewhere), shm_root=shm)
    os.symlink(elsewhere, anchor)
    with pytest.raises(OSError, match="disk_tier"):
        WriteStamps(anchor, shm_root=shm)


def test_no_table_at_all_refuses_the_process_rather_than_stamping_one_of_its_own(
    anchor: str, shm: str, monkeypatch: Any
) -> None:
    # The table vanished and no new one can be made (a full disk): a process stamping a
    # table of its own would leave the others' older entries answering its writes.
    running = WriteStamps(anchor, shm_root=shm)
    os.unlink(running.table_path)

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match="could not be opened or made"):
        WriteStamps(anchor, shm_root=shm)
    stamp = running.bump(b"k")  # the anchor still names the running processes' table
    assert running.current(b"k") == stamp


def test_a_process_that_cannot_follow_now_misses_and_follows_later(
    anchor: str, shm: str, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stamps, "RETRY_INTERVAL", 0.0)  # every call tries again
    old = WriteStamps(anchor, shm_root=shm)
    stamp = old.bump(b"k")
    os.unlink(old.table_path)
    new = WriteStamps(anchor, shm_root=shm)  # a table in the directory, named by the anchor
    real_open = os.open

    def out_of_descriptors(path: Any, *args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", out_of_descriptors)
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        assert old.current(b"k") == 0  # not its old table's stamp: nothing on disk answers
        assert old.current(b"k") == 0
        with pytest.raises(stamps.StampsUnavailable):
            old.bump(b"k")  # a write that would not hide the others' entries: refused
        with pytest.raises(stamps.StampsUnavailable):
            old.reset()
    assert stamp != 0
    assert sum("could not be followed" in r.getMessage() for r in caplog.records) == 1
    assert os.path.exists(new.table_path)  # a passing failure replaces nothing
    monkeypatch.setattr(os, "open", real_open)
    assert old.bump(b"k") == new.current(b"k")
    assert old.table_path == new.table_path


def test_a_failed_follow_is_tried_again_only_after_the_retry_interval(
    anchor: str, shm: str, monkeypatch: Any
) -> None:
    old = WriteStamps(anchor, shm_root=shm)
    os.unlink(old.table_path)
    WriteStamps(anchor, shm_root=shm)
    opened: list[Any] = []

    def out_of_descriptors(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(path)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", out_of_descriptors)
    monkeypatch.setattr(stamps, "RETRY_INTERVAL", 3600.0)
    for _ in range(5):
        assert old.current(b"k") == 0
    assert len(opened) == 1  # one try, not one per call (the writer calls per key)


def test_a_reopen_that_fails_refuses_writes_until_one_succeeds(
    anchor: str, shm: str, monkeypatch: Any
) -> None:
    # The anchor was replaced (the directory made again); this process cannot open the
    # new one now. It must not go on stamping the table of the anchor it left.
    monkeypatch.setattr(stamps, "RETRY_INTERVAL", 0.0)
    moving = WriteStamps(anchor, shm_root=shm)
    os.unlink(anchor)
    staying = WriteStamps(anchor, shm_root=shm)
    real_open = os.open

    def out_of_descriptors(path: Any, *args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", out_of_descriptors)
    assert moving.replaced()
    assert not moving.reopen()
    assert moving.current(b"k") == 0
    with pytest.raises(stamps.StampsUnavailable):
        moving.bump(b"k")
    monkeypatch.setattr(os, "open", real_open)
    stamp = moving.bump(b"k")  # follows at this call
    assert staying.current(b"k") == stamp
    assert not moving.replaced()


def test_an_unreadable_boot_id_keeps_the_table(
    anchor: str, shm: str, tmp_path: Path, monkeypatch: Any
) -> None:
    first = WriteStamps(anchor, shm_root=shm)
    stamp = first.bump(b"k")
    monkeypatch.setattr(stamps, "_BOOT_ID", str(tmp_path / "missing"))  # says no boot
    second = WriteStamps(anchor, shm_root=shm)
    assert second.table_path == first.table_path
    assert second.current(b"k") == stamp


def test_a_vanished_table_is_replaced_by_one_in_the_directory_that_every_process_follows(
    anchor: str, shm: str, caplog: pytest.LogCaptureFixture
) -> None:
    reading, writing = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    earlier = writing.bump(b"k")
    os.unlink(writing.table_path)  # RemoveIPC, an admin...
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        newer = WriteStamps(anchor, shm_root=shm)
    assert newer.mode == FILE
    assert os.path.dirname(newer.table_path) == os.path.dirname(anchor)
    assert "RemoveIPC" in caplog.text
    assert "miss" in caplog.text
    # The older instances follow at their next call, a read or a write.
    assert reading.current(b"k") == 0 != earlier  # the earlier stamps are gone
    assert reading.table_path == newer.table_path
    assert writing.bump(b"j") == newer.current(b"j")
    assert writing.table_path == newer.table_path
    assert newer.bump(b"k") == reading.current(b"k") == writing.current(b"k")
    # The table stays in the directory (every process meets there), shm usable or not.
    assert WriteStamps(anchor, shm_root=shm).table_path == newer.table_path


def test_a_new_boot_gets_a_new_table(
    anchor: str, shm: str, tmp_path: Path, monkeypatch: Any
) -> None:
    before = WriteStamps(anchor, shm_root=shm)
    stamp = before.bump(b"k")
    old_table = before.table_path
    boot_id = tmp_path / "boot_id"  # what the kernel says of another boot
    boot_id.write_text("00000000-0000-1234-8000-000000000000\n")
    monkeypatch.setattr(stamps, "_BOOT_ID", str(boot_id))
    after = WriteStamps(anchor, shm_root=shm)
    assert after.mode == SHM
    assert after.table_path != old_table
    assert not os.path.exists(old_table)  # named no more
    assert after.current(b"k") == 0
    assert before.current(b"k") == 0 != stamp  # followed the anchor
    assert WriteStamps(anchor, shm_root=shm).table_path == after.table_path  # and it stays


def _missing(root: str) -> None:
    os.rmdir(root)


def _symlinked(root: str) -> None:
    target = root + "-target"
    os.mkdir(target, 0o700)
    os.symlink(target, shm_directory(root))


def _open_to_others(root: str) -> None:
    os.mkdir(shm_directory(root))
    os.chmod(shm_directory(root), 0o755)


def _another_owner(root: str) -> None:
    if os.getuid() != 0:
        pytest.skip("giving a directory to another user takes root")
    os.mkdir(shm_directory(root), 0o700)
    os.chown(shm_directory(root), 65534, 65534)


@pytest.mark.parametrize("spoil", [_missing, _symlinked, _open_to_others, _another_owner])
def test_an_unusable_shared_memory_root_puts_the_table_in_the_directory(
    anchor: str, shm: str, spoil: Any
) -> None:
    spoil(shm)
    first, second = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    assert first.mode == FILE
    assert os.path.dirname(first.table_path) == os.path.dirname(anchor)
    assert first.table_path == second.table_path
    assert first.bump(b"k") == second.current(b"k")


def test_a_full_shared_memory_puts_the_table_in_the_directory(
    anchor: str, shm: str, monkeypatch: Any
) -> None:
    allocate = os.posix_fallocate

    def full(fd: int, offset: int, length: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(shm + os.sep):
            raise OSError(errno.ENOSPC, "No space left on device")
        allocate(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", full)
    first = WriteStamps(anchor, shm_root=shm)
    assert first.mode == FILE
    assert os.listdir(shm_directory(shm)) == []  # the table it began is gone
    stamp = first.bump(b"k")
    assert WriteStamps(anchor, shm_root=shm).current(b"k") == stamp


def test_a_sweep_removes_old_tables_no_anchor_names(
    tmp_path: Path, shm: str, monkeypatch: Any
) -> None:
    def make(name: str) -> WriteStamps:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        return WriteStamps(str(directory / "stamps.anchor"), shm_root=shm)

    removed = make("removed")  # its directory will be deleted
    replaced = make("replaced")  # its anchor will name another table
    live = make("live")
    shutil.rmtree(tmp_path / "removed")
    os.unlink(tmp_path / "replaced" / "stamps.anchor")
    replacing = make("replaced")
    assert not os.path.exists(replaced.table_path)  # retired at once, by its maker
    junk = os.path.join(shm_directory(shm), "0000000000000001.stamps")  # no header
    Path(junk).write_bytes(b"")
    other = os.path.join(shm_directory(shm), "other")
    Path(other).write_bytes(b"")
    make("young")  # a sweep: all of them younger than SWEEP_AGE
    assert os.path.exists(removed.table_path)  # its directory was not made again
    assert os.path.exists(junk)
    monkeypatch.setattr(stamps, "SWEEP_AGE", -1.0)  # from now on every table is old enough
    last = make("last")
    left = set(os.listdir(shm_directory(shm)))
    assert os.path.basename(removed.table_path) not in left
    assert os.path.basename(junk) not in left
    for kept in (live, replacing, last):
        assert os.path.basename(kept.table_path) in left
    assert "other" in left  # not a table's name
    stamp = live.bump(b"k")
    assert make("live").current(b"k") == stamp


def test_a_sweep_keeps_a_table_its_processes_touch_though_its_anchor_path_moved(
    tmp_path: Path, shm: str
) -> None:
    def make(name: str) -> WriteStamps:
        directory = tmp_path / name
        directory.mkdir()
        return WriteStamps(str(directory / "stamps.anchor"), shm_root=shm)

    moved, removed = make("moved"), make("removed")
    os.rename(tmp_path / "moved", tmp_path / "renamed")  # its header's path resolves no more
    shutil.rmtree(tmp_path / "removed")
    long_ago = time.time() - 2 * stamps.SWEEP_AGE
    for table in (moved, removed):
        os.utime(table.table_path, (long_ago, long_ago))
    moved.touch()  # its processes' maintenance threads: in use
    make("sweeping")
    left = set(os.listdir(shm_directory(shm)))
    assert os.path.basename(moved.table_path) in left
    assert os.path.basename(removed.table_path) not in left
    assert moved.current(b"k") == 0
    stamp = moved.bump(b"k")
    assert moved.current(b"k") == stamp


def test_reset_hides_every_stamp_for_every_process(anchor: str, shm: str) -> None:
    first, second = WriteStamps(anchor, shm_root=shm), WriteStamps(anchor, shm_root=shm)
    first.bump(b"k")
    second.reset()
    assert first.current(b"k") == 0


@pytest.mark.skipif(
    compiled.is_compiled("django_fastcache.disk.stamps"),
    reason="puts a stand-in for the table's words, which compiled code types strictly",
)
@pytest.mark.skipif(stamps.mount_namespace() == 0, reason="no mount namespace: no retiring")
@pytest.mark.parametrize("followed_meanwhile", [False, True], ids=["alone", "followed"])
def test_a_reset_during_which_the_table_is_retired_resets_the_new_one_too(
    anchor: str, shm: str, followed_meanwhile: bool
) -> None:
    """A clear whose table is retired while it zeroes it: entries stamped in the table the
    others moved to, before the clear, must not answer after it either. ``followed``:
    another thread of the process follows the new table before the clear zeroes the old
    one (the clear must check the table it zeroed, not the one installed since)."""
    resetting = WriteStamps(anchor, shm_root=shm)
    made: list[WriteStamps] = []

    class RetiredWhileZeroed:
        def __init__(self, words: Any) -> None:
            self.words = words

        def __getitem__(self, where: Any) -> Any:
            return self.words[where]

        def __setitem__(self, where: Any, data: Any) -> None:
            if isinstance(where, slice) and not made:
                os.unlink(anchor)  # the anchor removed, and a process started then...
                made.append(WriteStamps(anchor, shm_root=shm))
                made[0].bump(b"k")  # ...writes before the clear returns
                if followed_meanwhile:
                    resetting.current(b"x")  # (as another thread's call would)
            self.words[where] = data

    resetting._words = RetiredWhileZeroed(resetting._words)
    resetting.reset()
    [other] = made
    assert resetting.table_path == other.table_path
    assert other.current(b"k") == 0
    assert resetting.current(b"k") == 0


def test_touch_marks_the_anchor_in_use_for_age_based_cleaners(anchor: str, shm: str) -> None:
    stamps = WriteStamps(anchor, shm_root=shm)
    os.utime(anchor, (1_000_000, 1_000_000))  # as old as a cleaner would take
    stamps.touch()
    assert time.time() - os.stat(anchor).st_mtime < 3600
    assert not stamps.replaced()  # the same file, only its times changed


def test_the_previous_format_s_table_is_removed(anchor: str, shm: str) -> None:
    old = os.path.join(os.path.dirname(anchor), "stamps.state")
    Path(old).write_bytes(bytes(4096))
    WriteStamps(anchor, shm_root=shm)
    assert not os.path.exists(old)


def test_a_test_run_drops_the_tables_of_its_directories(tmp_path: Path, shm: str) -> None:
    from django_fastcache.testing.stamps import drop_tables

    (tmp_path / "run" / "a").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    dropped = WriteStamps(str(tmp_path / "run" / "a" / "stamps.anchor"), shm_root=shm)
    kept = WriteStamps(str(tmp_path / "other" / "stamps.anchor"), shm_root=shm)
    drop_tables(tmp_path / "run", shm_root=shm)
    assert not os.path.exists(dropped.table_path)
    assert os.path.exists(kept.table_path)


def _exit_status(pid: int, deadline: float = 20.0) -> int:
    """The child's exit status; -1 when it had to be killed (it hung)."""
    end = time.monotonic() + deadline
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.005)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_while_a_thread_followed_follows_too(anchor: str, shm: str) -> None:
    own = WriteStamps(anchor, shm_root=shm)
    os.unlink(own.table_path)
    stamp = WriteStamps(anchor, shm_root=shm).bump(b"k")  # in a new table
    with own._guard.target:  # another thread of the parent following at the fork
        pid = os.fork()
        if pid == 0:
            os._exit(0 if own.current(b"k") == stamp else 1)
    assert _exit_status(pid) == 0


def test_an_anchor_that_cannot_be_checked_is_reported_as_asked(tmp_path: Path, shm: str) -> None:
    # A stat failing otherwise than for a missing file (here: a symbolic link loop in the
    # anchor's place): the maintenance thread does not move for it, the copies in memory
    # do not answer after it.
    anchor = str(tmp_path / "stamps.anchor")
    stamps = WriteStamps(anchor, shm_root=shm)
    assert stamps.replaced() is False
    assert stamps.replaced(unknown=True) is False
    os.unlink(anchor)
    os.symlink(anchor, anchor)
    assert stamps.replaced() is False
    assert stamps.replaced(unknown=True) is True
