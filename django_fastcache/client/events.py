"""Node health as the clients see it, and the events sent when it changes.

A node turns *unhealthy* when a request to it fails for a reason that is the node's (it
refuses or drops connections, or does not answer in time) and *healthy* again when a
request to it gets a reply. The clients send no probes of their own: health follows the
outcome of the requests callers make. A connect that succeeds is not evidence enough (a
hung server's kernel still accepts connections); a reply is.

Health is process-wide, shared by the asyncio and the blocking client of one cluster.
Subscribers are called on the thread (and event loop) whose request saw the change,
after the change is recorded; an exception in a subscriber is logged, never raised into
the request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import LocalResourceError, NetworkError
from ..logs import RateLimit, logger
from . import forksafe

log = logger.getChild("client")


@dataclass(frozen=True)
class NodeEvent:
    """A node changed health. ``error`` is what made it unhealthy (None when healthy)."""

    node: str
    healthy: bool
    error: BaseException | None
    at: float  # time.time()


NodeEventCallback = Callable[[NodeEvent], object]


def is_node_failure(error: BaseException) -> bool:
    """Whether ``error`` says something about the node (not about this process)."""
    return isinstance(error, NetworkError) and not isinstance(error, LocalResourceError)


class NodeHealth:
    """Per node: healthy or not, and who to tell when that changes. Thread-safe.

    ``unhealthy`` is read without the lock on the request path (one attribute and a
    truth test); transitions take the lock and re-check."""

    def __init__(self) -> None:
        #: Ids of the nodes that are unhealthy now (empty nearly always).
        self.unhealthy: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._callbacks: list[NodeEventCallback] = []
        self._subscriber_errors = RateLimit()
        forksafe.register(self)

    def _forget_after_fork(self) -> object:
        # A lock another thread of the parent held at the fork would never be released.
        self._lock = threading.Lock()
        return None

    def healthy(self, node: str) -> bool:
        return node not in self.unhealthy

    def subscribe(self, callback: NodeEventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` on every change; returns a function that unsubscribes."""
        with self._lock:
            self._callbacks = [*self._callbacks, callback]

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks = [c for c in self._callbacks if c is not callback]

        return unsubscribe

    def failed(self, node: str, error: BaseException) -> None:
        """A request to ``node`` failed with ``error``: unhealthy if the error is the node's."""
        if node in self.unhealthy or not is_node_failure(error):
            return
        with self._lock:
            if node in self.unhealthy:
                return
            self.unhealthy = self.unhealthy | {node}
            callbacks = self._callbacks
        log.warning("memcached node %s is unhealthy: %s: %s", node, type(error).__name__, error)
        self._send(callbacks, NodeEvent(node, False, error, time.time()))

    def answered(self, node: str) -> None:
        """A request to ``node`` got a reply: healthy again if it was not."""
        if node not in self.unhealthy:
            return
        with self._lock:
            if node not in self.unhealthy:
                return
            self.unhealthy = self.unhealthy - {node}
            callbacks = self._callbacks
        log.info("memcached node %s is healthy again", node)
        self._send(callbacks, NodeEvent(node, True, None, time.time()))

    def _send(self, callbacks: list[NodeEventCallback], event: NodeEvent) -> None:
        for callback in callbacks:
            try:
                callback(event)
            except Exception:
                if self._subscriber_errors.allow(callback):
                    log.exception("a node event subscriber failed on %s", event)


__all__ = ["NodeEvent", "NodeEventCallback", "NodeHealth", "is_node_failure"]
