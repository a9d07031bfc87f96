"""The disk tier's directory belongs to this user alone (its values are unpickled)."""

from __future__ import annotations

import stat
from pathlib import Path

from django_fastcache.disk import DiskStore


def test_the_values_directory_is_created_for_this_user_only(tmp_path: Path) -> None:
    directory = tmp_path / "tier" / "values"
    store = DiskStore(str(directory))
    try:
        store.set(b"k", b"v", 0, None)
        entry = store.get(b"k")
        assert entry is not None
        assert entry.data == b"v"
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    finally:
        store.close()
