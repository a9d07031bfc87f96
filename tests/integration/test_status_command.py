"""``manage.py fastcache status`` against a real memcached and a port nothing listens on."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from django.core.cache import caches as django_caches
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fastcache.testing.servers import MemcachedServer, free_port

pytestmark = pytest.mark.integration


def caches(locations: list[str], directory: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {"operation_timeout": 0.5, "connect_timeout": 0.5}
    options.update({"disk_tier": False} if directory is None else {"disk_directory": directory})
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "fast": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": locations,
            "OPTIONS": options,
        },
    }


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("fastcache", "status", *args, stdout=out)
    return out.getvalue()


def test_reachable_nodes_show_their_version_and_the_disk_tier(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    with override_settings(CACHES=caches([memcached.location], disk_directory)):
        django_caches["fast"].set("made", 1)  # the first request makes the tier
        text = status()
    assert "fast: 1 memcached node(s)" in text
    assert f"{memcached.location}  ok  memcached 1." in text
    assert "round trip" in text
    assert "tier: up, journal 0" in text
    assert f"disk tier: {disk_directory}" in text
    assert "fallbacks=0" in text


def test_a_wrong_port_is_named_with_its_fix_and_fails_the_command(
    memcached: MemcachedServer,
) -> None:
    wrong = f"127.0.0.1:{free_port()}"
    out = io.StringIO()
    with (
        override_settings(CACHES=caches([memcached.location, wrong], None)),
        pytest.raises(CommandError, match=r"1 memcached node\(s\) cannot be reached"),
    ):
        call_command("fastcache", "status", "--alias", "fast", stdout=out)
    text = out.getvalue()
    assert f"{memcached.location}  ok" in text
    assert (
        f"{wrong}  UNREACHABLE  connection refused: is memcached running on {wrong}? "
        "check LOCATION" in text
    )
    assert "disk tier: off" in text


def test_an_alias_that_is_not_a_fastcache_is_refused(memcached: MemcachedServer) -> None:
    with override_settings(CACHES=caches([memcached.location], None)):
        with pytest.raises(CommandError, match="not a FastCache"):
            status("--alias", "default")
        with pytest.raises(CommandError, match="no cache alias 'nope'"):
            status("--alias", "nope")


def test_a_disk_tier_no_process_made_is_reported_and_not_made(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    with override_settings(CACHES=caches([memcached.location], disk_directory)):
        text = status("--alias", "fast")
    assert f"{memcached.location}  ok  memcached 1." in text
    assert f"disk tier: {disk_directory} (not made yet:" in text
    assert "tier: up" not in text
    assert not os.path.exists(disk_directory)
