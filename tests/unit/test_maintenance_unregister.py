"""The maintenance thread lets go of a store once ``unregister`` returns."""

from __future__ import annotations

import threading
from typing import Any

from django_fastcache import maintenance as maintenance_module
from django_fastcache.handles import Handle
from django_fastcache.maintenance import Maintenance


class _Store:
    """A store as the round sees it here (its checks are replaced below)."""

    maintained: object | None = None


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
