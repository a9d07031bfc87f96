"""ZODB on RelStorage (SQLite adapter) with ``cache-module-name django_fastcache.relstorage``.

Every test runs a writer and a reader as separate processes (tests/integration/
relstorage_worker.py) over one SQLite database and real memcached processes. RelStorage
4.x asks memcached only for objects whose transaction id it learnt by polling, so the
reader always polls (begins a transaction) before the writer commits, and again after.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import MemcachedCluster

try:
    import relstorage  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise  # the test extra installs RelStorage: in CI its absence is a failure
    pytest.skip(
        "RelStorage is not installed (pip install -e '.[relstorage]')", allow_module_level=True
    )

from tests.integration.relstorage_worker import PREFIX

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
MODULE = "django_fastcache.relstorage"
#: The module's timeout in these tests (FASTCACHE_RELSTORAGE_TIMEOUT): 1 s, as calls that
#: must succeed could take 0.3 s under load and put a node out (the test then found no
#: hits on it); the calls meant to time out face a paused memcached, which never answers.
TIMEOUT = 1.0
#: How long one request to a worker may take before the test gives up on it.
WORKER_LIMIT = 60.0
#: How long one ZODB call may take while memcached is dead or hung: a few of the module's
#: timeouts (a transaction touches memcached a few times) and the database's own time.
BOUNDED = 10 * TIMEOUT + 3.0


class Worker:
    """One ZODB process, driven one JSON line at a time."""

    def __init__(self, data_dir: Path, servers: list[str], **env: str) -> None:
        environment = {**os.environ, "FASTCACHE_RELSTORAGE_TIMEOUT": str(TIMEOUT), **env}
        environment.pop("DJANGO_SETTINGS_MODULE", None)
        code = "from tests.integration.relstorage_worker import main; main()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir), MODULE, *servers],
            cwd=ROOT,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._selector = selectors.DefaultSelector()
        assert self.process.stdout is not None
        self._selector.register(self.process.stdout, selectors.EVENT_READ)

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        if not self._selector.select(WORKER_LIMIT):
            self.process.kill()
            pytest.fail(f"worker did not answer {request['op']} within {WORKER_LIMIT}s")
        line = self.process.stdout.readline()
        if not line:
            assert self.process.stderr is not None
            self.process.wait(10)
            pytest.fail(f"worker died: {self.process.stderr.read().decode()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def begin(self) -> dict[str, Any]:
        return self.ask(op="begin")

    def write(self, objects: dict[str, bytes]) -> dict[str, Any]:
        encoded = {name: base64.b64encode(v).decode() for name, v in objects.items()}
        return self.ask(op="write", objects=encoded)

    def read(self, names: list[str]) -> tuple[dict[str, bytes | None], float]:
        answer = self.ask(op="read", names=names)
        values = {
            name: None if v is None else base64.b64decode(v) for name, v in answer["values"].items()
        }
        return values, answer["elapsed"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.ask(op="close")
            finally:
                self.process.wait(WORKER_LIMIT)
        self._selector.close()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    """Started workers, closed (or killed) at the end of the test."""
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            try:
                worker.close()
            except BaseException:
                worker.process.kill()
                worker.process.wait(10)


def pair(
    workers: list[Worker], data_dir: Path, servers: list[str], **env: str
) -> tuple[Worker, Worker]:
    """A writer and a reader over one database; the reader has polled once."""
    writer = Worker(data_dir, servers, **env)
    workers.append(writer)
    writer.write({"setup": b""})  # creates the schema and the root
    reader = Worker(data_dir, servers, **env)
    workers.append(reader)
    reader.begin()
    assert reader.read(["setup"])[0] == {"setup": b""}
    return writer, reader


def stats(locations: list[str]) -> dict[str, dict[str, int]]:
    client = BlockingClient(Cluster(locations, ClientSettings(timeout=5.0)))
    try:
        every = run_blocking(client.stats())
    finally:
        client.close_thread_connections()
    return {node: {k: int(v) for k, v in s.items() if v.isdigit()} for node, s in every.items()}


def hits(locations: list[str]) -> dict[str, int]:
    return {node: s["get_hits"] for node, s in stats(locations).items()}


def raw(locations: list[str]) -> BlockingClient:
    return BlockingClient(Cluster(locations, ClientSettings(timeout=5.0)))


def state_key(oid: int, tid: int) -> bytes:
    return f"{PREFIX}:state:{tid}:{oid}".encode()


def objects(count: int, size: int = 100) -> dict[str, bytes]:
    return {f"o{n}": os.urandom(size) for n in range(count)}


# -- reads come from memcached --------------------------------------------------------------


@pytest.fixture(params=["tcp", "unix", "four-nodes"])
def servers(request: pytest.FixtureRequest, memcached_cluster: MemcachedCluster) -> list[str]:
    """cache-servers as a zope.conf would give them: host:port, a bare socket path, or both."""
    if request.param == "tcp":
        return [memcached_cluster.tcp[0].pylibmc_location]
    if request.param == "unix":
        return [memcached_cluster.unix.pylibmc_location]
    return [server.pylibmc_location for server in memcached_cluster.servers]


def test_objects_committed_by_one_process_are_read_from_memcached_by_another(
    tmp_path: Path, workers: list[Worker], servers: list[str], memcached_cluster: MemcachedCluster
) -> None:
    locations = [s.location for s in memcached_cluster.servers if s.pylibmc_location in servers]
    writer, reader = pair(workers, tmp_path / "db", servers)
    written = objects(200)
    writer.write(written)
    before = hits(locations)
    reader.begin()  # polls: learns the new tids
    values, _ = reader.read(list(written))
    after = hits(locations)
    assert values == written
    gained = {node: after[node] - before[node] for node in after}
    # Every object (and the root, changed by the commit) came from memcached.
    assert sum(gained.values()) >= len(written)
    if len(locations) > 1:
        assert all(count > 0 for count in gained.values()), gained  # spread over the nodes


def test_reader_sees_the_state_in_memcached_not_the_database(
    tmp_path: Path, workers: list[Worker], memcached: MemcachedServer
) -> None:
    writer, reader = pair(workers, tmp_path / "db", [memcached.pylibmc_location])
    original = b"ORIGINAL" + os.urandom(32)
    answer = writer.write({"target": original, "other": b"untouched"})
    oid, tid = answer["ids"]["target"]
    client = raw([memcached.location])
    item = run_blocking(client.get(state_key(oid, tid)))
    assert item is not None, "the writer's commit did not store the state in memcached"
    assert item.value.count(b"ORIGINAL") == 1
    rewritten = item.value.replace(b"ORIGINAL", b"REWRITTE")
    assert run_blocking(client.set(state_key(oid, tid), rewritten, flags=item.flags))
    reader.begin()
    values, _ = reader.read(["target", "other"])
    # The database still holds ORIGINAL: only memcached could have answered REWRITTE.
    assert values == {"target": b"REWRITTE" + original[8:], "other": b"untouched"}


def test_states_round_trip_exactly(
    tmp_path: Path, workers: list[Worker], memcached_cluster: MemcachedCluster
) -> None:
    servers = [memcached_cluster.tcp[0].pylibmc_location, memcached_cluster.unix.pylibmc_location]
    locations = [memcached_cluster.tcp[0].location, memcached_cluster.unix.location]
    writer, reader = pair(workers, tmp_path / "db", servers)
    written = {
        "binary": bytes(range(256)) * 16,
        "framing": b"\r\nEND\r\nVALUE x 0 5\r\n",
        "empty": b"",
        "near_limit": os.urandom(1024 * 1024 - 8 * 1024),  # memcached's 1 MiB item limit
        "over_limit": os.urandom(1024 * 1024 + 1024),  # refused by memcached: from the database
    }
    answer = writer.write(written)
    writer.ask(op="write_empty", names=["no_attributes"])
    client = raw(locations)
    for name in ("binary", "empty", "near_limit"):
        oid, tid = answer["ids"][name]
        assert run_blocking(client.get(state_key(oid, tid))) is not None, name
    oid, tid = answer["ids"]["over_limit"]
    assert run_blocking(client.get(state_key(oid, tid))) is None
    before = sum(hits(locations).values())
    reader.begin()
    values, _ = reader.read([*written, "no_attributes"])
    assert values == {**written, "no_attributes": None}
    assert sum(hits(locations).values()) - before >= 5


def test_a_second_commit_is_read_at_its_new_tid(
    tmp_path: Path, workers: list[Worker], memcached: MemcachedServer
) -> None:
    writer, reader = pair(workers, tmp_path / "db", [memcached.pylibmc_location])
    first = writer.write({"x": b"one"})["ids"]["x"]
    reader.begin()
    assert reader.read(["x"])[0] == {"x": b"one"}
    second = writer.write({"x": b"two"})["ids"]["x"]
    assert second[1] > first[1]
    before = hits([memcached.location])
    reader.begin()
    assert reader.read(["x"])[0] == {"x": b"two"}
    assert sum(hits([memcached.location]).values()) > sum(before.values())


# -- memcached failing mid-run --------------------------------------------------------------


@pytest.fixture
def own_servers(tmp_path: Path) -> Iterator[list[MemcachedServer]]:
    """A TCP and a unix-socket memcached of the test's own, free to be killed or stopped."""
    made = [MemcachedServer(), MemcachedServer(tmp_path / "mc.sock")]
    for server in made:
        server.start()
    yield made
    for server in made:
        server.stop()


@pytest.mark.faults
@pytest.mark.parametrize("failure", ["kill", "hang"])
def test_zodb_keeps_working_when_memcached_dies_or_hangs(
    tmp_path: Path, workers: list[Worker], own_servers: list[MemcachedServer], failure: str
) -> None:
    servers = [server.pylibmc_location for server in own_servers]
    writer, reader = pair(workers, tmp_path / "db", servers)
    written = objects(40)
    writer.write(written)
    reader.begin()
    assert reader.read(list(written))[0] == written
    before = hits([s.location for s in own_servers])
    assert all(before.values()), before  # both nodes served reads before the failure

    victim = own_servers[0]
    if failure == "kill":
        victim.kill()
    else:
        victim.pause()
    try:
        for round_ in range(3):
            fresh = {f"r{round_}-{n}": os.urandom(300) for n in range(30)}
            commit = writer.write(fresh)
            assert commit["elapsed"] < BOUNDED, commit
            begun = reader.begin()
            assert begun["elapsed"] < BOUNDED, begun
            values, elapsed = reader.read(list(fresh) + list(written)[:10])
            assert values == {**fresh, **{k: written[k] for k in list(written)[:10]}}
            assert elapsed < BOUNDED
        # The surviving node is still used for the keys it owns.
        survivor = own_servers[1].location
        assert hits([survivor])[survivor] > before[survivor]
    finally:
        if failure == "hang":
            victim.resume()


# -- configuration as zope.conf gives it ---------------------------------------------------


def test_zconfig_relstorage_section_uses_the_module(
    tmp_path: Path, memcached_cluster: MemcachedCluster
) -> None:
    import transaction
    import ZODB.config
    from ZODB.utils import u64

    tcp, unix = memcached_cluster.tcp[0], memcached_cluster.unix
    config = f"""
    %import relstorage
    <zodb main>
      <relstorage>
        cache-servers {tcp.pylibmc_location} {unix.pylibmc_location}
        cache-module-name {MODULE}
        cache-prefix {PREFIX}
        <sqlite3>
          data-dir {tmp_path / "db"}
        </sqlite3>
      </relstorage>
    </zodb>
    """
    db = ZODB.config.databaseFromString(config)
    try:
        manager = transaction.TransactionManager()
        connection = db.open(transaction_manager=manager)
        connection.root()["x"] = marker = b"zconfig-" + os.urandom(8)
        manager.commit()
        root = connection.root()
        key = state_key(u64(root._p_oid), u64(root._p_serial))
        item = run_blocking(raw([tcp.location, unix.location]).get(key))
        assert item is not None
        assert marker in item.value
        connection.close()
    finally:
        db.close()
