"""A process that runs out of file descriptors is in trouble of its own: a healthy node must
not be marked out for every process on the host because of it, and its calls stay bounded
by the timeout.

A worker process (a subprocess, so the limit is its own) warms a FastCache up, drops its
memcached connections, then lowers ``RLIMIT_NOFILE`` and takes every descriptor left, so
the next connect fails with EMFILE. The node stays up host-wide, and the process's calls
come back within the timeout: reads from the disk tier, writes with a LocalResourceError.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.disk import NodeStates
from django_fastcache.errors import ConnectFailedError, LocalResourceError
from django_fastcache.testing.servers import MemcachedServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.faults]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 1.0
#: A loose bound on one call: its timeout, plus the disk tier's lock wait, plus slack.
BOUND = TIMEOUT + 2 * TIMEOUT + 1.0

WORKER = textwrap.dedent(
    """
    import errno, json, os, resource, sys, time
    sys.path.insert(0, {root!r})
    from tests.consistency.worker import configure_django
    configure_django([{location!r}], {{
        "disk_directory": {directory!r},
        "operation_timeout": {timeout!r},
        "connect_timeout": {timeout!r},
    }})
    from django.core.cache import cache
    from django_fastcache.backends import fastcache

    cache.set("before", "kept")
    assert cache.get("before") == "kept"
    tiered = cache._shared().tiered
    assert tiered.flush(30.0)  # its disk copy landed (written behind, by another thread)
    # This thread's SQLite connections open on its first disk read: open them now.
    assert tiered.disk.get(cache.wire_key("before")) is not None
    for shared in list(fastcache._shared.values()):
        shared.blocking.close_thread_connections()  # the next call must connect again

    # Take every descriptor the lowered limit leaves.
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))
    hogs = []
    while True:
        try:
            hogs.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
            break

    outcome = {{}}
    def timed(name, call):
        began = time.monotonic()
        try:
            outcome[name] = repr(call())
        except Exception as exc:
            outcome[name] = type(exc).__name__
        outcome[name + "_took"] = time.monotonic() - began

    timed("set", lambda: cache.set("k", "v"))
    timed("get", lambda: cache.get("before"))
    timed("get_many", lambda: cache.get_many(["before", "k"]))
    timed("delete", lambda: cache.delete("before"))
    outcome["state"] = cache.tier_stats()["nodes"][{location!r}]["state"]
    for fd in hogs:
        os.close(fd)
    print(json.dumps(outcome))
    """
)


def test_running_out_of_descriptors_marks_no_node_out(
    memcached: MemcachedServer, tmp_path: Path
) -> None:
    directory = str(tmp_path / "disk")
    script = WORKER.format(
        root=str(ROOT), location=memcached.location, directory=directory, timeout=TIMEOUT
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    # The node was never marked out, in the worker or for the host.
    assert outcome["state"] == "up", outcome
    states = NodeStates(directory, (memcached.location,))
    assert not states.is_out(0)
    # Every call came back within its bound.
    for name in ("set", "get", "get_many", "delete"):
        assert outcome[name + "_took"] < BOUND, outcome
    # Reads were answered by the disk tier; writes said what went wrong.
    assert outcome["get"] == "'kept'", outcome
    assert outcome["get_many"] == "{'before': 'kept'}", outcome
    assert outcome["set"] == "LocalResourceError", outcome
    assert outcome["delete"] == "LocalResourceError", outcome


def _exhausted_child(kind: str, location: str) -> str:
    """In a child: lower the limit, take every descriptor, connect; the error's type name."""
    script = textwrap.dedent(
        f"""
        import asyncio, errno, os, resource, sys
        sys.path.insert(0, {str(ROOT)!r})
        from django_fastcache.bridge import run_blocking
        from django_fastcache.client import Client
        from django_fastcache.client.blocking import BlockingClient
        from django_fastcache.client.cluster import ClientSettings, Cluster
        blocking = BlockingClient(Cluster([{location!r}], ClientSettings(timeout=1.0)))
        async def main():
            client = Client([{location!r}], timeout=1.0)
            hog()
            try:
                await client.get(b"k")
            except Exception as exc:
                return type(exc).__name__
        def hog():
            highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, resource.getrlimit(
                resource.RLIMIT_NOFILE)[1]))
            while True:
                try:
                    os.open("/dev/null", os.O_RDONLY)
                except OSError:
                    return
        if {kind!r} == "async":
            loop = asyncio.new_event_loop()
            print(loop.run_until_complete(main()))
        else:
            hog()
            try:
                run_blocking(blocking.get(b"k"))
            except Exception as exc:
                print(type(exc).__name__)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("kind", ["async", "blocking"])
def test_a_connect_failing_for_want_of_descriptors_is_a_local_error(
    kind: str, memcached: MemcachedServer
) -> None:
    assert _exhausted_child(kind, memcached.location) == "LocalResourceError"


def test_a_refused_connect_names_the_fix() -> None:
    location = f"127.0.0.1:{free_port()}"  # nothing listens there

    async def via_async() -> BaseException:
        client = Client([location], timeout=TIMEOUT)
        try:
            await client.get(b"k")
        except ConnectFailedError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("connected to a closed port")

    blocking = BlockingClient(Cluster([location], ClientSettings(timeout=TIMEOUT)))
    with pytest.raises(ConnectFailedError) as caught:
        run_blocking(blocking.get(b"k"))
    for error in (asyncio.run(via_async()), caught.value):
        assert not isinstance(error, LocalResourceError)
        assert f"is memcached running on {location}? check LOCATION" in str(error)


def test_a_busy_pool_marks_no_node_out(memcached: MemcachedServer, disk_directory: str) -> None:
    """An async caller that finds its pool's every connection busy past its timeout learns
    nothing of the node: the node stays up for the host (no outage, no replay), the read is
    answered by the disk tier, and the write says what went wrong."""
    from django_fastcache.backends import FastCache
    from django_fastcache.errors import ConnectTimeoutError

    directory = disk_directory
    cache = FastCache(
        [memcached.location],
        {
            "OPTIONS": {
                "disk_directory": directory,
                "operation_timeout": 0.3,
                "connect_timeout": TIMEOUT,
                "max_connections": 1,
            }
        },
    )
    tiered = cache._shared().tiered
    assert tiered is not None

    async def scenario() -> dict[str, object]:
        outcome: dict[str, object] = {}
        await cache.aset("k", "kept")
        assert tiered.flush(30.0)  # its disk copy landed
        pool = cache.client._pools()[0]
        held = await pool.acquire(asyncio.get_running_loop().time() + 30.0)
        try:
            outcome["get"] = await cache.aget("k")
            # Many keys: one wait, not one per key (each would wait as long again).
            waits = pool.metrics.wait_timeouts
            outcome["get_many"] = await cache.aget_many(["k", "absent"])
            outcome["get_many_waits"] = pool.metrics.wait_timeouts - waits
            try:
                await cache.aset("k", "new")
            except ConnectTimeoutError as exc:
                outcome["set"] = exc
            outcome["state"] = node_state(cache)
        finally:
            pool.release(held)
        outcome["after"] = await cache.aget("k")
        return outcome

    try:
        outcome = asyncio.run(scenario())
    finally:
        cache.close()
    assert outcome["state"] == "up", outcome
    assert not NodeStates(directory, (memcached.location,)).is_out(0)
    assert outcome["get"] == "kept", outcome
    assert outcome["get_many"] == {"k": "kept"}, outcome
    assert outcome["get_many_waits"] == 1, outcome
    assert isinstance(outcome["set"], LocalResourceError), outcome
    assert "max_connections" in str(outcome["set"])
    assert outcome["after"] == "kept", outcome


def node_state(cache: object) -> str:
    stats = cache.tier_stats()  # type: ignore[attr-defined]
    return str(next(iter(stats["nodes"].values()))["state"])


def test_a_busy_pool_in_a_get_many_over_two_nodes_is_not_blamed_on_the_first_key_s(
    memcached_cluster: object, disk_directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A get_many over two nodes whose second node's pool is busy: the warning names the
    busy node (it once named the first key's, whose pool was fine), and the first node's
    answer stands (its key is not asked again)."""
    import logging

    from django_fastcache.backends import FastCache

    first, second = memcached_cluster.tcp[:2]  # type: ignore[attr-defined]
    cache = FastCache(
        [first.location, second.location],
        {
            "OPTIONS": {
                "disk_directory": disk_directory,
                "operation_timeout": 0.3,
                "connect_timeout": TIMEOUT,
                "max_connections": 1,
            }
        },
    )
    tiered = cache._shared().tiered
    assert tiered is not None
    cluster = cache.client.cluster
    # A key of each node, the first node's first.
    keys: dict[int, str] = {}
    for n in range(1000):
        keys.setdefault(cluster.node_index(cache.wire_key(f"k{n}")), f"k{n}")
        if len(keys) == 2:
            break
    on_first, on_second = keys[0], keys[1]

    async def scenario() -> dict[str, object]:
        await cache.aset_many({on_first: 1, on_second: 2})
        assert tiered.flush(30.0)  # their disk copies landed
        pool = cache.client._pools()[1]
        held = await pool.acquire(asyncio.get_running_loop().time() + 30.0)
        try:
            with caplog.at_level(logging.WARNING, logger="django_fastcache"):
                return await cache.aget_many([on_first, on_second])
        finally:
            pool.release(held)

    try:
        found = asyncio.run(scenario())
    finally:
        cache.close()
    warnings = [r.getMessage() for r in caplog.records if "could not reach" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        f"could not reach memcached node {second.location} from this process: "
    ), warnings
    assert first.location not in warnings[0]
    assert found == {on_first: 1, on_second: 2}  # the second's by the disk tier
