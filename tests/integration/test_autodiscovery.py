"""Autodiscovery against a fake configuration endpoint, with real memcached nodes.

The endpoint (:class:`FakeConfigEndpoint`) writes its replies one byte at a time and changes
its node list between refreshes; the nodes are the session's real memcached processes.
Refreshes are driven by calling :meth:`Discovery.refresh` where a test needs to know when
one happened; the background thread is tested on its own, by waiting for what it does.
"""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.test import override_settings

from django_fastcache.backends.fastcache import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.pool import Pool
from django_fastcache.errors import ConnectFailedError, TLSError
from django_fastcache.testing.certificates import make_certificates, openssl_available
from django_fastcache.testing.config_endpoint import FakeConfigEndpoint
from django_fastcache.testing.servers import MemcachedServer, ServerTLS
from tests.conftest import MemcachedCluster
from tests.integration.test_bridge import fork_and_run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("own_stacks")]

KEYS = [b"key:%d" % n for n in range(200)]


def entry(server: MemcachedServer, name: str) -> tuple[str, str, int]:
    return (f"{name}.cache.internal", server.host, server.port)


@pytest.fixture
def nodes(memcached_cluster: MemcachedCluster) -> list[MemcachedServer]:
    return memcached_cluster.tcp


@pytest.fixture
def endpoint(nodes: list[MemcachedServer]) -> Iterator[FakeConfigEndpoint]:
    with FakeConfigEndpoint([entry(nodes[0], "a"), entry(nodes[1], "b")]) as fake:
        yield fake


def open_ports(server: MemcachedServer) -> set[int]:
    """The client-side ports of the connections ``server`` has open (``stats conns``), the
    asking connection's own left out.

    Which connections are open, not how many: memcached counts a connection in
    ``curr_connections`` until the worker thread that owns it has closed it, some time
    after its peer did, so a count read just after any close (that of a previous reading's
    own connection included) can be one too high. A connection of the client's is named
    by its port instead."""
    with socket.create_connection((server.host, server.port), 5) as sock:
        own = sock.getsockname()[1]
        sock.sendall(b"stats conns\r\n")
        reply = b""
        while not reply.endswith(b"END\r\n"):
            reply += sock.recv(65536)
    addresses: dict[bytes, bytes] = {}
    listening: set[bytes] = set()
    for line in reply.split(b"\r\n"):
        fields = line.split()  # STAT <fd>:addr tcp:127.0.0.1:<port> / <fd>:state <state>
        if len(fields) != 3:
            continue
        fd, _, name = fields[1].partition(b":")
        if name == b"addr":
            addresses[fd] = fields[2]
        elif name == b"state" and fields[2] == b"conn_listening":
            listening.add(fd)
    ports = {int(a.rpartition(b":")[2]) for fd, a in addresses.items() if fd not in listening}
    ports.discard(own)
    return ports


def local_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def pool_ports(pool: Pool) -> set[int]:
    """The local ports of a pool's connections, all of them idle."""
    assert pool.size == pool.idle > 0
    ports = set()
    for connection in pool._idle:
        transport = connection._transport
        assert transport is not None
        ports.add(local_port(transport.get_extra_info("socket")))
    return ports


async def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the event loop run until ``condition`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def holds(server: MemcachedServer, key: bytes) -> bool:
    with socket.create_connection((server.host, server.port), 5) as sock:
        sock.sendall(b"mg " + key + b"\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(4096)
    return reply.startswith(b"HD")


def value_on(server: MemcachedServer, key: bytes) -> bytes | None:
    with socket.create_connection((server.host, server.port), 5) as sock:
        sock.sendall(b"mg " + key + b" v\r\n")
        reply = b""
        while not (reply.startswith(b"EN\r\n") or reply.count(b"\r\n") == 2):
            reply += sock.recv(4096)
    return None if reply.startswith(b"EN") else reply.split(b"\r\n")[1]


def assert_latest_on_owner(client: Client, nodes: list[MemcachedServer], value: bytes) -> None:
    """Every key's owner (as routed now) holds its latest value."""
    by_id = {f"{n.host}:{n.port}": n for n in nodes}
    for key in KEYS:
        owner = client.cluster.node_ids[client.cluster.node_index(key)]
        assert value_on(by_id[owner], key) == value, key


def live_ids(client: Client) -> list[str]:
    cluster = client.cluster
    return [cluster.node_ids[slot] for slot in cluster.live]


def assert_routed(client: Client, nodes: list[MemcachedServer], keys: list[bytes]) -> None:
    """Every key sits on the node the cluster routes it to, and on no other."""
    by_id = {f"{n.host}:{n.port}": n for n in nodes}
    for key in keys:
        owner = client.cluster.node_ids[client.cluster.node_index(key)]
        assert [holds(n, key) for n in nodes] == [n is by_id[owner] for n in nodes], key


def wait_until(condition: object, endpoint: FakeConfigEndpoint) -> None:
    assert endpoint.wait_for(condition)  # type: ignore[arg-type]


def test_blocking_client_follows_the_node_list(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=3600)
    blocking = BlockingClient(client.cluster)
    discovery = client.cluster.discovery
    try:
        assert endpoint.requests == 0  # nothing fetched when built
        for key in KEYS:  # the first key routed fetches the node list
            assert run_blocking(blocking.set(key, b"v")) is True
        assert endpoint.requests == 1
        assert live_ids(client) == [f"{n.host}:{n.port}" for n in nodes[:2]]
        assert discovery.version == 1
        assert_routed(client, nodes, KEYS)
        leaving = client.cluster.live[0]
        # No reference to the connection is kept: one held would keep it open.
        ours = local_port(blocking._local.by_node[leaving]._sock)
        assert ours in open_ports(nodes[0])

        # Node a leaves, node c joins.
        endpoint.set_nodes([entry(nodes[1], "b"), entry(nodes[2], "c")])
        assert discovery.refresh() is True
        assert discovery.version == 2
        assert live_ids(client) == [f"{n.host}:{n.port}" for n in nodes[1:]]
        # The connection to the node that left is closed.
        assert leaving not in blocking._local.by_node
        wait_until(lambda: ours not in open_ports(nodes[0]), endpoint)
        # Keys follow the new list: those that were on a now read as misses, written anew
        # they land on b or c.
        found = run_blocking(blocking.get_many(KEYS))
        assert 0 < len(found) < len(KEYS)
        for key in KEYS:
            assert run_blocking(blocking.set(key, b"w")) is True
        assert_latest_on_owner(client, nodes, b"w")
        assert not any(
            client.cluster.node_ids[client.cluster.node_index(k)]
            == f"{nodes[0].host}:{nodes[0].port}"
            for k in KEYS
        )

        # Nothing changed: nothing to do.
        assert discovery.refresh() is False
        # Node a comes back under its old slot.
        endpoint.set_nodes([entry(nodes[0], "a"), entry(nodes[1], "b"), entry(nodes[2], "c")])
        assert discovery.refresh() is True
        assert leaving in client.cluster.live
        assert len(client.cluster.addresses) == 3
        for key in KEYS:
            assert run_blocking(blocking.set(key, b"x")) is True
        assert run_blocking(blocking.get_many(KEYS)).keys() == set(KEYS)
    finally:
        discovery.close()
        blocking.close_thread_connections()


def test_async_client_follows_the_node_list(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=3600)
    discovery = client.cluster.discovery

    async def scenario() -> None:
        for key in KEYS:
            assert await client.set(key, b"v") is True
        assert live_ids(client) == [f"{n.host}:{n.port}" for n in nodes[:2]]
        assert_routed(client, nodes, KEYS)
        leaving = client.cluster.live[0]
        pool = client._pools_by_loop[asyncio.get_running_loop()][leaving]
        ours = pool_ports(pool)
        assert ours <= open_ports(nodes[0])
        endpoint.set_nodes([entry(nodes[1], "b"), entry(nodes[2], "c")])
        # From another thread, as the refresher does it.
        assert await asyncio.get_running_loop().run_in_executor(None, discovery.refresh)
        # The pool is closed on its own loop, and its connections with it.
        await eventually(lambda: pool.size == 0 and not ours & open_ports(nodes[0]))
        for key in KEYS:
            assert await client.set(key, b"w") is True
        assert_latest_on_owner(client, nodes, b"w")
        assert (await client.get_many(KEYS)).keys() == set(KEYS)
        # Node a comes back: its pool was closed, a new one serves it.
        endpoint.set_nodes([entry(nodes[0], "a"), entry(nodes[1], "b")])
        assert await asyncio.get_running_loop().run_in_executor(None, discovery.refresh)
        for key in KEYS:
            assert await client.set(key, b"x") is True
        assert (await client.get_many(KEYS)).keys() == set(KEYS)
        await client.aclose()

    asyncio.run(scenario())
    assert not discovery.running  # aclose() stopped the refresher


def test_background_refresh_and_close(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=0.02)
    blocking = BlockingClient(client.cluster)
    discovery = client.cluster.discovery
    try:
        assert not discovery.running
        assert run_blocking(blocking.set(b"k", b"v")) is True
        assert discovery.running
        endpoint.set_nodes([entry(nodes[2], "c")])
        wait_until(lambda: live_ids(client) == [f"{nodes[2].host}:{nodes[2].port}"], endpoint)
        assert run_blocking(blocking.set(b"k", b"v")) is True
        assert holds(nodes[2], b"k")
        discovery.close()
        assert not discovery.running
        asked = endpoint.requests
        # The thread has ended (close joined it): no request can follow.
        assert discovery._thread is None
        assert endpoint.requests == asked
    finally:
        discovery.close()
        blocking.close_thread_connections()


@pytest.mark.parametrize("failure", ["error", "close", "garbage", "down"])
def test_failed_refresh_keeps_the_last_list(
    endpoint: FakeConfigEndpoint,
    nodes: list[MemcachedServer],
    failure: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=3600)
    blocking = BlockingClient(client.cluster)
    discovery = client.cluster.discovery
    try:
        assert run_blocking(blocking.set(b"k", b"v")) is True
        before = live_ids(client)
        endpoint.set_nodes([entry(nodes[2], "c")])
        if failure == "down":
            endpoint.stop()
        else:
            endpoint.fail = failure
        with caplog.at_level(logging.WARNING, logger="django_fastcache"):
            assert discovery.refresh() is False
        assert live_ids(client) == before
        assert discovery.failures == 1
        assert discovery.last_error
        assert "keeping the last one" in caplog.text
        assert run_blocking(blocking.get(b"k")) is not None  # still served
        if failure != "down":
            endpoint.fail = None
            assert discovery.refresh() is True
            assert discovery.last_error is None
            assert live_ids(client) == [f"{nodes[2].host}:{nodes[2].port}"]
    finally:
        discovery.close()
        blocking.close_thread_connections()


def test_first_fetch_failing_fails_the_call(endpoint: FakeConfigEndpoint) -> None:
    endpoint.stop()
    client = Client([endpoint.location], autodiscovery=True)
    blocking = BlockingClient(client.cluster)
    with pytest.raises(ConnectFailedError, match=endpoint.location):
        run_blocking(blocking.get(b"k"))
    assert client.cluster.live == ()
    assert not client.cluster.discovery.running


def test_a_second_endpoint_answers_when_the_first_does_not(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    with FakeConfigEndpoint([entry(nodes[0], "a")]) as dead:
        dead_location = dead.location
    client = Client([dead_location, endpoint.location], autodiscovery=True)
    blocking = BlockingClient(client.cluster)
    try:
        assert run_blocking(blocking.set(b"k", b"v")) is True
        assert len(client.cluster.live) == 2
    finally:
        client.cluster.discovery.close()
        blocking.close_thread_connections()


def test_whole_node_commands_go_to_the_current_nodes(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=3600)
    blocking = BlockingClient(client.cluster)
    try:
        assert set(run_blocking(blocking.version())) == set(live_ids(client))
        endpoint.set_nodes([entry(nodes[2], "c")])
        client.cluster.discovery.refresh()
        assert list(run_blocking(blocking.version())) == [f"{nodes[2].host}:{nodes[2].port}"]
    finally:
        client.cluster.discovery.close()
        blocking.close_thread_connections()


def test_a_forked_child_refreshes_on_its_own(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=0.02)
    blocking = BlockingClient(client.cluster)
    discovery = client.cluster.discovery
    try:
        assert run_blocking(blocking.set(b"parent", b"p")) is True
        assert discovery.running

        def child() -> bool:
            # The parent's thread does not exist here: a thread of the child's own refreshes.
            if not discovery.running:
                return False
            done = discovery.refreshes
            deadline = time.monotonic() + 5
            while discovery.refreshes < done + 2:  # two of its own, so it loops
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
            ok = run_blocking(blocking.set(b"child", b"c")) is True
            ok &= run_blocking(blocking.get(b"parent")) is not None
            discovery.close()
            return ok

        assert fork_and_run(child) == 0
        assert discovery.running
        assert run_blocking(blocking.get(b"child")) is not None
    finally:
        discovery.close()
        blocking.close_thread_connections()


def test_django_backend_with_autodiscovery(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    cache = FastCache(
        endpoint.location,
        {"OPTIONS": {"autodiscovery": True, "disk_tier": False, "autodiscovery_interval": 30}},
    )
    discovery = cache.blocking_client.cluster.discovery
    try:
        values = {f"k{n}": n for n in range(50)}
        cache.set_many(values)
        assert cache.get_many(list(values)) == values
        assert discovery.running

        async def read() -> object:
            return await cache.aget("k7")

        assert asyncio.run(read()) == 7
    finally:
        discovery.close()


def test_status_command_shows_the_discovered_nodes(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    settings = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "fast": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": [endpoint.location],
            "OPTIONS": {"autodiscovery": True, "disk_tier": False, "operation_timeout": 0.5},
        },
    }
    out = io.StringIO()
    with override_settings(CACHES=settings):
        try:
            call_command("fastcache", "status", "--alias", "fast", stdout=out)
        finally:
            caches["fast"].blocking_client.cluster.discovery.close()
    text = out.getvalue()
    assert "fast: 2 memcached node(s)" in text
    assert f"{nodes[0].host}:{nodes[0].port}  ok" in text
    assert f"{nodes[2].host}:{nodes[2].port}" not in text


def test_the_fake_endpoint_speaks_what_emcache_reads(nodes: list[MemcachedServer]) -> None:
    """The fake is checked against another client's reading of the format (emcache reads
    the reply in one piece, so the fake sends it whole here)."""
    emcache = pytest.importorskip("emcache")
    listed = [(n.host, n.host, n.port) for n in nodes[:2]]  # Memorystore's form

    async def discovered(endpoint: FakeConfigEndpoint) -> set[tuple[str, int]]:
        client = await emcache.create_client(
            [emcache.MemcachedHostAddress(endpoint.host, endpoint.port)],
            autodiscovery=True,
            autodiscovery_poll_interval=0.05,
            timeout=2.0,
        )
        try:
            for _ in range(400):
                found = {(n.address, n.port) for n in client.cluster_managment().nodes()}
                if (endpoint.host, endpoint.port) not in found:
                    return found
                await asyncio.sleep(0.01)
            return found
        finally:
            await client.close()

    with FakeConfigEndpoint(listed, chunk=65536) as fake:
        assert asyncio.run(discovered(fake)) == {(n.host, n.port) for n in nodes[:2]}


def test_other_threads_connections_close_and_one_in_use_is_left_alone(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer]
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=3600)
    blocking = BlockingClient(client.cluster)
    discovery = client.cluster.discovery
    done, release = threading.Event(), threading.Event()
    theirs: dict[int, int] = {}  # the worker's connections' ports, by node slot

    def worker() -> None:  # connects to both nodes, then keeps its connections
        for key in KEYS:
            run_blocking(blocking.set(key, b"v"))
        theirs.update({n: local_port(c._sock) for n, c in blocking._local.by_node.items()})
        done.set()
        release.wait(10)
        blocking.close_thread_connections()

    thread = threading.Thread(target=worker)
    try:
        for key in KEYS:
            run_blocking(blocking.set(key, b"v"))
        thread.start()
        assert done.wait(10)
        leaving = client.cluster.live[0]
        # Held as a request in flight holds it.
        in_use = blocking._local.by_node[leaving]
        mine = local_port(in_use._sock)
        assert {mine, theirs[leaving]} <= open_ports(nodes[0])
        endpoint.set_nodes([entry(nodes[1], "b"), entry(nodes[2], "c")])
        assert discovery.refresh() is True
        # The worker's idle connection is closed; the one in use is not, but it is no
        # longer its thread's: it goes when its user lets go of it.
        wait_until(lambda: theirs[leaving] not in open_ports(nodes[0]), endpoint)
        assert leaving not in blocking._local.by_node
        assert in_use._sock.fileno() != -1
        assert mine in open_ports(nodes[0])
        in_use.close()  # its user done with it
        wait_until(lambda: mine not in open_ports(nodes[0]), endpoint)
    finally:
        release.set()
        thread.join(10)
        discovery.close()
        blocking.close_thread_connections()


def test_an_older_version_is_taken_only_when_it_persists(
    endpoint: FakeConfigEndpoint, nodes: list[MemcachedServer], caplog: pytest.LogCaptureFixture
) -> None:
    client = Client([endpoint.location], autodiscovery=True, autodiscovery_interval=3600)
    discovery = client.cluster.discovery
    try:
        assert discovery.refresh() is True
        endpoint.set_nodes([entry(nodes[1], "b")])
        assert discovery.refresh() is True
        assert discovery.version == 2
        # An endpoint that lags behind answers version 1 with another list.
        endpoint.version = 1
        endpoint.nodes = [entry(nodes[2], "c")]
        with caplog.at_level(logging.WARNING, logger="django_fastcache"):
            assert discovery.refresh() is False
            assert discovery.refresh() is False
        assert "older than the one in use" in caplog.text
        assert live_ids(client) == [f"{nodes[1].host}:{nodes[1].port}"]
        # Still older on the third refresh in a row: the cluster was made anew.
        assert discovery.refresh() is True
        assert discovery.version == 1
        assert live_ids(client) == [f"{nodes[2].host}:{nodes[2].port}"]
    finally:
        discovery.close()


def test_tls_endpoint_and_nodes(tmp_path_factory: pytest.TempPathFactory) -> None:
    """An encrypted cluster: the configuration endpoint and the nodes all speak TLS."""
    if not openssl_available() or not MemcachedServer.supports_tls():
        pytest.skip("needs the openssl tool and a memcached built with TLS")
    certificates = make_certificates(
        tmp_path_factory.mktemp("certs"), server_names=("memcached.test",)
    )
    tls = ServerTLS(certificates.server_cert, certificates.server_key)
    servers = [MemcachedServer(tls=tls).start() for _ in range(2)]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates.server_cert, certificates.server_key)
    listed = [entry(server, f"n{n}") for n, server in enumerate(servers)]
    try:
        with FakeConfigEndpoint(listed, tls=context) as endpoint:
            good = {"ca_file": certificates.ca_file, "server_hostname": "memcached.test"}
            client = Client([endpoint.location], autodiscovery=True, ssl=good)
            blocking = BlockingClient(client.cluster)
            try:
                for key in KEYS[:50]:
                    assert run_blocking(blocking.set(key, b"v")) is True
                assert len(run_blocking(blocking.get_many(KEYS[:50]))) == 50
                assert len(client.cluster.live) == 2
            finally:
                client.cluster.discovery.close()
                blocking.close_thread_connections()
            wrong = {"ca_file": certificates.other_ca_file, "server_hostname": "memcached.test"}
            refused = Client([endpoint.location], autodiscovery=True, ssl=wrong)
            refused_blocking = BlockingClient(refused.cluster)
            with pytest.raises(TLSError):
                run_blocking(refused_blocking.get(b"k"))
    finally:
        for server in servers:
            server.stop()


def memorystore_entry(server: MemcachedServer) -> tuple[str, str, int]:
    """GCP Memorystore lists a node with its IP address in place of a host name."""
    return (server.host, server.host, server.port)


@pytest.mark.parametrize("chunk", [1, 3, 40])
def test_memorystore_discovery_endpoint_split_replies_and_a_changing_node_list(
    nodes: list[MemcachedServer], chunk: int
) -> None:
    """A Memorystore discovery endpoint whose replies arrive in pieces of ``chunk`` bytes
    (the header, the version line and the node list each split somewhere else), followed
    through the Django backend's async API (autobatched agets) as its node list changes."""
    listed = [memorystore_entry(n) for n in nodes[:2]]
    with FakeConfigEndpoint(listed, chunk=chunk) as endpoint:
        cache = FastCache(
            endpoint.location,
            {
                "TIMEOUT": None,
                "OPTIONS": {
                    "autodiscovery": True,
                    "disk_tier": False,
                    "autodiscovery_interval": 3600,
                    "sign_values": False,
                },
            },
        )
        client = cache.client
        discovery = client.cluster.discovery
        values = {f"ms:{n}": n for n in range(60)}

        async def scenario() -> None:
            await cache.aset_many(values)
            assert live_ids(client) == [f"{n.host}:{n.port}" for n in nodes[:2]]
            assert discovery.version == 1
            wire = [cache.wire_key(k) for k in values]
            assert_routed(client, nodes, wire)
            assert await asyncio.gather(*[cache.aget(k) for k in values]) == list(values.values())

            # The first node leaves and the third joins, under version 2.
            endpoint.set_nodes([memorystore_entry(nodes[1]), memorystore_entry(nodes[2])])
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, discovery.refresh) is True
            assert discovery.version == 2
            assert live_ids(client) == [f"{n.host}:{n.port}" for n in nodes[1:3]]
            # Keys that were on the node that left read as misses; written anew, every key
            # lands on its owner in the new list and reads back through batched agets.
            found = await asyncio.gather(*[cache.aget(k) for k in values])
            assert 0 < sum(v is not None for v in found) < len(values)
            await cache.aset_many({k: v + 1000 for k, v in values.items()})
            by_id = {f"{n.host}:{n.port}": n for n in nodes[1:3]}
            for key, value in zip(wire, values.values()):
                owner = by_id[client.cluster.node_ids[client.cluster.node_index(key)]]
                assert value_on(owner, key) == b"%d" % (value + 1000), key
            assert await asyncio.gather(*[cache.aget(k) for k in values]) == [
                v + 1000 for v in values.values()
            ]
            await client.aclose()

        try:
            asyncio.run(scenario())
        finally:
            discovery.close()
        assert endpoint.requests == 2
