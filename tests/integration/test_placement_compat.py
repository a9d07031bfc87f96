"""Keys written by another client are found where it put them: pylibmc's ketama behaviours
and emcache, against real memcached processes.

Each test writes keys through the other client, then reads every one back through FastCache
with the matching ``placement`` and checks, node by node, that each key sits on exactly the
node FastCache routes it to. One node listens on memcached's default port, whose point names
libmemcached writes without the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache.backends.memcached import PyLibMCCache

from django_fastcache.backends.fastcache import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import MemcachedCluster

pytestmark = pytest.mark.integration

pylibmc = pytest.importorskip("pylibmc")

KEYS = [b"user:%d" % n for n in range(1500)] + [f"café:{n}".encode() for n in range(100)]

PYLIBMC_BEHAVIOURS = {
    "ketama": {"ketama": True},
    "ketama_md5": {"ketama": True, "hash": "md5"},
    "ketama_weighted": {"ketama_weighted": True},
}


@pytest.fixture(scope="module")
def default_port_server() -> Iterator[MemcachedServer]:
    """memcached on port 11211 of a loopback address no other test uses."""
    for last in (211, 212, 213, 214):
        server = MemcachedServer()
        server.host = f"127.0.0.{last}"
        server.port = 11211
        try:
            server.restart()
        except RuntimeError:
            continue
        try:
            yield server
        finally:
            server.stop()
        return
    pytest.fail("no 127.0.0.x:11211 free for a memcached on the default port")


@pytest.fixture
def nodes(memcached_cluster: MemcachedCluster, default_port_server: MemcachedServer) -> list[Any]:
    default_port_server.flush()
    return [*memcached_cluster.tcp, default_port_server]


def holds(server: MemcachedServer, key: bytes) -> bool:
    with socket.create_connection((server.host, server.port), 5) as sock:
        sock.sendall(b"mg " + key + b"\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(4096)
    return reply.startswith(b"HD")


def check_found_where_routed(client: Client, nodes: list[MemcachedServer]) -> None:
    blocking = BlockingClient(client.cluster)
    try:
        found = run_blocking(blocking.get_many(KEYS))
        assert sorted(found) == sorted(KEYS)
        assert {item.value for item in found.values()} == {b"v"}
        for key in KEYS[::7]:
            owner = client.cluster.node_index(key)
            assert [holds(node, key) for node in nodes] == [i == owner for i in range(len(nodes))]
    finally:
        blocking.close_thread_connections()

    async def read_async() -> dict[bytes, Any]:
        try:
            return await client.get_many(KEYS)
        finally:
            await client.aclose()

    assert sorted(asyncio.run(read_async())) == sorted(KEYS)


@pytest.mark.parametrize("placement", sorted(PYLIBMC_BEHAVIOURS))
@pytest.mark.parametrize("count", [3, 4])
def test_keys_written_by_pylibmc_are_found(
    nodes: list[MemcachedServer], placement: str, count: int
) -> None:
    servers = nodes[-count:]  # 4: the default-port node too
    writer = pylibmc.Client(
        [s.pylibmc_location for s in servers], behaviors=PYLIBMC_BEHAVIOURS[placement]
    )
    for key in KEYS:
        assert writer.set(key, b"v")
    writer.disconnect_all()
    check_found_where_routed(Client([s.location for s in servers], placement=placement), servers)


def test_other_placements_miss_them(nodes: list[MemcachedServer]) -> None:
    # The check has teeth: read with FastCache's own placement, most keys are not found.
    writer = pylibmc.Client([s.pylibmc_location for s in nodes], behaviors={"ketama": True})
    for key in KEYS:
        writer.set(key, b"v")
    writer.disconnect_all()
    blocking = BlockingClient(Client([s.location for s in nodes]).cluster)
    try:
        found = run_blocking(blocking.get_many(KEYS))
    finally:
        blocking.close_thread_connections()
    assert len(found) < len(KEYS) * 0.6


def test_keys_written_by_emcache_are_found(nodes: list[MemcachedServer]) -> None:
    emcache = pytest.importorskip("emcache")

    async def write() -> None:
        client = await emcache.create_client(
            [emcache.MemcachedHostAddress(s.host, s.port) for s in nodes], timeout=5.0
        )
        try:
            for key in KEYS:
                await client.set(key, b"v")
        finally:
            await client.close()

    asyncio.run(write())
    check_found_where_routed(Client([s.location for s in nodes], placement="emcache"), nodes)


@pytest.mark.parametrize(
    ("placement", "behaviors"),
    [("ketama", {"ketama": True}), ("ketama_weighted", {"ketama_weighted": True})],
)
def test_a_site_moving_from_pylibmccache_keeps_its_cache(
    nodes: list[MemcachedServer], placement: str, behaviors: dict[str, Any]
) -> None:
    """Django's PyLibMCCache fills the cache; FastCache with the same LOCATION reads it."""
    location = [s.location for s in nodes]
    before = PyLibMCCache(
        [s.pylibmc_location for s in nodes],
        {"OPTIONS": {"binary": False, "behaviors": behaviors}},
    )
    values = {f"page:{n}": f"<html>{n}</html>" for n in range(300)}
    values.update({f"count:{n}": n for n in range(100)})
    values.update({f"obj:{n}": {"n": n, "tags": ["a", "b"]} for n in range(100)})
    assert before.set_many(values, timeout=300) == []
    before.close()
    after = FastCache(
        location,
        {"OPTIONS": {"placement": placement, "sign_values": False, "disk_tier": False}},
    )
    with contextlib.closing(after):
        assert after.get_many(list(values)) == values
        assert after.incr("count:5") == 6
