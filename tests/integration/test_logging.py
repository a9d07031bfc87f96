"""What the ``django_fastcache`` logger reports: a node going out (with the cause), a node
still out (repeated, rate-limited), a node back (with its replay), disk-tier failures.

Real memcached processes are killed and restarted; the disk tier's directory is made
unusable. Records from the maintenance thread are waited for by bounded polling.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_fastcache import logs
from django_fastcache.backends import FastCache
from django_fastcache.testing.servers import MemcachedServer, free_port
from tests.conftest import LANDING_WAIT

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: Calls that must succeed get 1 s (a call delayed by load past a short timeout put the
#: node out: its log records and replay were then not the ones under test); the failures
#: here are refused or reset connections, which come back at once.
TIMEOUT = 1.0
PATIENCE = 20.0


def make_cache(location: str, directory: str) -> FastCache:
    options: dict[str, Any] = {
        "disk_directory": directory,
        "operation_timeout": TIMEOUT,
        "connect_timeout": TIMEOUT,
    }
    return FastCache([location], {"OPTIONS": options})


def messages(caplog: pytest.LogCaptureFixture, contains: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_fastcache" and contains in record.getMessage()
    ]


def eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


@pytest.fixture
def own_server() -> Iterator[MemcachedServer]:
    server = MemcachedServer().start()
    try:
        yield server
    finally:
        server.kill()


def test_the_package_installs_no_handler() -> None:
    assert logging.getLogger("django_fastcache").handlers == []


def test_a_node_going_out_is_logged_with_its_cause(
    caplog: pytest.LogCaptureFixture, disk_directory: str
) -> None:
    location = f"127.0.0.1:{free_port()}"  # nothing listens there
    cache = make_cache(location, disk_directory)
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        assert cache.get("k") is None
        assert cache.get("k") is None
    out = messages(caplog, f"memcached node {location} is out")
    assert len(out) == 1, caplog.text  # once, when it went out
    assert f"is memcached running on {location}? check LOCATION" in out[0]
    assert disk_directory in out[0]


def test_a_node_that_stays_out_is_warned_about_again(
    caplog: pytest.LogCaptureFixture, disk_directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "REPEAT_INTERVAL", 0.2)
    location = f"127.0.0.1:{free_port()}"
    cache = make_cache(location, disk_directory)
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        cache.get("k")
        eventually(lambda: len(messages(caplog, f"node {location} is still out")) >= 2)
    again = messages(caplog, f"node {location} is still out")
    assert "connection refused" in again[-1]  # the latest probe's error


def test_a_node_coming_back_is_logged_with_its_replay(
    caplog: pytest.LogCaptureFixture, disk_directory: str, own_server: MemcachedServer
) -> None:
    cache = make_cache(own_server.location, disk_directory)
    cache.set("before", 1)
    own_server.kill()
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        cache.set("during", 2)  # marks the node out, then journaled
        cache.delete("before")  # journaled
        assert messages(caplog, f"memcached node {own_server.location} is out")
        own_server.restart()
        eventually(lambda: bool(messages(caplog, f"node {own_server.location} is back")))
    back = messages(caplog, f"node {own_server.location} is back")
    assert back == [
        f"memcached node {own_server.location} is back: replayed 2 journaled key(s) as deletes"
    ]


def test_disk_tier_failures_are_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, disk_directory: str, memcached: MemcachedServer
) -> None:
    os.makedirs(disk_directory)
    with open(os.path.join(disk_directory, "values"), "w") as blocker:
        blocker.write("not a directory")  # the values cannot be stored
    cache = make_cache(memcached.location, disk_directory)
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        for n in range(5):
            cache.set(f"k{n}", n)
            assert cache.get(f"k{n}") == n  # memcached's answers stand
        cache._shared().tiered.flush(LANDING_WAIT)  # the writer behind meets the failures
    failed = messages(caplog, f"the disk tier at {disk_directory} failed")
    assert len(failed) == 1, caplog.text
    assert "DiskError" in failed[0]
    stats = cache.tier_stats()
    assert stats is not None
    assert stats["disk_failures"] >= 5
