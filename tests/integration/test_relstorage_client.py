"""The RelStorage cache module's Client against real memcached, without RelStorage itself.

RelStorage's contract (read from its ``relstorage/cache/memcache_client.py``): it builds
``Client(servers)`` per storage instance and per connection, calls it with ``str`` keys and
``bytes`` values and catches nothing, so every failure here must come back as None or a miss.
Values written by ``relstorage.pylibmc_wrapper`` (pylibmc, ``binary=True``,
``min_compress_len=1000``) are written here with pylibmc the same way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from django_fastcache import relstorage
from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.servers import MemcachedServer, free_port
from tests.conftest import MemcachedCluster, connects_from_this_thread

pytestmark = pytest.mark.integration

#: Calls that must succeed get 1 s (at 0.3 s a call delayed by load put the node out, and
#: a Skipping client then missed what the test reads); calls meant to time out face a
#: paused memcached, which never answers.
TIMEOUT = 1.0
#: How far past its timeout a failing call may come back, at most: loose, it tells a call
#: that hangs from one a loaded machine delayed.
SLACK = 5.0
LOGGER = "django_fastcache.relstorage"


class Quick(relstorage.Client):
    """Short timeouts and no skipping, so a recovered node is used again at once."""

    timeout = TIMEOUT
    connect_timeout = TIMEOUT
    retry_after = 0.0


class Skipping(Quick):
    """Skips a failed node for longer than any test runs."""

    retry_after = 600.0


def raw(location: str) -> BlockingClient:
    """Our plain client, to look at what is stored and how (flags)."""
    return BlockingClient(Cluster([location], ClientSettings(timeout=2.0)))


@pytest.fixture
def own_memcached() -> Iterator[MemcachedServer]:
    """A TCP memcached of the test's own, free to be killed or stopped."""
    server = MemcachedServer()
    server.start()
    yield server
    server.stop()


# -- contract -------------------------------------------------------------------------------


def test_import_needs_no_django_settings() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = (
        "import sys, django_fastcache.relstorage as r\n"
        "loaded = [m for m in sys.modules if m == 'django' or m.startswith('django.')]\n"
        "assert not loaded, loaded\n"
        "assert r.Client(['127.0.0.1:1']).get('k') is None\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()


def test_construction_does_no_io(memcached: MemcachedServer) -> None:
    with connects_from_this_thread() as attempts:
        clients = [relstorage.Client([memcached.location]) for _ in range(100)]
        relstorage.Client([f"127.0.0.1:{free_port()}"])
    assert attempts == []
    # And every client of one configuration shares one process-wide client.
    assert len({id(c._shared) for c in clients}) == 1


def test_binary_values_round_trip_exactly(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    values = {
        "p:state:1:1": bytes(range(256)) * 4,
        "p:state:1:2": b"",
        "p:state:1:3": b"\r\nEND\r\nVALUE x 0 1\r\n",
        "p:state:1:4": os.urandom(1024 * 1024 - 1024),  # near the 1 MiB item limit
        "p:state:1:5": b"\x00" * 8,
    }
    for key, value in values.items():
        assert client.set(key, value) is True
        assert client.get(key) == value
    wanted = [*values, "p:state:9:9"]
    found = client.get_multi(wanted)
    assert found == values
    assert all(type(k) is str for k in found)
    client.flush_all()
    assert client.set_multi(values) == []
    assert client.get_multi(list(values)) == values


def test_value_over_the_item_limit_is_refused_not_raised(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    assert client.set("big", b"x" * (2 * 1024 * 1024)) is False
    assert client.set_multi({"big": b"x" * (2 * 1024 * 1024), "small": b"s"}) == ["big"]
    assert client.get_multi(["big", "small"]) == {"small": b"s"}
    # The connection stayed in step.
    assert client.get("small") == b"s"


def test_keys_memcached_cannot_carry_are_hashed(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    keys = ["x" * 300, "with space", "tab\there", "line\nbreak", "ünïcode:ключ", "\x7f"]
    for number, key in enumerate(keys):
        assert client.set(key, b"v%d" % number) is True
    assert client.get_multi(keys) == {key: b"v%d" % n for n, key in enumerate(keys)}
    assert client.get(keys[0]) == b"v0"
    assert client.delete(keys[1]) is True
    assert client.get(keys[1]) is None
    # Distinct long keys stay distinct.
    assert client.set("y" * 300, b"other") is True
    assert client.get("x" * 300) == b"v0"


def test_plain_keys_are_sent_as_their_utf8_bytes(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    client.set("p:state:5:6", b"state")
    item = run_blocking(raw(memcached.location).get(b"p:state:5:6"))
    assert item is not None
    assert (item.value, item.flags) == (b"state", 0)


def test_values_pylibmc_wrapper_stored_are_read(memcached: MemcachedServer) -> None:
    pylibmc = pytest.importorskip("pylibmc")
    theirs = pylibmc.Client([memcached.pylibmc_location], binary=True)
    theirs.set_behaviors({"tcp_nodelay": True, "ketama": True})
    small, large = b"\x01\x02small", bytes(range(256)) * 40
    # relstorage.pylibmc_wrapper stores with min_compress_len=1000.
    theirs.set("k:small", small, min_compress_len=1000)
    theirs.set("k:large", large, min_compress_len=1000)
    stored = run_blocking(raw(memcached.location).get(b"k:large"))
    assert stored is not None
    assert stored.flags == relstorage.FLAG_ZLIB  # it really is compressed
    client = Quick([memcached.location])
    assert client.get_multi(["k:small", "k:large"]) == {"k:small": small, "k:large": large}
    assert client.get("k:large") == large


def test_compressed_values_are_read_by_pylibmc(memcached: MemcachedServer) -> None:
    pylibmc = pytest.importorskip("pylibmc")

    class Compressing(Quick):
        compress_min_length = 1000

    value = b"abc" * 1000
    client = Compressing([memcached.location])
    assert client.set("k", value) is True
    stored = run_blocking(raw(memcached.location).get(b"k"))
    assert stored is not None
    assert stored.flags == relstorage.FLAG_ZLIB
    assert len(stored.value) < len(value)
    assert client.get("k") == value
    assert pylibmc.Client([memcached.pylibmc_location], binary=True).get("k") == value
    # Incompressible values are kept as they are.
    noise = os.urandom(2000)
    client.set("n", noise)
    stored = run_blocking(raw(memcached.location).get(b"n"))
    assert stored is not None
    assert (stored.flags, stored.value) == (0, noise)


def test_unknown_flags_and_bad_compression_are_misses(memcached: MemcachedServer) -> None:
    plain = raw(memcached.location)
    run_blocking(plain.set(b"pickled", b"\x80\x04K\x01.", flags=1))
    run_blocking(plain.set(b"text", b"abc", flags=16))
    run_blocking(plain.set(b"broken", b"not zlib", flags=relstorage.FLAG_ZLIB))
    run_blocking(plain.set(b"good", zlib.compress(b"fine"), flags=relstorage.FLAG_ZLIB))
    client = Quick([memcached.location])
    assert client.get_multi(["pickled", "text", "broken", "good"]) == {"good": b"fine"}
    assert client.get("pickled") is None
    assert client.get("broken") is None


def test_older_releases_add_and_incr(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    assert client.incr("count") is None
    assert client.add("count", 0) is True
    assert client.add("count", 5) is False
    assert client.incr("count", 3) == 3
    assert client.get("count") == 3
    assert client.set("text", b"abc") is True
    assert client.incr("text") is None  # memcached refuses: not a number


def test_delete_flush_all_and_disconnect_all(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    client.set_multi({"a": b"1", "b": b"2"})
    assert client.delete("a") is True
    assert client.delete("a") is False
    client.disconnect_all()
    assert client.get("b") == b"2"  # reconnects
    client.flush_all()
    assert client.get_multi(["a", "b"]) == {}


# -- server spellings and settings ---------------------------------------------------------


def test_server_spellings(memcached_cluster: MemcachedCluster) -> None:
    unix = memcached_cluster.unix
    tcp = memcached_cluster.tcp[0]
    assert unix.socket_path is not None
    Quick([unix.location]).set("k", b"over unix")
    for spelling in (unix.socket_path, f"unix:{unix.socket_path}"):
        assert Quick([spelling]).get("k") == b"over unix"
    Quick([tcp.location]).set("k", b"over tcp")
    for spelling in (f"127.0.0.1:{tcp.port}", f"inet:127.0.0.1:{tcp.port}"):
        assert Quick([spelling]).get("k") == b"over tcp"
    # RelStorage splits cache-servers on whitespace; a single string is split the same way.
    both = Quick(f"{tcp.location}   {unix.socket_path}")
    assert both.settings is not None
    assert both._shared is not None
    assert both._shared.cluster.node_ids == (tcp.location, f"unix:{unix.socket_path}")


@pytest.mark.parametrize(
    "servers", [["nonsense:::"], [], "", ["host:99999"], [" "], None, 11211, [None]]
)
def test_unusable_configuration_is_logged_not_raised(
    servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    relstorage._reported.clear()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        client = relstorage.Client(servers)
        again = relstorage.Client(servers)
    assert client.settings is None
    assert client.get("k") is None
    assert client.get_multi(["k"]) is None
    assert client.set("k", b"v") is None
    assert client.set_multi({"k": b"v"}) is None
    assert client.delete("k") is None
    assert again.add("k", b"v") is None
    assert again.incr("k") is None
    client.flush_all()
    client.disconnect_all()
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 1  # once per configuration, not once per Client
    assert "disabled" in errors[0].getMessage()


def test_settings_from_environment_and_subclass(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = relstorage.Client(["127.0.0.1:11211"]).settings
    assert defaults == relstorage.RelStorageSettings(0.5, 0.5, 2.0, 0, 64 * 1024 * 1024)
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_TIMEOUT", "0.25")
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_CONNECT_TIMEOUT", "0.1")
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_RETRY_AFTER", "30")
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_COMPRESS_MIN_LENGTH", "1000")
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_MAX_VALUE_SIZE", "2097152")
    from_env = relstorage.Client(["127.0.0.1:11211"]).settings
    assert from_env == relstorage.RelStorageSettings(0.25, 0.1, 30.0, 1000, 2 * 1024 * 1024)

    class Mine(relstorage.Client):
        timeout = 2.0

    mine = Mine(["127.0.0.1:11211"]).settings
    assert mine is not None
    assert (mine.timeout, mine.retry_after) == (2.0, 30.0)


def test_bad_environment_values_fall_back_to_defaults(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    relstorage._reported.clear()
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_TIMEOUT", "soon")
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_RETRY_AFTER", "-1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        settings = relstorage.Client(["127.0.0.1:11211"]).settings
        relstorage.Client(["127.0.0.1:11211"])  # a Client per connection: no new warnings
    assert settings is not None
    assert (settings.timeout, settings.retry_after) == (0.5, 2.0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "FASTCACHE_RELSTORAGE_TIMEOUT" in messages[0]
    assert "FASTCACHE_RELSTORAGE_RETRY_AFTER" in messages[1]


def test_zero_timeout_disables_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    relstorage._reported.clear()
    monkeypatch.setenv("FASTCACHE_RELSTORAGE_TIMEOUT", "0")
    client = relstorage.Client(["127.0.0.1:11211"])
    assert client.settings is None
    assert client.get("k") is None


# -- failures -------------------------------------------------------------------------------


def timed(call: object) -> tuple[object, float]:
    assert callable(call)
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_dead_node_gives_misses_and_comes_back(
    own_memcached: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = Quick([own_memcached.location])
    assert client.set("k", b"v") is True
    own_memcached.kill()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for call in (
        lambda: client.get("k"),
        lambda: client.get_multi(["k"]),
        lambda: client.set("k", b"w"),
        lambda: client.delete("k"),
        lambda: client.incr("k"),
    ):
        result, took = timed(call)
        assert result in (None, {})
        assert took < TIMEOUT + SLACK
    assert client.set_multi({"a": b"1"}) == ["a"]
    client.flush_all()  # answers nothing, raises nothing
    own_memcached.restart()
    assert client.set("k", b"back") is True
    assert client.get("k") == b"back"
    # Every call above retried the node (retry_after 0), yet one outage is one warning.
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 2, messages
    assert "failed" in messages[0]
    assert messages[1] == f"memcached node {own_memcached.location} answers again"


def test_hung_node_costs_one_timeout_then_is_skipped(
    own_memcached: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = Skipping([own_memcached.location])
    assert client.set("k", b"v") is True
    own_memcached.pause()
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            result, took = timed(lambda: client.get("k"))
            assert result is None
            assert TIMEOUT * 0.9 <= took < TIMEOUT + SLACK
            # Marked out: further calls do not touch the node at all.
            with connects_from_this_thread() as attempts:
                results = [client.get("k"), client.get_multi(["k"]), client.set("k", b"x")]
            assert results == [None, {}, None]
            assert attempts == []
        # The module's own warning (the client's node-health warning comes on its logger).
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
        assert len(warnings) == 1
        assert own_memcached.location in warnings[0].getMessage()
    finally:
        own_memcached.resume()


def test_garbage_reply_is_a_miss_and_the_connection_is_replaced() -> None:
    with FakeMemcached(values={b"k": b"v"}) as fake:
        fake.script(Action.GARBAGE)
        client = Quick([fake.location])
        assert client.get("k") is None
        assert client.get("k") == b"v"  # retry_after 0: the node is asked again at once
        assert fake.accepted == 2


def test_one_node_down_leaves_the_others_answering() -> None:
    servers = [MemcachedServer().start() for _ in range(3)]
    try:
        client = Skipping([s.location for s in servers])
        keys = [f"p:state:1:{n}" for n in range(60)]
        assert client.set_multi({k: k.encode() for k in keys}) == []
        servers[1].kill()
        found = client.get_multi(keys)
        assert found is not None
        assert 0 < len(found) < len(keys)  # the dead node's keys, and only those, are missed
        assert all(found[k] == k.encode() for k in found)
        missing = [k for k in keys if k not in found]
        assert client.set_multi({k: b"new" for k in keys}) == missing
        assert client.get_multi(keys) == {k: b"new" for k in keys if k not in missing}
    finally:
        for server in servers:
            server.stop()


class SlowSkipping(Skipping):
    """A timeout long enough that three nodes waited for in turn outlast one plus SLACK."""

    timeout = 3.0


def test_several_nodes_hung_cost_one_shared_timeout() -> None:
    servers = [MemcachedServer().start() for _ in range(4)]
    try:
        client = SlowSkipping([s.location for s in servers])
        keys = [f"k{n}" for n in range(40)]
        assert client.set_multi({k: b"v" for k in keys}) == []
        for server in servers[:3]:
            server.pause()
        found, took = timed(lambda: client.get_multi(keys))
        assert isinstance(found, dict)
        assert 0 < len(found) < len(keys)
        # The nodes are waited for at once, not in turn (which takes 3 x 3 s at least).
        assert took < SlowSkipping.timeout + SLACK
    finally:
        for server in servers:
            server.stop()


def test_an_unexpected_error_is_logged_not_raised(
    memcached: MemcachedServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = Quick([memcached.location])
    assert client._shared is not None

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(client._shared.client, "get_now", broken)
    monkeypatch.setattr(client._shared.client, "_pipelines", broken)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert client.get("k") is None
        assert client.get_multi(["k"]) is None
        assert client.set_multi({"k": b"v"}) is None
    assert sum("boom" in (r.exc_text or "") for r in caplog.records) == 3


# -- processes and threads ------------------------------------------------------------------


def test_fork_child_and_parent_both_keep_working(memcached: MemcachedServer) -> None:
    client = Quick([memcached.location])
    assert client.set("parent", b"p") is True
    assert client.get("parent") == b"p"  # the parent has an open connection now
    pid = os.fork()
    if pid == 0:  # the child: exits with 0 only if every answer is right
        ok = False
        try:
            child = Quick([memcached.location])
            ok = (
                child.get("parent") == b"p"
                and child.set("child", b"c") is True
                and child.get_multi(["parent", "child"]) == {"parent": b"p", "child": b"c"}
            )
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for n in range(20):  # the parent's connection is still in step
        assert client.set(f"p{n}", b"%d" % n) is True
        assert client.get(f"p{n}") == b"%d" % n
    assert client.get("child") == b"c"


def test_threads_share_clients_without_crossing_replies(memcached: MemcachedServer) -> None:
    errors: list[str] = []

    def work(number: int) -> None:
        client = Quick([memcached.location])
        for n in range(200):
            key = f"t{number}:{n}"
            value = os.urandom(64)
            if client.set(key, value) is not True or client.get_multi([key]) != {key: value}:
                errors.append(key)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
