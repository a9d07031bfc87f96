"""Fixtures the disk tier's integration tests share (a module with a ``cache`` of its own
overrides this one)."""

from __future__ import annotations

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.testing.servers import MemcachedServer
from tests.integration.test_tiered import Raw, make_cache


@pytest.fixture
def cache(memcached: MemcachedServer, disk_directory: str) -> FastCache:
    """A tiered FastCache on the session's (flushed) memcached."""
    return make_cache(memcached.location, disk_directory)


@pytest.fixture
def raw(memcached: MemcachedServer) -> Raw:
    """A text-protocol connection of its own to the session's memcached."""
    return Raw(memcached)
