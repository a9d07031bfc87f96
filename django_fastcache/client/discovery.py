"""Autodiscovery: the node list read from a configuration endpoint and kept current.

With ``autodiscovery`` on, the addresses a :class:`~django_fastcache.client.cluster.Cluster`
is given are configuration endpoints (an ElastiCache configuration endpoint, a Memorystore
discovery endpoint), asked ``config get cluster``
(:mod:`django_fastcache.protocol.discovery`). Nothing is fetched when the cluster is built
(Django builds every cache at start-up, when the endpoint may be unreachable): the first
key routed fetches the node list, on the caller's thread, and starts a background thread
that fetches it again every ``autodiscovery_interval`` seconds. Each new list is applied to
the cluster, which re-routes keys and tells the clients to close their connections to
nodes that left. A refresh that fails is logged and the last good list kept.

The thread stops at :meth:`Discovery.close` (the async client's ``aclose()``) and starts
again on the next first use. A forked child starts its own thread if the parent had one
(the parent's thread does not exist in the child).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import (
    ConfigurationError,
    ConnectionLostError,
    FastCacheError,
    OperationTimeoutError,
)
from ..protocol.discovery import CONFIG_GET_CLUSTER, ClusterConfig, ClusterConfigParser
from . import forksafe
from .address import Address, parse_address
from .failures import connect_error
from .hashing import Placement
from .security import Security, tls_error

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["Discovery", "fetch_config"]

logger = logging.getLogger("django_fastcache")

#: Refreshes in a row that must find an older configuration version before it is taken.
OLDER_VERSION_REFRESHES = 3


def fetch_config(
    address: Address, connect_timeout: float, timeout: float, security: Security | None = None
) -> ClusterConfig:
    """Ask one endpoint ``config get cluster`` over a connection of its own, with TLS when
    ``security`` has it (an ElastiCache cluster with in-transit encryption wants it on the
    configuration endpoint too). Authentication is for nodes, not endpoints."""
    try:
        sock = address.open_blocking(connect_timeout)
    except TimeoutError:
        raise OperationTimeoutError(
            f"connecting to the configuration endpoint {address} took longer than "
            f"{connect_timeout}s"
        ) from None
    except OSError as exc:
        raise connect_error(address, exc) from exc
    if security is not None and security.uses_tls(address):
        sock = _wrap_tls(sock, address, security, connect_timeout)
    deadline = time.monotonic() + timeout
    parser = ClusterConfigParser()
    with sock:
        try:
            sock.settimeout(timeout)
            sock.sendall(CONFIG_GET_CLUSTER)
            while True:
                config = parser.next_config()
                if config is not None:
                    return config
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(65536)
                if not data:
                    raise ConnectionLostError(
                        f"the configuration endpoint {address} closed the connection"
                    )
                parser.feed(data)
        except TimeoutError:
            raise OperationTimeoutError(
                f"no cluster configuration from {address} within {timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectionLostError(f"connection to {address} lost: {exc}") from exc


def _wrap_tls(
    sock: socket.socket, address: Address, security: Security, connect_timeout: float
) -> socket.socket:
    assert security.context is not None
    hostname = security.hostname_for(address)
    try:
        sock.settimeout(connect_timeout)
        return security.context.wrap_socket(sock, server_hostname=hostname)
    except ssl.SSLError as exc:
        sock.close()
        raise tls_error(address, hostname, exc) from exc
    except TimeoutError:
        sock.close()
        raise OperationTimeoutError(
            f"the TLS handshake with {address} took longer than {connect_timeout}s"
        ) from None
    except OSError as exc:
        sock.close()
        raise ConnectionLostError(f"TLS handshake with {address}: {exc}") from exc


class _Pending(Placement):
    """The router of a cluster that has no node list yet: routing fetches it first."""

    __slots__ = ("_discovery",)

    def __init__(self, discovery: Discovery) -> None:
        self._discovery = discovery

    @property
    def node_ids(self) -> tuple[str, ...]:
        return ()

    def node_index(self, key: bytes) -> int:
        cluster = self._discovery.refresh_now()
        return cluster.node_index(key)

    def group(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        cluster = self._discovery.refresh_now()
        return cluster.group(keys)


class Discovery:
    """Keeps a dynamic cluster's node list current (see the module docs)."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        settings = cluster.settings
        self.interval = settings.autodiscovery_interval
        self._connect_timeout = settings.connect_timeout
        self._timeout = settings.timeout
        self._security = settings.security
        self._lock = threading.Lock()  # one fetch at a time
        self._thread_lock = threading.Lock()  # one start or stop at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The configuration version last applied, and the last refresh's error.
        self.version: int | None = None
        self.last_error: str | None = None
        #: Refreshes done, and those that failed.
        self.refreshes = 0
        self.failures = 0
        self._older_seen = 0  # refreshes in a row that found an older version
        forksafe.register(self)

    def pending_placement(self) -> Placement:
        return _Pending(self)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    # -- fetching ------------------------------------------------------------------------
    def fetch(self) -> ClusterConfig:
        """The configuration from the first endpoint that answers; else the last error."""
        error: FastCacheError | None = None
        for endpoint in self._cluster.endpoints:
            try:
                return fetch_config(endpoint, self._connect_timeout, self._timeout, self._security)
            except FastCacheError as exc:
                error = exc
        assert error is not None
        raise error

    def _apply(self, config: ClusterConfig) -> bool:
        if self.version is not None and config.version < self.version:
            # An endpoint that has not caught up yet (the services' copies of the
            # configuration are eventually consistent): keep the newer list, unless the
            # older version persists (the cluster was made anew and counts from 1 again).
            self._older_seen += 1
            if self._older_seen < OLDER_VERSION_REFRESHES:
                logger.warning(
                    "autodiscovery: configuration version %d is older than the one in use "
                    "(%d); keeping the node list of %d",
                    config.version,
                    self.version,
                    self.version,
                )
                return False
        self._older_seen = 0
        try:
            addresses = [parse_address(node.address) for node in config.nodes]
        except ConfigurationError as exc:
            raise ConfigurationError(f"the cluster configuration names a bad node: {exc}") from exc
        changed = self._cluster.update(addresses, reason=f"configuration version {config.version}")
        self.version = config.version
        return changed

    def refresh_now(self) -> Cluster:
        """The first node list, fetched now on the caller's thread unless there is one;
        raises what the fetch raised when there is none to use."""
        cluster = self._cluster
        if not cluster.live:
            with self._lock:
                if not cluster.live:
                    self._apply(self.fetch())
        self.start()
        return cluster

    def refresh(self) -> bool:
        """One background refresh: True when the node list changed. A failure is logged,
        counted and kept in :attr:`last_error`; the last good list stays in use."""
        with self._lock:
            self.refreshes += 1
            try:
                changed = self._apply(self.fetch())
            except FastCacheError as exc:
                self.failures += 1
                self.last_error = str(exc)
                cluster = self._cluster
                logger.warning(
                    "autodiscovery: refreshing the memcached node list failed, keeping the "
                    "last one (%s): %s",
                    ", ".join(cluster.node_ids[slot] for slot in cluster.live) or "none yet",
                    exc,
                )
                return False
            self.last_error = None
            return changed

    # -- the background thread -----------------------------------------------------------
    def start(self) -> None:
        """Start the refresher thread unless it runs."""
        if self.running:
            return
        with self._thread_lock:
            if self.running:
                return
            self._stop = threading.Event()
            thread = threading.Thread(
                target=self._run, args=(self._stop,), name="fastcache-autodiscovery", daemon=True
            )
            self._thread = thread
            thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.refresh()

    def close(self) -> None:
        """Stop the refresher thread (routing keeps the last node list)."""
        with self._thread_lock:
            self._stop.set()
            thread = self._thread
            self._thread = None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _forget_after_fork(self) -> object:
        # The parent's thread does not exist here, and it may have held the locks.
        was_running = self._thread is not None
        self._thread = None
        self._lock = threading.Lock()
        self._thread_lock = threading.Lock()
        self._stop = threading.Event()
        self._cluster.reset_lock_after_fork()
        if was_running:
            self.start()
        return None
