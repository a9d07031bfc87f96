"""Removing the write stamps tables a test run made in /dev/shm."""

from __future__ import annotations

import contextlib
import os

from ..disk.stamps import SHM_ROOT, shm_directory, table_anchor


def drop_tables(directory: str | os.PathLike[str], shm_root: str = SHM_ROOT) -> None:
    """Remove the tables in ``shm_root`` of the disk tiers under ``directory``: each pins
    8 MiB of memory, and one whose tier directory is kept (pytest keeps its last runs'
    tmp_path) stays named, out of the sweep's reach; one whose directory is removed stays
    until the next sweep, a minute later at the earliest."""
    root = os.path.abspath(directory) + os.sep
    tables = shm_directory(shm_root)
    with contextlib.suppress(OSError):
        for name in os.listdir(tables):
            path = os.path.join(tables, name)
            with contextlib.suppress(OSError):
                found = table_anchor(path)
                if found is not None and found[1].startswith(root):
                    os.unlink(path)
