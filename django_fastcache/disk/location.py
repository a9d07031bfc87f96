"""Where a cache's disk tier lives when no ``disk_directory`` is given, and its checks.

The disk tier's values are unpickled when read, so whoever can write to its directory, or
replace it, can run code in the Django process. Like ssh's ``StrictModes``, the directory
is refused unless it and every directory above it are safe: the directory itself owned by
this user and writable by no one else; each parent owned by this user or root and writable
by no one else, unless it has the sticky bit (as ``/tmp`` has), under which nobody may
rename or remove another user's entries. Directories the disk tier creates are made 0700.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shlex
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
    """Whether ``base`` can hold the disk tier: safe, or safe once created."""
    if unsafe_reason(base) is not None:
        return False  # another user's, or anyone's to write: look elsewhere
    try:
        make_private(base)
    except OSError:
        return False
    return os.access(base, os.W_OK | os.X_OK)


def make_private(directory: str) -> None:
    """Create ``directory`` and any missing parent, each 0700 (``os.makedirs`` would give
    the parents the umask's mode, which may let the group write)."""
    missing: list[str] = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise


def unsafe_reason(directory: str) -> str | None:
    """Why ``directory`` (or a directory above it) must not hold the disk tier; None when
    it may. Parts that do not exist yet are not judged (they will be created 0700)."""
    uid = os.getuid()
    target = path = os.path.realpath(directory)
    while True:
        try:
            info = os.stat(path)
        except OSError:  # missing, below a file, out of reach: unwritable_reason says
            info = None
        if info is not None:
            # The directory itself must be ours alone; a parent may be root's too.
            reason = _judge(directory, path, info, uid, own=path == target)
            if reason is not None:
                return reason
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _judge(directory: str, path: str, info: os.stat_result, uid: int, own: bool) -> str | None:
    risk = (
        "another local user could then put values there, and values are unpickled when read "
        "(code run in this process)"
    )
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    mode = f"mode {stat.S_IMODE(info.st_mode):04o}"
    if own:
        if info.st_uid != uid:
            return (
                f"the disk tier directory {directory} is owned by another user "
                f"(uid {info.st_uid}, this process runs as uid {uid}); {risk}. Fix: use a "
                "disk_directory of this user's own"
            )
        if writable:
            return (
                f"the disk tier directory {directory} is writable by other users ({mode}); "
                f"{risk}. Fix: chmod 700 {directory}"
            )
        return None
    if info.st_uid not in (uid, 0):
        return (
            f"the disk tier directory {directory} is refused: its parent {path} is owned by "
            f"another user (uid {info.st_uid}), who could replace the directory; {risk}. Fix: "
            "choose a disk_directory whose every parent is owned by this user or root"
        )
    if writable and not info.st_mode & stat.S_ISVTX:
        return (
            f"the disk tier directory {directory} is refused: its parent {path} is writable "
            f"by other users ({mode}, no sticky bit), who could replace the directory; {risk}. "
            f"Fix: chmod go-w {path}, or choose a disk_directory whose parents only their "
            "owner can write"
        )
    return None


def writable_by_others(directory: str) -> bool:
    """True when another user could write to ``directory`` or replace it."""
    return unsafe_reason(directory) is not None


def unwritable_reason(directory: str) -> str | None:
    """Why this process could not write to the disk tier at ``directory`` (a deploy made
    it read-only, say); None when it can write every part that exists.

    Such a process must not run with the tier: its writes would reach memcached only,
    while processes started earlier (whose files were opened read-write) keep answering
    memcached's misses with the values those writes replaced. Judged with the effective
    ids and capabilities, as a write would be."""
    target = os.path.abspath(directory)
    existing = target
    hidden = False  # a part of the path lies behind a directory this process cannot search
    while True:
        try:
            info = os.stat(existing)
        except (FileNotFoundError, NotADirectoryError):  # (below a file: found further up)
            if os.path.islink(existing):
                return _cannot_make(directory, f"{existing} is a link to nothing")
        except PermissionError:
            hidden = True  # the directory that refuses the search is found further up
        except OSError as exc:  # a loop of links, say
            return _cannot_make(directory, f"{existing}: {exc.strerror}")
        else:
            if not stat.S_ISDIR(info.st_mode):
                return _cannot_make(directory, f"{existing} exists and is not a directory")
            break
        parent = os.path.dirname(existing)
        if parent == existing:
            return None  # (the root itself cannot be looked at: nothing to judge)
        existing = parent
    if existing != target:
        # Not made yet, or out of this process's sight: it will be made in the nearest
        # parent that exists, which is all this process must be able to write and search.
        # What that parent holds besides (/tmp's other files, say) is not the tier's.
        if not os.access(existing, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE):
            return _unwritable(directory, existing, "hidden" if hidden else "missing")
        return None
    existing = os.path.realpath(existing)
    for path, names, files in os.walk(existing):
        if not os.access(path, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE):
            return _unwritable(directory, path)
        for name in files:
            file = os.path.join(path, name)
            if name.endswith(_ROLLBACK_JOURNAL) or _can_write(file):
                continue
            return _unwritable(directory, file)
        # The tier's own files sit within two levels (values/<shard>/cache.db); what
        # lies deeper is large values in files of their own, possibly many.
        depth = 0 if path == existing else os.path.relpath(path, existing).count(os.sep) + 1
        names[:] = [n for n in names if depth < 2 and not os.path.islink(os.path.join(path, n))]
    return None


_EFFECTIVE = os.access in os.supports_effective_ids
#: SQLite's rollback journal: made and removed by every process that creates a shard's
#: database (before its switch to WAL), so it comes and goes while the tree is walked.
_ROLLBACK_JOURNAL = "-journal"


def _can_write(file: str) -> bool:
    """Whether this process may read and write ``file``, or it is gone. A file that went
    while it was listed may be back, made again by another process, by the time it is
    looked for: access() is asked again before the file is blamed."""
    for _attempt in range(3):
        if os.access(file, os.R_OK | os.W_OK, effective_ids=_EFFECTIVE):
            return True
        if not os.path.lexists(file):
            return True  # gone since listed
    return False


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # (no statvfs here)
        return False


def _unwritable(directory: str, path: str, why: str = "") -> str:
    """Why ``directory`` cannot be written, ``path`` being the part that refuses it; ``why``
    is "missing" for a directory not made yet, "hidden" for one behind ``path``."""
    if _read_only_mount(path):
        return (
            f"the disk tier directory {directory} is on a read-only file system ({path}); "
            "its writes would reach memcached only, and processes that opened the directory "
            "earlier would answer later misses with the values those writes replaced. Fix: "
            "mount it read-write, or stop the processes using it and give the new ones a "
            "disk_directory on a writable file system"
        )
    try:
        mode = f"mode {stat.S_IMODE(os.stat(path).st_mode):04o}, owner uid {os.stat(path).st_uid}"
    except OSError as exc:
        mode = str(exc)
    quoted, uid = shlex.quote(directory), os.getuid()
    if why == "missing":
        return (
            f"the disk tier directory {directory} does not exist, and this process (uid "
            f"{os.geteuid()}) cannot make it: {path} ({mode}) is not writable by it. Fix: "
            f"make the directory for it (mkdir -p {quoted} && chmod 700 {quoted} && chown "
            f"{uid} {quoted}; no directory above it may be writable by other users), or "
            "give it a disk_directory it can make"
        )
    if why == "hidden":
        return (
            f"the disk tier directory {directory} is out of this process's reach (uid "
            f"{os.geteuid()}): {path} ({mode}) does not let it search inside. Fix: let it "
            f"in (chmod o+x {shlex.quote(path)}, or a group it belongs to), or give it a "
            "disk_directory it can reach"
        )
    return (
        f"the disk tier directory {directory} is not writable by this process (uid "
        f"{os.geteuid()}): {path} ({mode}); its writes would reach memcached only, and "
        "processes that opened the directory earlier would answer later misses with the "
        f"values those writes replaced. Fix: chmod -R u+rwX {quoted} as its owner (every "
        "process sharing a disk tier must be able to write it), or stop the processes "
        "using it and give the new ones another disk_directory"
    )


def _cannot_make(directory: str, why: str) -> str:
    return (
        f"the disk tier directory {directory} cannot be made: {why}. Fix: set disk_directory "
        "to a directory this process can make (or one it owns, mode 0700)"
    )


def prepare(directory: str) -> None:
    """Create ``directory`` (0700, missing parents too) and refuse an unsafe one, or one
    this process cannot write."""
    reason = unsafe_reason(directory)  # before creating anything under a hostile parent
    if reason is None:
        try:
            make_private(directory)
        except OSError as exc:
            if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
                # Said with the option to change, not as a bare errno: a file in the way
                # (unwritable_reason names it), a path under /proc.
                where = exc.filename or directory
                raise OSError(
                    unwritable_reason(directory)
                    or _cannot_make(directory, f"{exc.strerror} ({where})")
                ) from exc
            # judged below, with the part that cannot be written named
        reason = unsafe_reason(directory) or unwritable_reason(directory)
    if reason is not None:
        raise PermissionError(reason)
