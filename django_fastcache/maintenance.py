"""The process's maintenance thread: probes nodes that are out, and culls the disk tier.

No probe or cull ever runs on a request. The check that the tier's files are still the
directory's (:func:`check_files`) runs in the thread's rounds and, between them, in the
store's own calls (:meth:`TieredStore._follow_files`, at most every 0.1 s), which then move
their process to the directory's files when they were replaced. While any node is out
(as the host-wide node state says, whichever process marked it), the thread probes it
with ``version`` on backoff (0.05 s, doubling, at most ``MAX_BACKOFF``); a node that
answers has its journal replayed as deletes and is marked up
(:meth:`TieredStore.bring_back`). Every ``CULL_INTERVAL`` seconds the disk tiers drop
expired entries and evict down to their size limit, and the write stamps anchors are
touched (an age-based temp cleaner then leaves them alone). The thread's first round over a
store opens its disk shards (:meth:`DiskStore.open_ahead`), which the process's first read
from disk would otherwise do in a request.

The thread is a daemon started on first need, and started again in a forked child.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref

from . import logs
from .disk import DiskError
from .handles import Handle
from .logs import logger
from .tiered import TieredStore

MIN_BACKOFF = 0.05
MAX_BACKOFF = 2.0
CULL_INTERVAL = 60.0
#: Seconds between two rounds while every node is up. Each round checks that the tier's
#: files are still the directory's (a few ``stat`` calls), for a process that makes no
#: calls: the calls check for themselves every ``tiered.FILES_CHECK_INTERVAL``. A wake-up
#: costs a busy process more than the check (the thread takes the GIL from its requests),
#: so the thread wakes seldom.
IDLE_TICK = 1.0
#: Per registered store (its registration's handle, weakly), by node: two times.
_Book = weakref.WeakKeyDictionary[Handle[TieredStore], dict[int, tuple[float, float]]]
#: Held through a move to the directory's files: the calls of any thread, the maintenance
#: thread and the journal's transactions all check the files, and two moves at once would
#: each map new pages, one set lost with what was carried over to it.
_moving = threading.Lock()


class Maintenance:
    def __init__(self) -> None:
        self._stores: weakref.WeakSet[Handle[TieredStore]] = weakref.WeakSet()
        self._lock = threading.Lock()
        # Held by the thread through each round over the stores, so that unregister()
        # returns only once the round in progress is done with the store.
        self._round = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # Per store, by node: when to probe next, and the current backoff. Keyed weakly by
        # the store's handle: a store dropped while a node is out is not kept alive by its
        # bookkeeping, and a store made later at its address does not inherit it.
        self._next_probe: _Book = weakref.WeakKeyDictionary()
        # Per store, by node out: since when (monotonic), and when it was last warned about.
        self._out_since: _Book = weakref.WeakKeyDictionary()

    def register(self, store: TieredStore) -> None:
        """Probe and cull ``store`` from now on. (A store is registered with one thread:
        the process's; it holds the handle of that registration only.)"""
        self._after_fork_check()
        # A journal file replaced under the process is carried over, and the nodes it
        # names marked out again, in the host-wide states.
        store.journal.node_ids = tuple(store.cluster.node_ids)
        store.journal.mark_out = lambda node_id: store.states.mark_out_by_id(node_id)
        store.journal.must_flush = lambda node_id: store.states.must_flush_by_id(node_id)
        store.journal.journaled_in = lambda node_id, journal_id, carried_from: (
            store.states.journaled_in_by_id(node_id, journal_id, carried_from)
        )
        # And a journaled write or a replay reads the directory's node states, not files
        # removed under the process: a replay marking up a removed file, or a write
        # journaled by a process still reading one, would split the host in two.
        store.journal.on_transaction = lambda: follow_state_files(store)
        # And the store's own calls check its files, between the thread's rounds.
        store.check_files = check_files
        # Weakly: through a handle the store holds (a compiled store has no weak reference).
        handle = Handle(store)
        store.maintained = handle
        with self._lock:
            self._stores.add(handle)
        self.ensure_running()

    def unregister(self, store: TieredStore) -> None:
        """Stop probing and culling ``store`` (it is being closed): once this returns, the
        thread does nothing more with it."""
        self._after_fork_check()  # a child's lock may have been taken mid-round by the parent
        store.check_files = None
        with self._lock:
            handle, store.maintained = store.maintained, None
            if handle is not None:
                self._stores.discard(handle)
        if threading.current_thread() is not self._thread:
            with self._round:
                pass  # the round in progress, which may hold the store, is over

    def node_went_out(self) -> None:
        """A request marked a node out: probe soon (the thread may be idling)."""
        self.ensure_running()
        self._wake.set()

    def _after_fork_check(self) -> None:
        if self._pid != os.getpid():  # a forked child inherits no threads
            self._pid = os.getpid()
            self._thread = None
            self._lock = threading.Lock()
            self._round = threading.Lock()
            self._wake = threading.Event()
            self._next_probe.clear()
            self._out_since.clear()

    def ensure_running(self) -> None:
        self._after_fork_check()
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="fastcache-maintenance", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        next_cull = time.monotonic() + CULL_INTERVAL
        while True:
            with self._round:
                anything_out, next_cull = self._round_over_stores(next_cull)
            self._wake.wait(MIN_BACKOFF if anything_out else IDLE_TICK)
            self._wake.clear()

    def _round_over_stores(self, next_cull: float) -> tuple[bool, float]:
        """One round: every store's files checked and nodes out probed, and the culls
        when due. Whether a node is out, and when the next cull is due."""
        with self._lock:
            handles = list(self._stores)
        self._forget_gone(handles)
        stores = [handle.target for handle in handles]
        anything_out = False
        for handle in handles:
            store = handle.target
            try:
                check_files(store)
                anything_out |= self._probe_out_nodes(handle)
                store.disk.open_ahead()  # (the first round's: no request opens the shards)
            except Exception:
                # Whatever went wrong with one store, the thread must go on: it is the
                # only thing that ever brings a node back, for every store.
                anything_out = True
        now = time.monotonic()
        if now >= next_cull:
            for store in stores:
                store.stamps.touch()
                try:
                    store.disk.cull()
                except DiskError as exc:
                    store._disk_failed(None, exc)
            next_cull = now + CULL_INTERVAL
        return anything_out, next_cull

    def _forget_gone(self, handles: list[Handle[TieredStore]]) -> None:
        """Drop the probe bookkeeping of stores no longer registered (closed, or
        collected)."""
        live = set(handles)
        for book in (self._next_probe, self._out_since):
            for handle in [handle for handle in list(book) if handle not in live]:
                book.pop(handle, None)

    def _probe_out_nodes(self, handle: Handle[TieredStore]) -> bool:
        store = handle.target
        next_probe = self._next_probe.setdefault(handle, {})
        out_since = self._out_since.setdefault(handle, {})
        anything_out = False
        for node in range(len(store.cluster)):
            if not store.states.is_out(node):
                next_probe.pop(node, None)
                out_since.pop(node, None)
                continue
            anything_out = True
            now = time.monotonic()
            self._warn_while_out(store, node, out_since, now)
            due, backoff = next_probe.get(node, (now, MIN_BACKOFF))
            if now < due:
                continue
            replayed = store.bring_back(node)
            if replayed is None:
                backoff = min(backoff * 2, MAX_BACKOFF)
                next_probe[node] = (time.monotonic() + backoff, backoff)
                continue
            next_probe.pop(node, None)
            out_since.pop(node, None)
            if store.on_node_back is not None:
                with contextlib.suppress(Exception):  # a receiver's error must not stop probing
                    store.on_node_back(store.cluster.node_ids[node], replayed)
        return anything_out

    def _warn_while_out(
        self, store: TieredStore, node: int, out_since: dict[int, tuple[float, float]], now: float
    ) -> None:
        """Say again, every ``logs.REPEAT_INTERVAL`` seconds, that a node is still out (the
        first warning came when it went out, from whichever process marked it)."""
        since, warned = out_since.setdefault(node, (now, now))
        if now - warned < logs.REPEAT_INTERVAL:
            return
        out_since[node] = (since, now)
        logger.warning(
            "memcached node %s is still out (for %.0f s seen from this process); its keys are "
            "served by the disk tier at %s; latest probe: %s",
            store.cluster.node_ids[node],
            now - since,
            store.directory,
            store.last_probe_error.get(node, "not probed yet"),
        )


def check_files(store: TieredStore) -> None:
    """Find the tier's files removed or replaced under this process (its directory deleted,
    perhaps made again by a process started since; a temp cleaner removing files written
    only during outages) and switch to the directory's files, carrying over what this
    process knew: nodes out, journaled keys. Disk entries written before the switch stop
    answering, host-wide: each side wrote to files the other never read."""
    follow_state_files(store)
    try:
        if store.journal.replaced():  # a stat; the lock only when it was
            store.journal.carry_over_if_replaced()
    except DiskError as exc:
        store._disk_failed(None, exc)


def follow_state_files(store: TieredStore) -> None:
    """The state files part of :func:`check_files` (also run by every journal
    transaction, and by the store's calls)."""
    states = store.states
    if states.replaced() or store.stamps.replaced():  # a stat each: the lock only when moving
        with _moving:
            _follow_state_files(store)


def _follow_state_files(store: TieredStore) -> None:
    states = store.states
    if states.replaced():  # (again, under the lock: another thread may have moved first)
        try:
            states.reopen(time.time())
        except OSError as exc:
            # The old pages stay (never pages of this process's own: it would miss the
            # others' outages); the next check tries again. Meanwhile its disk reads miss
            # (replaced() is true) and it replays no journal (see bring_back).
            if store._warnings.allow("states-reopen"):
                logger.warning(
                    "the disk tier's files at %s were removed or replaced under this "
                    "process, and the new ones cannot be mapped (%s); until they can, it "
                    "reads nothing from disk and replays no journal, and it tries again",
                    store.directory,
                    exc,
                )
        else:
            store._warnings.forget("states-reopen")
            store.disk.close()  # the values too: opened again, by path, on next use
            store.stamps.reopen()  # and the write stamps: the directory's processes read those
            logger.warning(
                "the disk tier's files at %s were removed or replaced under this process; it "
                "now uses the directory's files, and disk entries written before no longer "
                "answer (nothing but this process may remove or replace the directory)",
                store.directory,
            )
    stamps = store.stamps
    # The anchor alone (a temp cleaner): the others stamp its table. (A move that fails
    # warns by itself; the check then finds the anchor replaced again, and tries again.)
    if stamps.replaced() and stamps.reopen():
        logger.warning(
            "the disk tier's write stamps anchor %s was removed or replaced under this "
            "process; it now stamps the table the directory's anchor names, and disk entries "
            "written before that table was made no longer answer (keep temp cleaners out of "
            "the directory)",
            stamps.path,
        )


#: The one maintenance thread of the process.
maintenance = Maintenance()


def _after_fork_in_child() -> None:
    # A move in another thread of the parent at the fork would hold the lock for ever here.
    global _moving
    _moving = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
