"""memcached at its connection limit (``-c``): it answers a new connection with
``ERROR Too many open connections`` and closes it.

That is the node refusing us, a network failure: callers get a NetworkError
(:class:`ServerRefusedConnectionError`), never an "unknown command" or a protocol error,
and with the disk tier on no exception reaches the caller at all.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.errors import NetworkError, ServerRefusedConnectionError
from django_fastcache.stampede import meta_support
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import forget_stacks

pytestmark = [pytest.mark.integration, pytest.mark.faults]

TIMEOUT = 0.5


@pytest.fixture(scope="module")
def full_server() -> Iterator[MemcachedServer]:
    """A memcached whose every connection slot is taken: any new connection is refused."""
    server = MemcachedServer(extra_args=["-c", "20"]).start()
    held: list[socket.socket] = []
    try:
        for _ in range(100):
            sock = socket.create_connection((server.host, server.port), timeout=2)
            sock.sendall(b"version\r\n")
            reply = sock.recv(100)
            if reply.startswith(b"ERROR Too many open connections"):
                sock.close()
                break
            assert reply.startswith(b"VERSION"), reply
            held.append(sock)
        else:
            pytest.fail("memcached never reached its connection limit")
        yield server
    finally:
        for sock in held:
            sock.close()
        server.kill()


def async_errors(
    location: str, calls: Callable[[Client], list[Awaitable[object]]]
) -> list[BaseException]:
    """What the async client's ``calls`` raised, one by one, on a fresh client."""

    async def scenario() -> list[BaseException]:
        client = Client([location], timeout=TIMEOUT)
        errors: list[BaseException] = []
        try:
            for call in calls(client):
                try:
                    await call
                except BaseException as exc:
                    errors.append(exc)
        finally:
            await client.aclose()
        return errors

    return asyncio.run(scenario())


def test_the_async_client_gets_a_network_error(full_server: MemcachedServer) -> None:
    errors = async_errors(
        full_server.location,
        lambda client: [client.get(b"k"), client.set(b"k", b"v"), client.get_many([b"a", b"b"])],
    )
    assert len(errors) == 3
    for error in errors:
        assert isinstance(error, ServerRefusedConnectionError), repr(error)
        assert isinstance(error, NetworkError)
        assert "too many open connections" in str(error)


def test_the_blocking_client_gets_a_network_error(full_server: MemcachedServer) -> None:
    client = BlockingClient(Cluster([full_server.location], ClientSettings(timeout=TIMEOUT)))
    try:
        for _ in range(3):
            with pytest.raises(NetworkError):
                run_blocking(client.get(b"k"))
            with pytest.raises(ServerRefusedConnectionError):
                client.get_now(b"k")
            with pytest.raises(NetworkError):
                run_blocking(client.get_many([b"k", b"j"]))
    finally:
        client.close_thread_connections()


def test_with_the_tier_on_no_error_reaches_the_caller(
    full_server: MemcachedServer, tmp_path: Path
) -> None:
    directory = tmp_path / "disk"
    cache = FastCache(
        [full_server.location],
        {
            "OPTIONS": {
                "disk_directory": str(directory),
                "operation_timeout": TIMEOUT,
                "connect_timeout": TIMEOUT,
            }
        },
    )
    try:
        cache.set("k", "v")
        assert cache.get("k") == "v"  # from the disk tier
        assert cache.add("other", 1) is True
        assert cache.incr("other") == 2
        assert cache.get_many(["k", "other"]) == {"k": "v", "other": 2}
        cache.delete("k")
        assert cache.get("k") is None

        async def native() -> object:
            await cache.aset("a", "b")
            return await cache.aget("a")

        assert asyncio.run(native()) == "b"
        assert cache.tier_stats()["nodes"][full_server.location]["state"] == "out"
    finally:
        forget_stacks(directory)


def test_meta_commands_get_the_refusal_too(full_server: MemcachedServer) -> None:
    """A refused connection is not a server that does not speak meta."""
    client = BlockingClient(Cluster([full_server.location], ClientSettings(timeout=TIMEOUT)))
    try:
        with pytest.raises(ServerRefusedConnectionError):
            client.meta_at(0, b"mg k v c f N30\r\n")
        with pytest.raises(ServerRefusedConnectionError):
            client.count_at(0, b"k", 1)
        with pytest.raises(ServerRefusedConnectionError):
            run_blocking(client.meta_get(b"k"))
        with pytest.raises(ServerRefusedConnectionError):
            client.add_seeing_now(b"k", b"v", 0, 0)
    finally:
        client.close_thread_connections()

    errors = async_errors(
        full_server.location, lambda client: [client.meta_get(b"k"), client.speaks_meta()]
    )
    assert [type(error) for error in errors] == [ServerRefusedConnectionError] * 2, errors


def test_a_refused_connection_leaves_get_or_sets_leases_on(full_server: MemcachedServer) -> None:
    cache = FastCache(
        [full_server.location],
        {"OPTIONS": {"disk_tier": False, "operation_timeout": TIMEOUT, "sign_values": False}},
    )
    with pytest.raises(ServerRefusedConnectionError):
        cache.add("k", 1)
    with pytest.raises(NetworkError):
        cache.get_or_set("k", 1)
    # Not taken for a node without meta: the question is asked again once it answers.
    support = meta_support("auto", cache.blocking_client.cluster)
    assert support._answers == [None]
