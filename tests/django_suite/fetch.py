"""Fetch Django's own cache test suite for the Django version that is installed.

Django does not ship its tests in the wheel, only in the sdist. At test time the sdist of
exactly ``django.__version__`` is downloaded from the package index with pip, and only its
``tests/cache/`` directory is extracted, as a package named ``cache`` (the suite imports its
own ``.models`` and names ``cache.tests.custom_key_func`` in a setting, so that is the name
it must have). Nothing of Django's is copied into this repository: everything lands under
``.cache/django-suite/<version>/`` (git-ignored) and is reused on later runs, offline too::

    .cache/django-suite/5.2.19/
        sdist/django-5.2.19.tar.gz
        pkg/cache/{__init__,models,tests,...}.py    <- pkg/ goes on sys.path
        pkg/cache/.complete                          <- written last, after a full extraction
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from types import ModuleType

import django
from django.conf import settings
from django.test import override_settings

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = REPO_ROOT / ".cache" / "django-suite"
PACKAGE = "cache"
COMPLETE_MARKER = ".complete"
DOWNLOAD_TIMEOUT = 300.0


class SuiteUnavailable(RuntimeError):
    """Django's cache test suite could not be fetched (no network, unknown version...)."""


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def suite_path(version: str | None = None, root: Path = CACHE_ROOT) -> Path:
    """The directory to put on sys.path so that ``import cache.tests`` finds the suite."""
    return root / (version or django.__version__) / "pkg"


def fetch_cache_suite(version: str | None = None, root: Path = CACHE_ROOT) -> Path:
    """Download (once) and extract Django's ``tests/cache/``; return the sys.path entry."""
    version = version or django.__version__
    pkg_dir = suite_path(version, root)
    if (pkg_dir / PACKAGE / COMPLETE_MARKER).is_file():
        return pkg_dir
    sdist = _download_sdist(version, root / version / "sdist")
    _extract_cache_tests(sdist, pkg_dir)
    return pkg_dir


def _download_sdist(version: str, directory: Path) -> Path:
    existing = _find_sdist(version, directory)
    if existing is not None:
        return existing
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
        "--retries", "2", "--quiet",
        "--dest", str(directory),
        f"django=={version}",
    ]  # fmt: skip
    try:
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SuiteUnavailable(
            f"downloading the Django {version} sdist took over {DOWNLOAD_TIMEOUT:.0f}s: "
            f"{' '.join(command)}"
        ) from exc
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip().splitlines()
        detail = "\n    ".join(output[-8:]) or f"exit status {result.returncode}"
        raise SuiteUnavailable(
            f"could not download the Django {version} sdist (is the package index "
            f"reachable?):\n    $ {' '.join(command)}\n    {detail}"
        )
    found = _find_sdist(version, directory)
    if found is None:
        raise SuiteUnavailable(f"pip reported success but left no Django sdist in {directory}")
    return found


def _find_sdist(version: str, directory: Path) -> Path | None:
    if not directory.is_dir():
        return None
    for candidate in sorted(directory.iterdir()):
        if candidate.name.lower() == f"django-{version}.tar.gz":
            return candidate
    return None


def _extract_cache_tests(sdist: Path, pkg_dir: Path) -> None:
    """Extract ``<top>/tests/cache/**`` of the sdist to ``pkg_dir/cache/``, atomically."""
    pkg_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=pkg_dir))
    try:
        package = staging / PACKAGE
        package.mkdir()
        count = 0
        try:
            with tarfile.open(sdist, "r:gz") as archive:
                for member in archive:
                    relative = _cache_tests_member(member)
                    if relative is None:
                        continue
                    source = archive.extractfile(member)
                    if source is None:
                        continue
                    target = package.joinpath(*relative.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with source, open(target, "wb") as out:
                        shutil.copyfileobj(source, out)
                    count += 1
        except (OSError, tarfile.TarError) as exc:
            raise SuiteUnavailable(f"could not read {sdist}: {exc}") from exc
        if not (package / "tests.py").is_file():
            raise SuiteUnavailable(f"{sdist} has no tests/cache/tests.py ({count} files found)")
        (package / "__init__.py").touch()
        (package / COMPLETE_MARKER).write_text(f"{sdist.name}\n")
        final = pkg_dir / PACKAGE
        if final.exists():
            if (final / COMPLETE_MARKER).is_file():
                return  # another process finished first
            shutil.rmtree(final)  # left over from an interrupted extraction
        try:
            os.replace(package, final)
        except OSError:
            if not (final / COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _cache_tests_member(member: tarfile.TarInfo) -> PurePosixPath | None:
    """The path below ``tests/cache/`` of a regular file of that directory, else None."""
    if not member.isfile():
        return None
    parts = PurePosixPath(member.name).parts
    # <top>/tests/cache/<file...>: the top directory is django-X.Y.Z or Django-X.Y.Z.
    if len(parts) < 4 or parts[1:3] != ("tests", "cache"):
        return None
    rest = parts[3:]
    if any(part in ("", ".", "..") or "\\" in part for part in rest):
        return None
    if "__pycache__" in rest or rest[-1].endswith((".pyc", ".pyo")):
        return None
    return PurePosixPath(*rest)


@functools.cache
def load_cache_tests() -> ModuleType:
    """Fetch the suite and import ``cache.tests``; raise SuiteUnavailable if it cannot be.

    ``cache.tests`` imports ``cache.models`` at import time, and a model must belong to an
    installed app, so "cache" is installed for the duration of the import (the model then
    stays registered; the fixtures install the app again around the test classes).
    """
    path = fetch_cache_suite()
    entry = str(path)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        location = Path(getattr(loaded, "__file__", None) or ".").resolve()
        if not location.is_relative_to(path.resolve()):
            raise SuiteUnavailable(
                f"a different module named {PACKAGE!r} is already imported from {location}"
            )
    with override_settings(INSTALLED_APPS=installed_apps_with_suite()):
        return importlib.import_module(f"{PACKAGE}.tests")


def installed_apps_with_suite() -> list[str]:
    """INSTALLED_APPS of the test settings plus the suite's app (for its Poll model)."""
    apps = list(settings.INSTALLED_APPS)
    if PACKAGE not in apps:
        apps.append(PACKAGE)
    return apps
