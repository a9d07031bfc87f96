"""The maintenance thread lets go of a store once ``unregister`` returns."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

from django_fastcache import maintenance as maintenance_module
from django_fastcache.handles import Handle
from django_fastcache.maintenance import Maintenance


class _Disk:
    """A disk tier that opens nothing (the round opens a store's shards once)."""

    def __init__(self) -> None:
        self.opened_ahead = 0

    def open_ahead(self) -> None:
        self.opened_ahead += 1


class _Store:
    """A store as the round sees it here (its checks are replaced below)."""

    maintained: object | None = None

    def __init__(self) -> None:
        self.disk = _Disk()


def test_unregister_waits_for_the_round_that_holds_the_store(monkeypatch: Any) -> None:
    in_round, release, returned = threading.Event(), threading.Event(), threading.Event()

    def check_files(store: Any) -> None:
        in_round.set()
        release.wait(10)

    monkeypatch.setattr(maintenance_module, "check_files", check_files)
    monkeypatch.setattr(Maintenance, "_probe_out_nodes", lambda self, store: False)
    thread = Maintenance()
    store: Any = _Store()
    handle = Handle(store)
    store.maintained = handle
    with thread._lock:
        thread._stores.add(handle)
    thread.ensure_running()
    assert in_round.wait(10)  # the round is checking the store's files

    def unregister() -> None:
        thread.unregister(store)
        returned.set()

    unregistering = threading.Thread(target=unregister)
    unregistering.start()
    assert not returned.wait(0.2)  # the round still holds the store
    release.set()
    assert returned.wait(10)
    unregistering.join(10)
    assert handle not in thread._stores
    assert store.maintained is None


class _OutStore:
    """A store of one node that is out, whose probes fail (what the round reads of it)."""

    maintained: object | None = None

    def __init__(self) -> None:
        self.disk = _Disk()
        self.cluster = [0]
        self.states = self
        self.directory = "/nowhere"
        self.last_probe_error: dict[int, str] = {}
        self.on_node_back = None
        self.probes = 0

    def is_out(self, node: int) -> bool:
        return True

    def bring_back(self, node: int) -> int | None:
        self.probes += 1
        return None  # still out


def test_a_store_no_longer_registered_leaves_no_backoff_behind(monkeypatch: Any) -> None:
    """The probe's backoff is kept per registration: once a store is unregistered, the
    next round forgets it, and a store registered later starts afresh."""
    monkeypatch.setattr(maintenance_module, "check_files", lambda store: None)
    thread = Maintenance()
    old: Any = _OutStore()
    old_handle = Handle(old)
    thread._stores.add(old_handle)
    assert thread._round_over_stores(float("inf"))[0]  # a node is out
    assert old.probes == 1
    assert list(thread._next_probe) == [old_handle]
    assert thread._next_probe[old_handle][0][1] > maintenance_module.MIN_BACKOFF
    assert list(thread._out_since) == [old_handle]
    thread._stores.discard(old_handle)  # what unregister does
    new: Any = _OutStore()
    new_handle = Handle(new)
    thread._stores.add(new_handle)
    thread._round_over_stores(float("inf"))
    assert new.probes == 1  # probed at once: no backoff inherited
    assert list(thread._next_probe) == [new_handle]
    assert list(thread._out_since) == [new_handle]


def test_a_store_dropped_while_its_node_is_out_is_collected(monkeypatch: Any) -> None:
    """The bookkeeping of a node out does not keep its store alive: a cache dropped without
    close() while memcached is down goes, and the thread stops probing for it."""
    monkeypatch.setattr(maintenance_module, "check_files", lambda store: None)
    thread = Maintenance()
    store: Any = _OutStore()
    store.maintained = Handle(store)  # the store holds its registration's handle
    thread._stores.add(store.maintained)
    assert thread._round_over_stores(float("inf"))[0]
    assert len(thread._next_probe) == 1
    gone = weakref.ref(store)
    del store
    gc.collect()
    assert gone() is None
    assert not thread._round_over_stores(float("inf"))[0]  # nothing left to probe
    assert len(thread._next_probe) == 0
    assert len(thread._out_since) == 0
