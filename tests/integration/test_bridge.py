"""The synchronous path: threads, a caller that already runs an event loop, and fork().

The :class:`BlockingClient`'s coroutines never suspend, so :func:`run_blocking` finishes them
on the calling thread. These tests check that this holds up where synchronous callers live:
many threads at once, inside a running event loop, and in a child process after ``fork()``,
for the asyncio :class:`Client` as well.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import pytest

from django_fastcache.bridge import BridgeError, run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.protocol import Item
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import MemcachedCluster

pytestmark = pytest.mark.integration

CHILD_TIMEOUT = 10.0


def blocking_client(locations: list[str], timeout: float = 2.0) -> BlockingClient:
    return BlockingClient(Cluster(locations, ClientSettings(timeout=timeout)))


def total_connections(server: MemcachedServer) -> int:
    """The server's count of connections ever accepted, asked over a new plain socket."""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"stats\r\n")
        reply = b""
        while not reply.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            reply += chunk
    for line in reply.decode().split("\r\n"):
        if line.startswith("STAT total_connections "):
            return int(line.split()[2])
    raise AssertionError("no total_connections in stats")


def wait_for_child(pid: int, timeout: float = CHILD_TIMEOUT) -> int:
    """The child's exit code; it is killed (and the test fails) if it runs past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child did not finish within {timeout}s")
        time.sleep(0.01)


def fork_and_run(child: Callable[[], bool]) -> int:
    """Run ``child`` in a forked process; its exit code is 0 when it returned True."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            code = 0 if child() else 1
        finally:
            os._exit(code)
    return wait_for_child(pid)


# -- threads -------------------------------------------------------------------------------------
def test_sixteen_threads_get_set_and_incr_at_once(memcached_cluster: MemcachedCluster) -> None:
    locations = memcached_cluster.locations
    client = blocking_client(locations)
    threads_count, rounds = 16, 100
    run_blocking(client.set(b"shared-counter", b"0"))
    start = threading.Barrier(threads_count, timeout=10)
    errors: list[BaseException] = []
    increments: list[list[int]] = [[] for _ in range(threads_count)]

    def worker(n: int) -> None:
        try:
            start.wait()
            own = [b"thread:%d:%d" % (n, i) for i in range(5)]
            for i in range(rounds):
                key = own[i % len(own)]
                value = b"%d-%d" % (n, i)
                assert run_blocking(client.set(key, value)) is True
                assert run_blocking(client.get(key)) == Item(key, value, 0, None)
                new_value = run_blocking(client.incr(b"shared-counter"))
                assert new_value is not None
                increments[n].append(new_value)
            found = run_blocking(client.get_many(own))
            assert set(found) == set(own)
            assert all(item.value.startswith(b"%d-" % n) for item in found.values())
        except BaseException as exc:
            errors.append(exc)
            start.abort()
        finally:
            client.close_thread_connections()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors[:3]
    final = run_blocking(client.get(b"shared-counter"))
    assert final is not None
    assert int(final.value) == threads_count * rounds
    # Each increment was seen by exactly one thread: the server did them one at a time.
    seen = sorted(v for per_thread in increments for v in per_thread)
    assert seen == list(range(1, threads_count * rounds + 1))
    client.close_thread_connections()


def test_each_thread_has_its_own_connection(memcached: MemcachedServer) -> None:
    client = blocking_client([memcached.location])
    before = total_connections(memcached)
    ready = threading.Barrier(4, timeout=10)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(10):
                run_blocking(client.get(b"k"))
            ready.wait()  # every thread still holds its connection here
        except BaseException as exc:
            errors.append(exc)
            ready.abort()
        finally:
            client.close_thread_connections()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not errors, errors
    # Four threads, ten calls each: four connections (and the probe's own).
    assert total_connections(memcached) - before == 4 + 1


# -- inside a running event loop -------------------------------------------------------------------
def test_sync_calls_from_inside_a_running_event_loop(memcached: MemcachedServer) -> None:
    blocking = blocking_client([memcached.location])

    async def main() -> None:
        client = Client([memcached.location])
        try:
            # An asyncio call in flight on this very loop while the synchronous ones run.
            pending = asyncio.create_task(client.set(b"from-async", b"a"))
            assert run_blocking(blocking.set(b"from-sync", b"s")) is True
            assert run_blocking(blocking.get(b"from-sync")) == Item(b"from-sync", b"s", 0, None)
            assert await pending is True
            assert run_blocking(blocking.get(b"from-async")) == Item(b"from-async", b"a", 0, None)
            assert await client.get(b"from-sync") == Item(b"from-sync", b"s", 0, None)
            assert run_blocking(blocking.incr(b"missing")) is None
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 10))
    blocking.close_thread_connections()


def test_sync_calls_from_a_loop_running_in_another_thread(memcached: MemcachedServer) -> None:
    blocking = blocking_client([memcached.location])
    results: list[object] = []

    async def main() -> None:
        await asyncio.sleep(0)
        results.append(run_blocking(blocking.set(b"loop-thread", b"x")))
        results.append(run_blocking(blocking.get(b"loop-thread")))
        blocking.close_thread_connections()

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert results == [True, Item(b"loop-thread", b"x", 0, None)]


def test_a_coroutine_that_suspends_is_refused_and_closed() -> None:
    async def suspends() -> int:
        await asyncio.sleep(0)
        return 1

    coroutine = suspends()
    with pytest.raises(BridgeError):
        run_blocking(coroutine)
    assert coroutine.cr_frame is None  # closed: no "never awaited" warning either


# -- fork ------------------------------------------------------------------------------------------
def test_fork_with_the_blocking_client(memcached: MemcachedServer) -> None:
    client = blocking_client([memcached.location])
    assert run_blocking(client.set(b"parent", b"before fork")) is True  # connection open

    def child() -> bool:
        gc.collect()  # whatever the child let go of must not touch the parent's socket
        ok = run_blocking(client.set(b"child", b"from the child")) is True
        ok &= run_blocking(client.get(b"child")) == Item(b"child", b"from the child", 0, None)
        ok &= run_blocking(client.get(b"parent")) == Item(b"parent", b"before fork", 0, None)
        return ok

    before_fork = total_connections(memcached)
    assert fork_and_run(child) == 0
    before = total_connections(memcached)
    # The child opened exactly one connection of its own (the other one is the probe's).
    assert before - before_fork == 2
    # The parent's connection is still in step and still its own: no reconnect needed.
    assert run_blocking(client.get(b"child")) == Item(b"child", b"from the child", 0, None)
    assert run_blocking(client.get(b"parent")) == Item(b"parent", b"before fork", 0, None)
    assert total_connections(memcached) - before == 1  # the probe's own
    client.close_thread_connections()


def test_fork_twice_and_the_children_use_the_client_concurrently(
    memcached: MemcachedServer,
) -> None:
    client = blocking_client([memcached.location])
    run_blocking(client.set(b"counter", b"0"))
    pids = []
    for n in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                for _ in range(50):
                    run_blocking(client.incr(b"counter"))
                done = run_blocking(client.set(b"child:%d" % n, b"done"))
                code = 0 if done else 1
            finally:
                os._exit(code)
        pids.append(pid)
    assert [wait_for_child(pid) for pid in pids] == [0, 0]
    assert run_blocking(client.get(b"counter")) == Item(b"counter", b"100", 0, None)
    assert set(run_blocking(client.get_many([b"child:0", b"child:1"]))) == {
        b"child:0",
        b"child:1",
    }
    client.close_thread_connections()


def test_fork_with_the_asyncio_client(memcached: MemcachedServer) -> None:
    """The parent forks from inside its running loop, between two calls."""
    location = memcached.location

    async def in_child(client: Client) -> bool:
        gc.collect()  # whatever the child let go of must not touch the parent's sockets
        try:
            ok = await client.set(b"async-child", b"from the child") is True
            found = await client.get(b"async-parent")
            ok &= found == Item(b"async-parent", b"before fork", 0, None)
            # A fresh pool in the child: the parent's connection was not borrowed.
            ok &= client.pool_metrics()[location]["opened"] == 1
            return ok
        finally:
            await client.aclose()

    async def in_parent() -> None:
        client = Client([location])
        try:
            assert await client.set(b"async-parent", b"before fork") is True
            opened = client.pool_metrics()[location]["opened"]
            before_fork = total_connections(memcached)
            code = fork_and_run(lambda: asyncio.run(asyncio.wait_for(in_child(client), 5)))
            assert code == 0
            before = total_connections(memcached)
            assert before - before_fork == 2  # the child's own connection and the probe's
            found = await client.get(b"async-child")
            assert found == Item(b"async-child", b"from the child", 0, None)
            # The parent's connection was not disturbed: no reconnect.
            assert client.pool_metrics()[location]["opened"] == opened
            assert client.pool_metrics()[location]["closed"] == 0
            assert total_connections(memcached) - before == 1
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(in_parent(), 30))


def test_fork_with_both_clients_sharing_one_cluster(memcached: MemcachedServer) -> None:
    """As the Django backend uses them: one cluster, an asyncio and a blocking client."""
    location = memcached.location

    async def main() -> None:
        client = Client([location])
        blocking = BlockingClient(client.cluster)
        try:
            await client.set(b"both", b"0")
            run_blocking(blocking.incr(b"both"))

            def child() -> bool:
                async def child_loop() -> int | None:
                    try:
                        return await client.incr(b"both", 10)
                    finally:
                        await client.aclose()

                via_sync = run_blocking(blocking.incr(b"both", 100))
                via_async = asyncio.run(asyncio.wait_for(child_loop(), 5))
                return via_sync == 101 and via_async == 111

            assert fork_and_run(child) == 0
            assert run_blocking(blocking.incr(b"both")) == 112
            assert await client.incr(b"both") == 113
        finally:
            blocking.close_thread_connections()
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
