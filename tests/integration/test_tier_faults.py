"""The disk tier against faults of its host: files removed or replaced under running
processes, permissions changed by a deploy, fork() at a bad moment, a write still in the
kernel's send queue when a partition ends.

Real memcached processes of each test's own; other processes are real ones too (forked,
or spawned fresh as a process started later would be). Conditions are waited for by
bounded polling; every case fails without the fix it guards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_fastcache.backends import FastCache
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.testing.servers import MemcachedServer
from django_fastcache.tiered import TieredStore
from tests.conftest import set_tree_mode
from tests.twins import twin

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.skipif(not MemcachedServer.available(), reason="memcached is not installed"),
]

#: Calls that must succeed get 1 s (at 0.2 s a call delayed by load put the node out and
#: sent the case to the disk tier); the calls meant to time out face a paused server or a
#: partition held far longer.
TIMEOUT = 1.0
OPTIONS: dict[str, Any] = {"operation_timeout": TIMEOUT, "connect_timeout": TIMEOUT}
#: Bounded waits for conditions (the probe's backoff tops out at 2 s).
PATIENCE = 20.0


def make_cache(locations: list[str], directory: str, **options: Any) -> FastCache:
    return FastCache(locations, {"OPTIONS": {**OPTIONS, "disk_directory": directory, **options}})


def wait_for(condition: Callable[[], bool], timeout: float = PATIENCE) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.01)
    return True


def node_states(cache: FastCache) -> list[str]:
    stats = cache.tier_stats()
    assert stats is not None
    return [node["state"] for node in stats["nodes"].values()]


@pytest.fixture
def server() -> Iterator[MemcachedServer]:
    with MemcachedServer() as started:
        yield started


# -- fork() while another thread holds a lock -------------------------------------------------


def _fork(work: Callable[[], None]) -> int:
    """A child running ``work()`` and exiting 0, or 1 with the traceback on stderr; it
    never returns into the parent's code (pytest's included)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _outcomes(pids: list[int], bound: float = PATIENCE) -> list[int | str]:
    """Each child's exit code, or "hung" for one still running after ``bound`` seconds
    (then killed)."""
    codes: dict[int, int | str] = {}
    deadline = time.monotonic() + bound
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            codes[pid] = "hung"
    return [codes[pid] for pid in pids]


def test_fork_while_another_thread_holds_the_journal_lock(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A prefork server forks while a thread journals a write (the node is out): each
    child's first cache call takes the journal's lock, which the parent's thread held at
    the fork and nothing in the child would ever release."""
    cache = make_cache([server.location], disk_directory)
    server.kill()
    cache.set("before", 0)  # the node is out from here: writes are journaled
    assert node_states(cache) == ["out"]
    journal = cache._shared().tiered.journal  # type: ignore[union-attr]
    holding, forked = threading.Event(), threading.Event()

    def hold() -> None:
        with journal.transaction():
            holding.set()
            forked.wait(0.3)  # past the first fork, if that fork does not wait for it

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(PATIENCE)
    pids = []
    for i in range(3):

        def child(i: int = i) -> None:
            cache.set(f"child-{i}", i)
            assert cache.get(f"child-{i}") == i

        pids.append(_fork(child))
        forked.set()
    holder.join(PATIENCE)
    assert _outcomes(pids) == [0, 0, 0]
    for i in range(3):  # journaled and on disk, host-wide
        assert cache.get(f"child-{i}") == i
    stats = cache.tier_stats()
    assert stats is not None
    assert next(iter(stats["nodes"].values()))["journal_length"] >= 4


def test_forked_children_count_on_one_counter_while_the_parent_writes(
    server: MemcachedServer, disk_directory: str
) -> None:
    """Six children forked while two threads of the parent keep writing (journaled
    writes during an outage, then the same with memcached up): every child's increment
    counts, none fails or hangs."""
    cache = make_cache([server.location], disk_directory)
    for phase in ("outage", "up"):
        if phase == "outage":
            server.kill()
            cache.set("warm", 0)
            assert node_states(cache) == ["out"]
        else:
            server.restart()
            assert wait_for(lambda: node_states(cache) == ["up"]), "the node never came back"
        cache.set("counter", 0)
        stop = threading.Event()
        errors: list[str] = []

        def busy(tag: str, stop: threading.Event = stop, errors: list[str] = errors) -> None:
            n = 0
            while not stop.is_set():
                try:
                    n += 1
                    cache.set(f"busy-{tag}", n)
                    cache.delete(f"gone-{tag}")
                    cache.incr("counter", 0)
                except Exception:
                    errors.append(traceback.format_exc())
                    return

        threads = [threading.Thread(target=busy, args=(tag,)) for tag in "ab"]
        for thread in threads:
            thread.start()
        try:
            pids = []
            for _ in range(6):
                pids.append(_fork(lambda: cache.incr("counter") and None))
                time.sleep(0.005)  # forks land at different points of the writers' loops
            outcomes = _outcomes(pids)
        finally:
            stop.set()
            for thread in threads:
                thread.join(PATIENCE)
        assert errors == [], errors[0]
        assert outcomes == [0] * 6, phase
        assert cache.get("counter") == 6, phase


# -- the directory made read-only for processes started from then on --------------------------


def _late_process(location: str, directory: str, keys: list[str], results: Any) -> None:
    """A process started after the deploy's chmod, without the capability to override it."""
    from tests.integration.test_faults_tiered import _drop_privileges

    outcome: dict[str, Any] = {"skip": _drop_privileges(), "errors": [], "refused": None}
    try:
        if outcome["skip"] is None and os.access(directory, os.W_OK, effective_ids=True):
            outcome["skip"] = "the directory is still writable by this process"
        if outcome["skip"] is None:
            from django.core import checks
            from django.core.exceptions import ImproperlyConfigured

            from tests.consistency.worker import configure_django

            configure_django([location], {**OPTIONS, "disk_directory": directory})
            from django.core.cache import cache

            outcome["checks"] = [m.id for m in checks.run_checks() if m.id.startswith("django")]
            try:
                for key in keys:
                    cache.set(key, f"new {key}")
            except ImproperlyConfigured as exc:
                outcome["refused"] = str(exc)
    except BaseException:
        outcome["errors"].append(traceback.format_exc())
    results.put(outcome)


def test_a_process_started_on_a_directory_made_read_only_refuses_clearly(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A deploy made the tier's directory read-only; processes started before keep it
    open read-write. A process started afterwards must not write to memcached alone: the
    older process would answer the misses after a memcached restart with the values those
    writes replaced (30 of 30 keys did). It refuses, naming the fix."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    older = make_cache([server.location], disk_directory)
    keys = [f"key-{i}" for i in range(30)]
    for key in keys:
        older.set(key, f"old {key}")
    assert wait_for(lambda: all(older._shared().tiered.disk.get(older.wire_key(k)) for k in keys))  # type: ignore[union-attr]
    set_tree_mode(disk_directory, 0o500, 0o400)
    try:
        results = spawn.Queue()
        process = spawn.Process(
            target=_late_process, args=(server.location, disk_directory, keys, results)
        )
        process.start()
        outcome = results.get(timeout=60)
        process.join(PATIENCE)
    finally:
        set_tree_mode(disk_directory, 0o700, 0o600)
    if outcome["skip"]:
        pytest.skip(f"cannot make the directory read-only for a process: {outcome['skip']}")
    assert outcome["errors"] == [], outcome["errors"][0]
    server.restart()  # memcached empty: the older process answers from its disk tier
    answers = [older.get(key) for key in keys]
    overwritten = [key for key, value in zip(keys, answers) if value == f"old {key}"]
    # Either the late process wrote nothing (it refused), or the older one must not
    # answer with what it replaced.
    if outcome["refused"] is None:
        assert overwritten == [], f"{len(overwritten)} of {len(keys)} keys read their old value"
    assert outcome["refused"] is not None
    assert "chmod -R u+rwX" in outcome["refused"]
    assert "django_fastcache.E051" in outcome["checks"]


# -- the tier's files removed or replaced under running processes -----------------------------


def _settled(cache: FastCache) -> None:
    """Every write made so far has its disk copy (the tier may write it behind memcached)."""
    tiered = cache._shared().tiered
    assert tiered is not None
    flush = getattr(tiered, "flush", None)
    if flush is not None:
        assert flush(PATIENCE), "the disk copies of the writes made so far did not land"


def _clean_states_and_journal(disk_directory: str) -> None:
    """Remove the node states' and the journal's files, as a temp cleaner would."""
    nodes = os.path.join(disk_directory, "nodes")
    for path in [os.path.join(nodes, name) for name in os.listdir(nodes)] + [
        os.path.join(disk_directory, n)
        for n in os.listdir(disk_directory)
        if n.startswith("journal")
    ]:
        os.unlink(path)


def _out_after_a_hang(server: MemcachedServer, cache: FastCache) -> None:
    """``key`` written and on disk; then memcached hangs, the node is marked out, and
    memcached runs again (the node stays out until a replay)."""
    cache.set("key", "before")
    _settled(cache)
    server.pause()
    try:
        cache.get("probe-the-hang")
    finally:
        server.resume()
    assert node_states(cache) == ["out"]


def _hang(server: MemcachedServer, cache: FastCache, writes: dict[str, Any]) -> None:
    """memcached hangs (SIGSTOP, keeping its values); ``writes`` are made meanwhile
    (journaled); then it continues and the node is brought back."""
    server.pause()
    try:
        cache.get("probe-the-hang")  # times out: the node is out from here
        assert node_states(cache) == ["out"]
        for key, value in writes.items():
            cache.set(key, value)
    finally:
        server.resume()
    assert wait_for(lambda: node_states(cache) == ["up"]), "the node never came back"


def _in_new_process(
    location: str,
    directory: str,
    writes: dict[str, Any],
    read: list[str],
    hung: bool = False,
    until_up: bool = False,
) -> dict[str, Any]:
    """A process started now (spawned: nothing inherited) makes ``writes`` (after a call
    that finds memcached hung, when ``hung``), waits until they have their disk copies, and
    reads ``read``: what it read."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    process = spawn.Process(
        target=_process, args=(location, directory, writes, read, hung, until_up, results)
    )
    process.start()
    try:
        outcome: dict[str, Any] = results.get(timeout=60)
    finally:
        process.join(PATIENCE)
    assert outcome["errors"] == [], outcome["errors"][0]
    return outcome["read"]  # type: ignore[no-any-return]


def _process(
    location: str,
    directory: str,
    writes: dict[str, Any],
    read: list[str],
    hung: bool,
    until_up: bool,
    results: Any,
) -> None:
    outcome: dict[str, Any] = {"errors": [], "read": {}}
    try:
        from tests.consistency.worker import configure_django

        configure_django([location], {**OPTIONS, "disk_directory": directory})
        from django.core.cache import cache

        if hung:
            cache.get("probe-the-hang")
            assert node_states(cache) == ["out"]  # type: ignore[arg-type]
        for key, value in writes.items():
            cache.set(key, value)
        _settled(cache)  # type: ignore[arg-type]
        if until_up:  # brought back by this process's maintenance thread
            assert wait_for(lambda: node_states(cache) == ["up"])  # type: ignore[arg-type]
        outcome["read"] = {key: cache.get(key) for key in read}
    except BaseException:
        outcome["errors"].append(traceback.format_exc())
    results.put(outcome)


def _read_in_new_process(location: str, directory: str, keys: list[str]) -> dict[str, Any]:
    return _in_new_process(location, directory, {}, keys)


def _older(read: dict[str, Any], older: dict[str, Any]) -> list[str]:
    return [key for key, value in read.items() if value is not None and value == older[key]]


def test_journal_files_removed_between_outages(
    server: MemcachedServer, disk_directory: str
) -> None:
    """An age-based temp cleaner removes the journal (written only during outages) while
    the process runs. The next hang's writes go to the file the process still has open,
    which no other process reads: when another process brings the node back, it replays
    the new, empty journal, and the pre-outage values come back."""
    from django_fastcache.maintenance import maintenance

    cache = make_cache([server.location], disk_directory)
    tiered = cache._shared().tiered
    assert tiered is not None
    keys = [f"key-{i}" for i in range(20)]
    before = {key: f"before {key}" for key in keys}
    for key, value in before.items():
        cache.set(key, value)
    _settled(cache)
    _hang(server, cache, {"first-outage": 1})  # the journal is made, and opened
    for name in os.listdir(disk_directory):
        if name.startswith("journal"):
            os.unlink(os.path.join(disk_directory, name))
    # Another process brings the node back this time (whichever probes first does).
    maintenance.unregister(tiered)
    try:
        server.pause()
        try:
            cache.get("probe-the-hang")
            assert node_states(cache) == ["out"]
            for key in keys:
                cache.set(key, f"during {key}")
        finally:
            server.resume()
        _in_new_process(server.location, disk_directory, {}, [], until_up=True)
        assert node_states(cache) == ["up"]
    finally:
        maintenance.register(tiered)
    read = {key: cache.get(key) for key in keys}
    assert _older(read, before) == [], "pre-outage values came back in the running process"
    assert _older(_read_in_new_process(server.location, disk_directory, keys), before) == [], (
        "pre-outage values came back in a new process"
    )


def _lose(paths: list[str], how: str) -> None:
    for path in paths:
        if how == "removed":
            os.unlink(path)
        else:
            os.truncate(path, 0)


def _journaled_in_a_hang_by_a_process_gone_since(
    server: MemcachedServer, disk_directory: str
) -> None:
    """``key`` written ("before") and on disk; then, in a hang that memcached outlives
    with its values, written again ("during", journaled) by a process that exits."""
    _in_new_process(server.location, disk_directory, {"key": "before"}, [])
    server.pause()
    try:
        _in_new_process(server.location, disk_directory, {"key": "during"}, [], hung=True)
    finally:
        server.resume()


@pytest.mark.parametrize("how", ["removed", "truncated"])
@pytest.mark.parametrize("files", ["journal", "node states"])
def test_outage_files_lost_while_no_process_runs(
    server: MemcachedServer, disk_directory: str, files: str, how: str
) -> None:
    """A process journals a write during a hang and exits; a cleaner (or a deploy) then
    removes or truncates the journal, or the node states, while no process runs; memcached,
    which kept its values through the hang, runs again. The next process must not serve
    the value the journaled write replaced: a replay it cannot trust flushes the node, and
    a node whose state was lost while the journal names keys goes out for their replay."""
    _journaled_in_a_hang_by_a_process_gone_since(server, disk_directory)
    if files == "journal":
        names = [n for n in os.listdir(disk_directory) if n.startswith("journal")]
        _lose([os.path.join(disk_directory, n) for n in names], how)
    else:
        nodes = os.path.join(disk_directory, "nodes")
        _lose([os.path.join(nodes, n) for n in os.listdir(nodes) if n != "distrust.state"], how)
    read = _in_new_process(server.location, disk_directory, {}, ["key"], until_up=True)
    assert read == {"key": "during"}


def test_node_states_made_again_by_a_process_that_died_before_checking_them(
    server: MemcachedServer, disk_directory: str
) -> None:
    """As above, the node states lost while no process runs; then a process makes them
    again (the node reads as up there) and dies before it asked the journal. The next
    process must still ask: the page says no process has."""
    from django_fastcache.client.cluster import ClientSettings, Cluster
    from django_fastcache.disk.nodestate import NodeStates

    _journaled_in_a_hang_by_a_process_gone_since(server, disk_directory)
    nodes = os.path.join(disk_directory, "nodes")
    _lose([os.path.join(nodes, n) for n in os.listdir(nodes) if n != "distrust.state"], "removed")
    node_ids = Cluster([server.location], ClientSettings()).node_ids
    made = NodeStates(nodes, node_ids)  # the process that dies
    assert not made.is_out(0)
    read = _in_new_process(server.location, disk_directory, {}, ["key"], until_up=True)
    assert read == {"key": "during"}


def test_writes_journaled_after_the_journal_was_lost_still_flush_the_node(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The journal is lost between two processes of one outage, and the second journals
    writes of its own in a new one: replaying those alone would leave the first's keys
    with their older values in memcached. The node is flushed whole instead."""
    _in_new_process(server.location, disk_directory, {"key": "before", "other": "before"}, [])
    server.pause()
    try:
        _in_new_process(server.location, disk_directory, {"key": "during"}, [], hung=True)
        names = [n for n in os.listdir(disk_directory) if n.startswith("journal")]
        _lose([os.path.join(disk_directory, n) for n in names], "removed")
        _in_new_process(server.location, disk_directory, {"other": "during"}, [], hung=True)
    finally:
        server.resume()
    read = _in_new_process(server.location, disk_directory, {}, ["key", "other"], until_up=True)
    assert read == {"key": "during", "other": "during"}


def test_directory_deleted_and_made_again_by_a_process_started_later(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The tier's directory is deleted while process P runs; Q, started afterwards, makes
    it again. P must not answer with its own older values of keys Q overwrote (20 of 20
    did, after memcached restarted empty), nor, after a hang, read the pre-outage values
    of keys Q wrote during it."""
    import shutil

    older = make_cache([server.location], disk_directory)
    tiered = older._shared().tiered
    assert tiered is not None
    keys = [f"key-{i}" for i in range(20)]
    mine = {key: f"P {key}" for key in keys}
    for key, value in mine.items():
        older.set(key, value)
    _settled(older)
    shutil.rmtree(disk_directory)
    theirs = {key: f"Q {key}" for key in keys}
    _in_new_process(server.location, disk_directory, theirs, [])
    server.restart()  # empty: only the disk tiers can answer
    read = {key: older.get(key) for key in keys}
    assert _older(read, mine) == [], (
        f"P answered {len(_older(read, mine))} keys with its old values"
    )

    # P moves to the directory's files within a maintenance round.
    assert wait_for(lambda: tiered.states.reopened > 0), "P kept the removed files"
    later = [f"later-{i}" for i in range(20)]
    pre = {key: f"pre {key}" for key in later}
    _in_new_process(server.location, disk_directory, pre, [])
    server.pause()
    try:
        during = {key: f"during {key}" for key in later}
        _in_new_process(server.location, disk_directory, during, [], hung=True)
    finally:
        server.resume()
    read = {key: older.get(key) for key in later}
    assert wait_for(lambda: node_states(older) == ["up"]), "the node never came back"
    after = {key: older.get(key) for key in later}
    assert _older(read, pre) == [], "pre-outage values came back during the recovery"
    assert _older(after, pre) == [], "pre-outage values came back after the recovery"


# -- a timed-out write still on its way when the node comes back ------------------------------


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_write_timed_out_in_a_partition_never_lands_after_the_replay(
    server: MemcachedServer, disk_directory: str, api: str
) -> None:
    """A set times out in a partition (journaled, acknowledged: the disk tier has it)
    while its bytes are still in the sender's send queue. The partition heals, the node
    answers a probe, is replayed and marked up; then TCP delivers the old set, and its
    value comes back. Nothing of a timed-out request may be left to deliver: the failed
    connection is closed by a reset, which discards it (the proxy models the partition:
    what it holds is what the sender's kernel would still hold)."""
    import asyncio

    from django_fastcache.testing.proxy import DelayProxy

    with DelayProxy(server.location, partition=True) as proxy:
        cache = make_cache([proxy.location], disk_directory)
        tiered = cache._shared().tiered
        assert tiered is not None

        def write(key: str, value: str) -> None:
            if api == "sync":
                cache.set(key, value)
            else:
                asyncio.run(cache.aset(key, value))

        write("key", "before")
        assert cache.get("key") == "before"
        # The partition: held far longer than a call's timeout and the replay's wait.
        proxy.delay = 4 * TIMEOUT + 2 * tiered.replay_settle
        write("key", "timed out")  # times out: the node is out, the write journaled
        assert node_states(cache) == ["out"]
        write("key", "latest")  # journaled
        proxy.delay = 0.0  # healed: the probe answers at once
        assert wait_for(lambda: node_states(cache) == ["up"]), "the node never came back"
        assert wait_for(lambda: proxy.pending_bytes() == 0), "the proxy kept bytes"
        assert cache.get("key") in ("latest", None)
    # And memcached itself does not hold the old value (a new process reads it there).
    read = _read_in_new_process(server.location, disk_directory, ["key"])
    assert read["key"] in ("latest", None)


def _probed(client: BlockingClient, answered: threading.Event) -> BlockingClient:
    """A twin of a blocking client that sets ``answered`` once a ``version`` probe was
    answered."""

    async def version(**kwargs: Any) -> Any:
        result = await client.version(**kwargs)
        answered.set()
        return result

    return twin(client, version=version)


def test_a_replay_never_acts_on_a_probe_answered_before_the_node_went_out_again(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The shape the soak found: a replay's probe answers, and while it waits for late
    requests to land, another process brings the node back and the node hangs again,
    with a set timed out in its sockets. Had the first replay then gone ahead at once on
    its old probe (memcached continuing just then), its deletes could run before that set,
    and the old value come back. It must probe again instead."""
    with _driven_tier(server, disk_directory) as (cache, tiered):  # it drives the replays itself
        _out_after_a_hang(server, cache)
        tiered.replay_settle = 4 * TIMEOUT + 2.0  # long enough for the steps below, by far
        outcome: list[int | None] = []
        real, answered = tiered.blocking, threading.Event()
        tiered.blocking = _probed(real, answered)
        waiting = threading.Thread(target=lambda: outcome.append(tiered.bring_back(0)))
        began = time.monotonic()
        waiting.start()
        assert answered.wait(PATIENCE), "the replay's probe was not answered"
        tiered.blocking = real
        # Meanwhile, another process's replay brings the node back...
        with tiered.journal.transaction() as connection:
            type(tiered.journal).forget(connection, tiered.cluster.node_ids[0])
            tiered.states.mark_up(0)
        # ... and it hangs again, a set timed out in its sockets, a newer one journaled.
        server.pause()
        try:
            cache.set("key", "timed out")
            assert node_states(cache) == ["out"]
            cache.set("key", "latest")
        finally:
            server.resume()
        assert time.monotonic() - began < tiered.replay_settle, "the steps took too long"
        waiting.join(PATIENCE)
        assert outcome == [None], "the replay went ahead on a probe from the earlier outage"
        assert node_states(cache) == ["out"]
        tiered.replay_settle = 2 * TIMEOUT
        assert wait_for(lambda: tiered.bring_back(0) is not None)
    assert node_states(cache) == ["up"]
    assert cache.get("key") in ("latest", None)


def test_forked_children_read_the_disk_while_the_parent_lands_writes(
    server: MemcachedServer, disk_directory: str
) -> None:
    """Children forked while the parent's writer behind memcached commits to the disk
    tier: each child's first read that needs the disk opens it (a write to every shard)
    and must not wait on a lock that only the parent's thread held at the fork."""
    from django_fastcache.bridge import run_blocking

    cache = make_cache([server.location], disk_directory)
    cache.set("present", "on disk")
    _settled(cache)
    wire = cache.wire_key("present")
    assert run_blocking(cache._shared().blocking.delete(wire))  # memcached lost it
    stop = threading.Event()

    def busy() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            cache.set(f"busy-{n % 64}", n)

    threads = [threading.Thread(target=busy) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        pids = []
        for _ in range(8):

            def child() -> None:
                assert cache.get("present") == "on disk"
                cache.set("child", os.getpid())
                _settled(cache)

            pids.append(_fork(child))
            time.sleep(0.003)  # forks land at different points of the parent's commits
        outcomes = _outcomes(pids, bound=10.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(PATIENCE)
    assert outcomes == [0] * 8


@contextlib.contextmanager
def _two_processes(
    server: MemcachedServer, disk_directory: str
) -> Iterator[tuple[FastCache, FastCache, TieredStore, TieredStore]]:
    """Two configurations of one directory in this process, standing for two processes:
    (a, b, a's tier, b's tier), which the test drives (the maintenance thread leaves them
    alone until the block ends)."""
    from django_fastcache.maintenance import maintenance

    a = make_cache([server.location], disk_directory)
    b = make_cache([server.location], disk_directory, max_connections=3)
    tier_a, tier_b = a._shared().tiered, b._shared().tiered
    assert tier_a is not None
    assert tier_b is not None
    assert tier_a is not tier_b
    for tier in (tier_a, tier_b):
        maintenance.unregister(tier)
    try:
        yield a, b, tier_a, tier_b
    finally:
        for tier in (tier_a, tier_b):
            maintenance.register(tier)


def test_a_process_still_on_removed_state_files_never_journals_past_a_replay(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A temp cleaner removes the journal and the node states during a hang. Process A
    moves to the new files, replays and marks the node up there, and writes; process B,
    not moved yet, still reads "out" in the removed file. B's next write must not be
    journaled where no replay will look while memcached keeps A's older value."""
    from django_fastcache.maintenance import check_files

    with _two_processes(server, disk_directory) as (a, b, tier_a, _tier_b):
        a.set("key", "before")
        _settled(a)
        server.pause()
        try:
            a.get("probe-the-hang")
            assert node_states(a) == node_states(b) == ["out"]
            b.set("key", "during")  # journaled
        finally:
            server.resume()
        _clean_states_and_journal(disk_directory)
        check_files(tier_a)  # A moves: the new files, the journal carried over
        tier_a.replay_settle = 0.0
        assert tier_a.bring_back(0) == 1
        assert node_states(a) == ["up"]
        a.set("key", "after")  # to memcached
        b.set("key", "latest")  # B still reads "out" in its removed file
        assert a.get("key") in ("latest", None)
    assert wait_for(lambda: node_states(a) == ["up"])
    assert a.get("key") in ("latest", None)
    assert b.get("key") in ("latest", None)


def test_only_the_process_that_replays_a_node_says_it_brought_it_back(
    server: MemcachedServer, disk_directory: str
) -> None:
    """Every process probes an out node; the one whose probe replays the journal brought it
    back (its count of keys replayed). One whose probe finds it already up did not: None,
    so its maintenance thread sends no node_back, and counts no replay."""
    with _two_processes(server, disk_directory) as (a, b, tier_a, tier_b):
        tier_a.replay_settle = tier_b.replay_settle = 0.0
        _out_after_a_hang(server, a)
        b.set("key", "during")  # journaled
        assert tier_a.bring_back(0) == 1
        assert tier_b.bring_back(0) is None
        assert (tier_a.metrics.replays, tier_b.metrics.replays) == (1, 0)
        assert node_states(b) == ["up"]
    assert b.get("key") == "during"


def test_a_journal_removed_while_a_write_commits_sends_its_keys_to_the_replay_of_the_new_one(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A temp cleaner removes the journal and the node states while process B's journaled
    write is in its transaction (B already read the node states). Meanwhile process A moves
    to the new files, replays the new, empty journal and marks the node up there. B finds
    its committed journal removed and carries the key over: the node must go out again on
    the files every process reads now, not on the removed ones only B still maps, or A
    reads the value B's write replaced. (Found by a soak: 281 reads of older values.)"""
    from django_fastcache.maintenance import check_files

    with _two_processes(server, disk_directory) as (a, b, tier_a, tier_b):
        follow_b = tier_b.journal.on_transaction
        assert follow_b is not None

        def cleaner_and_a_meanwhile() -> None:
            follow_b()  # B's own check: the files are still the directory's
            tier_b.journal.on_transaction = follow_b
            _clean_states_and_journal(disk_directory)
            check_files(tier_a)  # A moves: the node is out on the new files too
            tier_a.replay_settle = 0.0
            assert tier_a.bring_back(0) == 0  # nothing journaled there yet: up again
            assert node_states(a) == ["up"]

        _out_after_a_hang(server, a)
        assert node_states(b) == ["out"]
        tier_b.journal.on_transaction = cleaner_and_a_meanwhile
        b.set("key", "during")  # journaled; its journal removed before it commits
        assert tier_b.journal.carried_over == 1
        assert node_states(a) == ["out"], "the carried key's node was left up for A"
        assert a.get("key") in ("during", None)
    assert wait_for(lambda: node_states(a) == node_states(b) == ["up"])
    assert a.get("key") in ("during", None)
    assert b.get("key") in ("during", None)


def test_writes_the_journal_cannot_take_during_an_outage_flush_the_node_at_its_replay(
    server: MemcachedServer, disk_directory: str
) -> None:
    """While the node hangs, the journal cannot take a write (its lock held past waiting;
    a full disk does the same). The node still holds the value that write replaced, and
    its journal does not name the key: replaying it alone would bring the older value back
    once the node serves again. The replay flushes the node whole instead."""
    import sqlite3

    cache = make_cache([server.location], disk_directory)
    tiered = cache._shared().tiered
    assert tiered is not None
    cache.set("key", "before")
    cache.set("other", "kept by memcached until the flush")
    _settled(cache)
    tiered.journal.close()
    tiered.journal.timeout = 0.2  # (read when it connects again)
    server.pause()
    try:
        cache.get("probe-the-hang")
        assert node_states(cache) == ["out"]
        holder = sqlite3.connect(tiered.journal.path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # another process's long transaction
            cache.set("key", "during")  # the journal refuses it
            assert tiered.states.flush_needed(0)
            assert cache.get("key") is None  # the disk entry it was to replace: hidden
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    finally:
        server.resume()
    assert wait_for(lambda: node_states(cache) == ["up"]), "the node never came back"
    assert not tiered.states.flush_needed(0)
    assert cache.get("key") in ("during", None), "the replaced value came back"
    assert _read_in_new_process(server.location, disk_directory, ["key"])["key"] in (
        "during",
        None,
    )


def test_a_write_the_journal_refuses_during_a_replay_sends_the_node_out_again(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A write whose journal transaction failed asks for a flush, then reads the node's
    state; the replay marks the node up, then reads the request. Asked for between the
    replay's look and its marking up (the writer still saw the node out), the flush is not
    lost: the node goes out again and the next replay flushes it."""
    from django_fastcache.maintenance import maintenance

    cache = make_cache([server.location], disk_directory)
    tiered = cache._shared().tiered
    assert tiered is not None
    maintenance.unregister(tiered)  # this test brings the node back
    states = tiered.states
    try:
        _out_after_a_hang(server, cache)

        def mark_up(node: int) -> None:
            states.must_flush(node)  # a writer that saw the node out, just before
            states.mark_up(node)

        tiered.states = twin(states, mark_up=mark_up)
        tiered.replay_settle = 0.0
        try:
            assert tiered.bring_back(0) is None  # replayed, then out again: not back
        finally:
            tiered.states = states
        assert states.is_out(0), "marked up with a flush asked for and not made"
        assert states.flush_needed(0)
        assert tiered.bring_back(0) == 0  # flushed whole this time
        assert not states.is_out(0)
        assert not states.flush_needed(0)
        assert tiered.blocking.get_now(b":1:key") is None  # memcached was flushed
    finally:
        maintenance.register(tiered)


def test_a_replay_whose_flush_fails_keeps_the_flush_asked_for(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The replay takes the request for a flush, then the flush fails (the node hangs
    again): the request must outlive it, or the next replay would only delete the
    journaled keys and leave the value the unjournaled write replaced."""
    from django_fastcache.errors import OperationTimeoutError

    with _driven_tier(server, disk_directory) as (cache, tiered):  # this test brings the node back
        _out_after_a_hang(server, cache)
        tiered.states.must_flush(0)  # a write of the outage the journal could not take
        tiered.replay_settle = 0.0

        def flush_all(nodes: list[int] | None = None) -> None:
            raise OperationTimeoutError("the node hung again")

        blocking = tiered.blocking
        tiered.blocking = twin(blocking, flush_all=flush_all)
        try:
            assert tiered.bring_back(0) is None
        finally:
            tiered.blocking = blocking
        assert tiered.states.is_out(0)
        assert tiered.states.flush_needed(0), "the flush asked for was lost with the failure"
        assert tiered.bring_back(0) == 0
        assert not tiered.states.is_out(0)
        assert blocking.get_now(b":1:key") is None  # flushed


def test_a_replay_killed_while_it_flushes_leaves_the_flush_asked_for(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The replay takes the request for a flush, and its process is killed (SIGKILL: the
    OOM killer, a deploy) while the flush is in flight: no handler runs. The request must
    outlive the process, or the next replay would only delete the journaled keys and
    serve the value the unjournaled write replaced."""
    with _driven_tier(server, disk_directory) as (cache, tiered):
        _out_after_a_hang(server, cache)  # memcached keeps "before"
        tiered.states.must_flush(0)  # a write of the outage the journal could not take
        tiered.replay_settle = 0.0

        def killed_while_flushing() -> None:
            def flush_all(nodes: list[int] | None = None) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            tiered.blocking = twin(tiered.blocking, flush_all=flush_all)
            tiered.bring_back(0)

        pid = _fork(killed_while_flushing)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status)
        assert os.WTERMSIG(status) == signal.SIGKILL
        assert tiered.states.is_out(0)
        assert tiered.states.flush_needed(0), "the flush asked for died with the replay"
        assert tiered.bring_back(0) == 0
        assert not tiered.states.is_out(0)
        assert tiered.blocking.get_now(b":1:key") is None  # flushed


def _journal_removed_during_the_replay(
    tier_a: TieredStore, disk_directory: str, meanwhile: Callable[[], None]
) -> None:
    """Process A replays the node: inside its transaction (on the journal's file of then),
    a temp cleaner removes the journal, and ``meanwhile()`` runs (another process)."""
    blocking = tier_a.blocking

    def delete_many_at(node: int, keys: list[bytes]) -> Any:
        for name in os.listdir(disk_directory):
            if name.startswith("journal"):
                os.unlink(os.path.join(disk_directory, name))
        meanwhile()
        return blocking.delete_many_at(node, keys)

    tier_a.replay_settle = 0.0
    tier_a.blocking = twin(blocking, delete_many_at=delete_many_at)
    try:
        tier_a.bring_back(0)
    finally:
        tier_a.blocking = blocking


def test_a_write_journaled_in_a_new_journal_during_a_replay_of_the_removed_one_is_replayed(
    server: MemcachedServer, disk_directory: str
) -> None:
    """A replays the node on the journal's file; a cleaner removes it; B, which had opened
    no journal yet, opens the new one at the path and journals a write there, having found
    the node out (two files: two locks, neither waits). The node's page names no journal
    (its outage's writes journaled by an earlier version, which records none), so nothing
    asks for a flush. A replay of the removed file alone must not leave the node up, or
    memcached serves the value B's write replaced."""
    with _two_processes(server, disk_directory) as (a, b, tier_a, tier_b):
        _out_after_a_hang(server, a)  # memcached keeps "before"
        a.set("other", "during")  # journaled by A, in the file the cleaner removes
        tier_a.states.mark_up(0)  # the page as an earlier version leaves it: no journal id
        tier_a.states.mark_out(0)
        assert tier_a.states.journal_of(0) == 0
        tier_b.journal.close()  # B has no connection open to the journal's file
        _journal_removed_during_the_replay(tier_a, disk_directory, lambda: b.set("key", "during"))
        assert node_states(a) == node_states(b) == ["out"], "brought back past B's write"
        assert a.get("key") == b.get("key") == "during"  # from disk
        tier_a.replay_settle = 0.0
        assert tier_a.bring_back(0) == 1  # the journal at the path: B's key
        assert node_states(a) == ["up"]
        assert a.get("key") in ("during", None)
        assert b.get("key") in ("during", None)


def test_a_write_journaled_as_a_replay_elsewhere_marks_the_node_up_sends_it_out_again(
    server: MemcachedServer, disk_directory: str
) -> None:
    """B found the node out and journals a write; before it records which journal, a
    replay of another file (one removed since, under its own lock) marks the node up
    without B's key. B must send the node out again before its write is acknowledged."""
    with _two_processes(server, disk_directory) as (a, b, tier_a, tier_b):
        _out_after_a_hang(server, a)  # memcached keeps "before"
        states = tier_b.states

        def replayed_elsewhere_first(node: int, journal_id: int, carried_from: int = 0) -> None:
            tier_a.states.mark_up(node)  # what the other file's replay does meanwhile
            states.journaled_in(node, journal_id, carried_from)

        tier_b.states = twin(states, journaled_in=replayed_elsewhere_first)
        try:
            b.set("key", "during")
        finally:
            tier_b.states = states
        assert node_states(a) == ["out"], "left up with B's key journaled"
        assert a.get("key") == "during"
        tier_a.replay_settle = 0.0
        assert tier_a.bring_back(0) == 1
        assert a.get("key") in ("during", None)


def test_a_process_moving_mid_outage_onto_files_with_another_journal_flushes_the_node(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The directory is deleted mid-outage under A, whose writes went to the journal of
    then; B, started since, finds the node out too and journals in the new journal. A moves
    onto the new node states before it carries its journal over (or dies first): a replay
    of the new journal alone would miss A's key, so it flushes the node."""
    import shutil

    from django_fastcache.maintenance import follow_state_files, maintenance

    with _driven_tier(server, disk_directory) as (a, tier_a):
        _out_after_a_hang(server, a)  # memcached keeps "before"
        a.set("key", "during")  # journaled by A
        shutil.rmtree(disk_directory)
        b = make_cache([server.location], disk_directory, max_connections=3)  # started now
        tier_b = b._shared().tiered
        assert tier_b is not None
        maintenance.unregister(tier_b)
        try:
            tier_b.node_failed(0)  # B finds the hang too
            b.set("other", "during")  # journaled in the new journal
            assert not tier_b.states.flush_needed(0)
            follow_state_files(tier_a)  # A moves (its journal not carried over yet)
            assert tier_b.states.flush_needed(0)
            tier_b.replay_settle = 0.0
            assert tier_b.bring_back(0) == 0  # flushed whole
            assert b.get("key") is None
        finally:
            maintenance.register(tier_b)


def test_a_replay_deletes_the_journaled_keys_at_the_node_replayed(disk_directory: str) -> None:
    """A deploy drops node C: the new processes route some of C's keys to A. A new process
    journals a write of such a key while A hangs; an old process replays A. The key's
    delete must go to A, whose value it replaced, not to C, where the old process would
    route it: A would otherwise serve the older value for good."""
    from django_fastcache.maintenance import maintenance

    with MemcachedServer() as a, MemcachedServer() as b, MemcachedServer() as c:
        old = make_cache([a.location, b.location, c.location], disk_directory)
        new = make_cache([a.location, b.location], disk_directory)
        old_tier, new_tier = old._shared().tiered, new._shared().tiered
        assert old_tier is not None
        assert new_tier is not None
        for tier in (old_tier, new_tier):
            maintenance.unregister(tier)
        try:

            def owner(cache: FastCache, key: str) -> str:
                cluster = cache._shared().client.cluster
                return cluster.node_ids[cluster.node_index(cache.wire_key(key))]

            keys = (f"key{n}" for n in range(10_000))
            key = next(
                k for k in keys if (owner(old, k), owner(new, k)) == (c.location, a.location)
            )
            new.set(key, "before")
            _settled(new)
            a.pause()
            try:
                probe = next(f"p{n}" for n in range(10_000) if owner(new, f"p{n}") == a.location)
                new.get(probe)  # times out: A is out, host-wide
                assert old_tier.states.is_out(0)
                new.set(key, "during")  # journaled for A
            finally:
                a.resume()
            old_tier.replay_settle = 0.0
            assert old_tier.bring_back(0) == 1
            assert new_tier.blocking.get_now(new.wire_key(key)) is None  # deleted at A
            assert new.get(key) in ("during", None)
        finally:
            for tier in (old_tier, new_tier):
                maintenance.register(tier)


def test_a_removed_journal_that_cannot_be_carried_over_has_its_nodes_flushed(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The journal removed under the process (a temp cleaner), and the new one cannot be
    made (here a directory stands at its path): the keys read from the removed file are in
    no journal, so their nodes stay out and are flushed whole at their replays."""
    cache = make_cache([server.location], disk_directory)
    tiered = cache._shared().tiered
    assert tiered is not None
    server.pause()
    try:
        cache.get("probe-the-hang")
        cache.set("key", "during")  # journaled
    finally:
        server.resume()
    for name in os.listdir(disk_directory):
        if name.startswith("journal"):
            os.unlink(os.path.join(disk_directory, name))
    os.mkdir(tiered.journal.path)
    assert not tiered.states.flush_needed(0)
    try:
        from django_fastcache.disk.store import DiskError

        with pytest.raises(DiskError):
            tiered.journal.carry_over_if_replaced()
        assert tiered.states.flush_needed(0)
        assert tiered.states.is_out(0)
    finally:
        os.rmdir(tiered.journal.path)


@contextlib.contextmanager
def _driven_tier(
    server: MemcachedServer, disk_directory: str
) -> Iterator[tuple[FastCache, TieredStore]]:
    """A cache on ``server`` whose store the maintenance thread leaves alone meanwhile: the
    test brings its node back (or moves it) itself."""
    from django_fastcache.maintenance import maintenance

    cache = make_cache([server.location], disk_directory)
    tiered = cache._shared().tiered
    assert tiered is not None
    maintenance.unregister(tiered)
    try:
        yield cache, tiered
    finally:
        maintenance.register(tiered)


@contextlib.contextmanager
def _journal_removed_in_an_outage(
    server: MemcachedServer, disk_directory: str
) -> Iterator[tuple[FastCache, TieredStore]]:
    """A cache whose node is out after a hang, with ``key`` written during the outage
    (journaled) and the journal's files then removed, as a temp cleaner would; the
    maintenance thread kept off its store (the test brings the node back)."""
    with _driven_tier(server, disk_directory) as (cache, tiered):
        _out_after_a_hang(server, cache)
        cache.set("key", "during")  # journaled
        for name in os.listdir(disk_directory):
            if name.startswith("journal"):
                os.unlink(os.path.join(disk_directory, name))
        yield cache, tiered


def test_keys_carried_over_outlive_a_transaction_that_fails_after_carrying_them(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The journal is removed during an outage (a temp cleaner); the next journaled write
    carries its keys over to a new file, then its own work fails and is rolled back. The
    keys carried must stay journaled: rolled back with it, they would be in no journal,
    and the replay would leave memcached's older value in place."""
    with _journal_removed_in_an_outage(server, disk_directory) as (cache, tiered):
        with pytest.raises(RuntimeError), tiered.journal.transaction():
            raise RuntimeError("the transaction's own work failed")
        with tiered.journal.transaction() as connection:
            journaled = tiered.journal.keys(connection, tiered.cluster.node_ids[0])
        assert journaled == [b":1:key"], "the keys carried over went with the rollback"
        tiered.replay_settle = 0.0
        assert tiered.bring_back(0) == 1
        assert cache.get("key") == "during"


def test_a_carry_over_that_fails_midway_frees_the_journal_and_flushes_its_nodes(
    server: MemcachedServer, disk_directory: str
) -> None:
    """Carrying a removed journal over fails after the keys went into the new file (here
    following the node states raises): its transaction must not stay open, as it holds
    the host's journal lock (every process's outage writes and replays would wait on it),
    and the keys, rolled back, are in no journal, so their node is flushed at its replay."""
    import sqlite3

    failures = iter([RuntimeError("following the node states failed")])
    with _journal_removed_in_an_outage(server, disk_directory) as (cache, tiered):
        journal = tiered.journal
        follow = journal.on_transaction
        assert follow is not None

        def failing_once() -> None:
            failure = next(failures, None)
            if failure is not None:
                raise failure
            follow()

        journal.on_transaction = failing_once
        try:
            with pytest.raises(RuntimeError):
                journal.carry_over_if_replaced()
        finally:
            journal.on_transaction = follow
        other = sqlite3.connect(journal.path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # "database is locked" while it is held
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert tiered.states.flush_needed(0)
        assert tiered.states.is_out(0)
        tiered.replay_settle = 0.0
        assert tiered.bring_back(0) == 0  # flushed whole
        assert cache.get("key") == "during"


def test_a_clear_that_finds_a_node_brought_back_meanwhile_flushes_it(
    server: MemcachedServer, disk_directory: str
) -> None:
    """clear() finds the node out and goes to journal the flush; the node is brought back
    before the journal's lock is had. The flush is then made on memcached, as for a node up
    all along: nothing from before the clear may be read again."""
    cache = make_cache([server.location], disk_directory)
    tiered = cache._shared().tiered
    assert tiered is not None
    cache.set("key", "before the clear")
    _settled(cache)
    states = tiered.states
    looks = iter([True])  # clear()'s own look: out; from then on, the node's state (up)

    def is_out(node: int) -> bool:
        return next(looks, None) or states.is_out(node)

    tiered.states = twin(states, is_out=is_out)
    try:
        cache.clear()
    finally:
        tiered.states = states
    assert tiered.blocking.get_now(b":1:key") is None, "the node was not flushed"
    assert cache.get("key") is None


def test_a_clear_one_node_refuses_clears_the_others_and_the_disk_then_raises(
    disk_directory: str,
) -> None:
    """clear() where this process cannot reach one node (out of descriptors, say: not the
    node's failure, which leaves it up): the other nodes and the disk are cleared all the
    same, and the refusal is raised at the end."""
    from django_fastcache.bridge import run_blocking
    from django_fastcache.errors import LocalResourceError

    with MemcachedServer() as first, MemcachedServer() as second:
        cache = make_cache([first.location, second.location], disk_directory)
        tiered = cache._shared().tiered
        assert tiered is not None
        keys = [f"key{n}" for n in range(40)]
        for key in keys:
            cache.set(key, key)
        _settled(cache)
        wires = {key: cache.wire_key(key) for key in keys}
        on_second = [k for k in keys if tiered.cluster.node_index(wires[k]) == 1]
        assert on_second, "no key on the second node"
        blocking = tiered.blocking

        async def flush_all_by_node(nodes: list[int]) -> dict[int, Any]:
            failed = await blocking.flush_all_by_node([n for n in nodes if n != 0])
            if 0 in nodes:
                failed[0] = LocalResourceError("this process is out of file descriptors")
            return failed

        with pytest.raises(LocalResourceError):
            run_blocking(tiered.clear(twin(blocking, flush_all_by_node=flush_all_by_node)))
        assert node_states(cache) == ["up", "up"]  # nothing was the nodes' fault
        left = [k for k in on_second if blocking.get_now(wires[k]) is not None]
        assert not left, f"the second node was not flushed: {left}"
        on_disk = [k for k in keys if tiered.disk.get(wires[k]) is not None]
        assert not on_disk, f"the disk was not cleared: {on_disk}"


def test_a_process_that_cannot_map_the_new_state_files_replays_nothing_until_it_can(
    server: MemcachedServer, disk_directory: str
) -> None:
    """The node states removed during an outage, and the new ones not to be mapped by this
    process for a while: it must not mark the node up on the pages it still has, which the
    processes on the new files never read (they would go on journaling its keys)."""
    with _driven_tier(server, disk_directory) as (cache, tier):  # this test drives the replay
        tier.node_failed(0)
        cache.set("key", "during")  # journaled
        nodes = os.path.join(disk_directory, "nodes")
        for name in os.listdir(nodes):
            os.unlink(os.path.join(nodes, name))
        os.mkdir(os.path.join(nodes, "distrust.state"))  # the new files cannot be made
        tier.replay_settle = 0.0
        assert tier.bring_back(0) is None
        assert tier.last_probe_error[0] == "the node states could not be followed"
        assert tier.states.is_out(0)
        os.rmdir(os.path.join(nodes, "distrust.state"))
        assert tier.bring_back(0) == 1  # moved (the transaction's check), then replayed
        assert not tier.states.replaced()
        assert node_states(cache) == ["up"]
    # Replayed (deleted from memcached); its disk entry was written before the move, so it
    # no longer answers: a miss, never the value from before the outage.
    assert cache.get("key") is None
