"""The example project: which cache it picks and says it picks, and its home page's counts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from django_fastcache.testing.servers import MemcachedServer, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "example_project"


def _clean_environment() -> dict[str, str]:
    # The test run's own settings module and any cache choice must not leak into the project.
    dropped = ("EXAMPLE_CACHE", "DJANGO_SETTINGS_MODULE")
    return {key: value for key, value in os.environ.items() if key not in dropped}


def _settings(memcached: str, **extra: str) -> tuple[str, str]:
    """Import the project's settings in a fresh process: (EXAMPLE_CACHE, start-up line)."""
    environment = {**_clean_environment(), "EXAMPLE_MEMCACHED": memcached, **extra}
    code = (
        "import django, os, sys;"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'example_project.settings';"
        "django.setup();"
        "from django.conf import settings;"
        "from example_project import cache_choice;"
        "print(settings.EXAMPLE_CACHE);"
        "print(cache_choice.describe(settings.CACHE_CHOICE, settings.CACHES['default']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, env=environment, cwd=PROJECT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    name, line = done.stdout.splitlines()
    return name, line


def test_uses_fastcache_with_its_disk_tier_when_memcached_answers(
    memcached: MemcachedServer,
) -> None:
    name, line = _settings(memcached.location)
    assert name == "fastcache-tiered"
    assert line.startswith("Cache: fastcache-tiered (django_fastcache.backends.FastCache at ")
    assert f"memcached answers at {memcached.location}" in line


def test_falls_back_to_locmem_and_says_how_to_get_fastcache() -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    name, line = _settings(nowhere)
    assert name == "locmem"
    assert f"no memcached at {nowhere}" in line
    assert "EXAMPLE_MEMCACHED" in line


def test_example_cache_names_the_backend_outright() -> None:
    name, line = _settings(f"127.0.0.1:{free_port()}", EXAMPLE_CACHE="diskcache")
    assert name == "diskcache"
    assert line.endswith("; EXAMPLE_CACHE")


def test_the_wsgi_entry_point_prints_the_choice(memcached: MemcachedServer) -> None:
    environment = {**_clean_environment(), "EXAMPLE_MEMCACHED": memcached.location}
    done = subprocess.run(
        [sys.executable, "-c", "import example_project.wsgi"],
        capture_output=True, text=True, timeout=60, env=environment, cwd=PROJECT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Cache: fastcache-tiered") == 1


def test_category_counts_cover_every_product() -> None:
    sys.path.insert(0, str(PROJECT))
    try:
        from shop.catalog import PRODUCTS, category_counts, load_product
    finally:
        sys.path.remove(str(PROJECT))
    expected = Counter(load_product(pk).category for pk in range(1, PRODUCTS + 1))
    counts = category_counts()
    assert counts == dict(expected)
    assert sum(counts.values()) == PRODUCTS
