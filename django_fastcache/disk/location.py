"""Where a cache's disk tier lives when no ``disk_directory`` is given, and its checks."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Sequence


def default_directory(servers: Sequence[str]) -> str:
    """A directory derived from LOCATION, under the user's cache directory (or temp)."""
    name = hashlib.blake2b(";".join(sorted(servers)).encode(), digest_size=8).hexdigest()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not _usable(base):
        base = os.path.join(tempfile.gettempdir(), f"django-fastcache-{os.getuid()}")
    return os.path.join(base, "django-fastcache", name)


def _usable(base: str) -> bool:
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
    except OSError:
        return False
    return os.access(base, os.W_OK | os.X_OK)


def writable_by_others(directory: str) -> bool:
    """True when the group or others may write to ``directory`` (or it is not ours)."""
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        return False
    return bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or info.st_uid != os.getuid()


def prepare(directory: str) -> None:
    """Create ``directory`` (0700) and refuse one that others may write to."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if writable_by_others(directory):
        raise PermissionError(
            f"the disk tier directory {directory} is writable by other users; "
            "its contents are unpickled: use a directory only this user can write (chmod 700)"
        )
