"""The disk tier's directory rules (like ssh's StrictModes): the directory and every
directory above it must be safe from other local users, whose values would be unpickled.

The tests run as root, so hostile directories are made with os.chown to another uid and
chmod; the permission bits are judged, not what root happens to be allowed to do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_fastcache.backends import FastCache
from django_fastcache.checks import check_fastcache_settings
from django_fastcache.disk.location import (
    default_directory,
    prepare,
    unsafe_reason,
    unwritable_reason,
)
from django_fastcache.testing.servers import free_port

OTHER_UID = 4242


@pytest.fixture
def parent(tmp_path: Path) -> Iterator[Path]:
    """A parent directory the test may make hostile; made ours again afterwards."""
    path = tmp_path / "parent"
    path.mkdir(mode=0o755)
    yield path
    os.chown(path, os.getuid(), os.getgid())
    path.chmod(0o755)


needs_chown = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def test_a_safe_chain_is_accepted_and_missing_parts_are_made_0700(parent: Path) -> None:
    target = parent / "a" / "b" / "disk"
    old_umask = os.umask(0o002)  # a umask that would let the group write
    try:
        prepare(str(target))
    finally:
        os.umask(old_umask)
    for path in (parent / "a", parent / "a" / "b", target):
        assert path.stat().st_mode & 0o777 == 0o700, path
    assert unsafe_reason(str(target)) is None


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_parent_others_can_write_is_refused(parent: Path, mode: int) -> None:
    parent.chmod(mode)
    target = parent / "disk"
    with pytest.raises(PermissionError) as caught:
        prepare(str(target))
    message = str(caught.value)
    assert f"its parent {parent} is writable by other users" in message
    assert f"chmod go-w {parent}" in message
    assert not target.exists()  # nothing was created under it


def test_a_sticky_parent_like_tmp_is_accepted(parent: Path) -> None:
    parent.chmod(0o1777)
    prepare(str(parent / "disk"))
    assert unsafe_reason(str(parent / "disk")) is None


@needs_chown
def test_a_parent_owned_by_another_user_is_refused(parent: Path) -> None:
    os.chown(parent, OTHER_UID, -1)
    target = parent / "deeper" / "disk"
    with pytest.raises(PermissionError, match=rf"its parent {parent} is owned by another user"):
        prepare(str(target))
    assert not (parent / "deeper").exists()


@needs_chown
def test_a_directory_owned_by_another_user_is_refused(parent: Path) -> None:
    target = parent / "disk"
    target.mkdir(mode=0o700)
    os.chown(target, OTHER_UID, -1)
    try:
        with pytest.raises(PermissionError, match=f"uid {OTHER_UID}"):
            prepare(str(target))
    finally:
        os.chown(target, os.getuid(), -1)


@needs_chown
def test_the_default_directory_avoids_a_cache_home_of_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = tmp_path / "their-cache"
    hostile.mkdir(mode=0o755)
    os.chown(hostile, OTHER_UID, -1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(hostile))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(mode=0o1777)
    chosen = default_directory(["127.0.0.1:11211"])
    assert not chosen.startswith(str(hostile))
    assert chosen.startswith(str(tmp_path / "tmp" / f"django-fastcache-{os.getuid()}"))
    assert unsafe_reason(chosen) is None


def test_the_backend_refuses_a_directory_under_a_hostile_parent(parent: Path) -> None:
    parent.chmod(0o777)
    directory = parent / "disk"
    cache = FastCache(f"127.0.0.1:{free_port()}", {"OPTIONS": {"disk_directory": str(directory)}})
    with pytest.raises(ImproperlyConfigured, match="writable by other users"):
        cache.get("k")
    assert not directory.exists()


def test_the_system_check_names_a_hostile_parent(parent: Path) -> None:
    parent.chmod(0o777)
    caches = {
        "default": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": "127.0.0.1:11211",
            "OPTIONS": {"disk_directory": str(parent / "disk")},
        }
    }
    with override_settings(CACHES=caches):
        messages = check_fastcache_settings()
    assert [m.id for m in messages] == ["django_fastcache.E014"]
    assert f"its parent {parent}" in messages[0].msg
    assert messages[0].hint.startswith(f"chmod go-w {parent}, or choose")


def test_a_file_gone_since_listed_is_no_reason_to_refuse(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite removes a database's -wal and -shm files when its last connection closes:
    # the walk may list one and find it gone a moment later.
    target = parent / "disk"
    prepare(str(target))
    walk = os.walk

    def walk_listing_a_vanished_wal(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        for path, names, files in walk(top):
            yield path, names, [*files, "cache.db-wal"]

    monkeypatch.setattr("django_fastcache.disk.location.os.walk", walk_listing_a_vanished_wal)
    prepare(str(target))  # does not raise


def _access_refusing(refused: dict[str, int]) -> object:
    """os.access, answering False for the paths in ``refused`` as many times as given
    there (-1: always)."""
    access = os.access

    def fake(path: str, mode: int, **kwargs: object) -> bool:
        left = refused.get(os.path.basename(path), 0)
        if left:
            refused[os.path.basename(path)] = left - 1
            return False
        return access(path, mode, **kwargs)  # type: ignore[arg-type]

    return fake


def test_a_file_gone_and_made_again_while_looked_at_is_no_reason_to_refuse(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forked processes making the tier at once: a file listed by the walk is gone when
    # access() looks for it, and made again by another process when the walk asks whether
    # it still exists (the herd test's children were refused so, once, under Python 3.13).
    target = parent / "disk"
    prepare(str(target))
    (target / "cache.db-wal").write_bytes(b"")
    monkeypatch.setattr(
        "django_fastcache.disk.location.os.access", _access_refusing({"cache.db-wal": 1})
    )
    prepare(str(target))  # does not raise


def test_a_rollback_journal_is_not_judged(parent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite's rollback journal comes and goes with each process that creates a shard's
    # database: whatever access() says of it at one moment says nothing of the tier.
    target = parent / "disk"
    prepare(str(target))
    (target / "cache.db-journal").write_bytes(b"")
    monkeypatch.setattr(
        "django_fastcache.disk.location.os.access", _access_refusing({"cache.db-journal": -1})
    )
    prepare(str(target))  # does not raise


def test_a_file_this_process_cannot_write_is_named(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = parent / "disk"
    prepare(str(target))
    (target / "cache.db").write_bytes(b"")
    monkeypatch.setattr(
        "django_fastcache.disk.location.os.access", _access_refusing({"cache.db": -1})
    )
    with pytest.raises(PermissionError, match="not writable by this process") as refused:
        prepare(str(target))
    assert str(target / "cache.db") in str(refused.value)
    assert "chmod -R u+rwX" in str(refused.value)


def test_a_directory_not_made_yet_is_judged_by_its_parent_alone(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A first deploy's default directory under /tmp, whose other files belong to other
    # users: those are not the tier's, and the process can make its directory there. (The
    # system check blamed one of them, E051, and stopped the deploy's first migrate.)
    (parent / "someone-elses-file").write_bytes(b"")
    monkeypatch.setattr(
        "django_fastcache.disk.location.os.access",
        _access_refusing({"someone-elses-file": -1}),
    )
    assert unwritable_reason(str(parent / "tier" / "not-made-yet")) is None
    assert not (parent / "tier").exists()  # judging makes nothing


def test_a_directory_its_process_cannot_make_names_the_parent_and_the_fix(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = parent / "tier" / "not-made-yet"
    monkeypatch.setattr(
        "django_fastcache.disk.location.os.access", _access_refusing({"parent": -1})
    )
    reason = unwritable_reason(str(target))
    assert reason is not None
    assert f"{target} does not exist" in reason
    assert f"{parent} (mode 0755" in reason
    assert f"mkdir -p {target}" in reason
    caches = {
        "default": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": "127.0.0.1:11211",
            "OPTIONS": {"disk_directory": str(target)},
        }
    }
    with override_settings(CACHES=caches):
        (message,) = check_fastcache_settings()
    assert message.id == "django_fastcache.E051"
    assert "cannot make it" in message.msg
    assert message.hint.startswith(f"make the directory for it (mkdir -p {target}")


@pytest.mark.parametrize("below", ["", "tier"])
def test_a_file_where_the_directory_goes_is_named_by_the_check_and_the_backend(
    parent: Path, below: str
) -> None:
    in_the_way = parent / "a-file"
    in_the_way.write_bytes(b"")
    directory = in_the_way / below if below else in_the_way
    caches = {
        "default": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": f"127.0.0.1:{free_port()}",
            "OPTIONS": {"disk_directory": str(directory)},
        }
    }
    with override_settings(CACHES=caches):
        (message,) = check_fastcache_settings()
    assert message.id == "django_fastcache.E051"
    assert f"{in_the_way} exists and is not a directory" in message.msg
    assert message.hint.startswith("set disk_directory to a directory this process can make")
    cache = FastCache(caches["default"]["LOCATION"], {"OPTIONS": caches["default"]["OPTIONS"]})
    with pytest.raises(ImproperlyConfigured, match="exists and is not a directory"):
        cache.get("k")


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="as root, /proc refuses a new directory with ENOENT; as another user, with "
    "EACCES, judged as a parent it cannot write (tested above)",
)
def test_a_directory_that_cannot_be_made_names_the_option(tmp_path: Path) -> None:
    # Under /proc nothing can be made, whatever the permissions say: the error names the
    # option to change, not just the errno.
    directory = "/proc/fastcache-tier"
    cache = FastCache(f"127.0.0.1:{free_port()}", {"OPTIONS": {"disk_directory": directory}})
    with pytest.raises(ImproperlyConfigured) as refused:
        cache.get("k")
    assert f"the disk tier directory {directory} cannot be made" in str(refused.value)
    assert "Fix: set disk_directory" in str(refused.value)


def _settings_with(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        "default": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": f"127.0.0.1:{free_port()}",
            "OPTIONS": {"disk_directory": str(directory)},
        }
    }


def test_a_loop_of_links_on_the_path_is_named_not_raised(parent: Path) -> None:
    (parent / "one").symlink_to(parent / "two")
    (parent / "two").symlink_to(parent / "one")
    directory = parent / "one" / "tier"
    assert unsafe_reason(str(directory)) is None  # nothing to judge there: no exception
    with override_settings(CACHES=_settings_with(directory)):
        (message,) = check_fastcache_settings()
    assert message.id == "django_fastcache.E051"
    assert "cannot be made" in message.msg
    assert "symbolic links" in message.msg


def test_a_link_to_nothing_where_the_directory_goes_is_named(parent: Path) -> None:
    (parent / "link").symlink_to(parent / "nowhere" / "x")
    directory = parent / "link" / "tier"
    with override_settings(CACHES=_settings_with(directory)):
        (message,) = check_fastcache_settings()
    assert message.id == "django_fastcache.E051"
    assert f"{parent / 'link'} is a link to nothing" in message.msg
    cache = FastCache(f"127.0.0.1:{free_port()}", {"OPTIONS": {"disk_directory": str(directory)}})
    with pytest.raises(ImproperlyConfigured, match="is a link to nothing"):
        cache.get("k")


def test_a_directory_behind_one_this_process_cannot_search_is_named(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a user another's 0700 directory keeps out (the tests run as root, which no
    # permission keeps out: the refusals are made up): stat() of anything inside it fails
    # with EACCES, which must be judged, not raised.
    private = parent / "private"
    (private / "sub").mkdir(parents=True)
    directory = private / "sub" / "tier"
    real_stat = os.stat

    def stat_refusing_inside(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path).startswith(f"{private}{os.sep}"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr("django_fastcache.disk.location.os.stat", stat_refusing_inside)
    monkeypatch.setattr(
        "django_fastcache.disk.location.os.access", _access_refusing({"private": -1})
    )
    assert unsafe_reason(str(directory)) is None
    reason = unwritable_reason(str(directory))
    assert reason is not None
    assert "out of this process's reach" in reason
    assert f"chmod o+x {private}" in reason


@contextlib.contextmanager
def _read_only_mount(path: Path) -> Iterator[Path]:
    """A small tmpfs at ``path``, mounted read-only (root only: skipped otherwise)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a file system needs root and mount(8)")
    path.mkdir(mode=0o700)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        (path / "tier").mkdir(mode=0o700)
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("directory", ["tier", "tier/not-made-yet"])
def test_a_directory_on_a_read_only_file_system_is_refused_naming_it(
    parent: Path, directory: str
) -> None:
    # chmod cannot help there: the message says what can.
    with _read_only_mount(parent / "mount") as mount, pytest.raises(PermissionError) as caught:
        prepare(str(mount / directory))
    assert "read-only file system" in str(caught.value)
    assert "mount it read-write" in str(caught.value)
