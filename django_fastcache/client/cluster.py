"""The process-wide view of a set of memcached nodes: addresses, routing and settings.

A :class:`Cluster` holds nothing tied to an event loop, a thread or a socket, so one
instance is shared by every thread and loop of the process; the async client and the
blocking client both route through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from .address import Address, parse_address
from .hashing import Rendezvous
from .security import Security


@dataclass(frozen=True)
class ClientSettings:
    #: Seconds one operation may take, waiting for a connection included.
    timeout: float = 1.0
    #: Seconds to open a connection.
    connect_timeout: float = 1.0
    #: Connections per node and event loop kept open when idle (async client).
    min_connections: int = 1
    #: Connections per node and event loop at most (async client).
    max_connections: int = 4
    #: Seconds an idle connection beyond ``min_connections`` is kept.
    idle_timeout: float = 60.0
    #: Largest value a reply may declare; larger is a protocol error.
    max_value_size: int = 1024 * 1024
    #: TLS and authentication for new connections (see :mod:`.security`); None: neither.
    security: Security | None = None

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise InvalidArgumentError("timeouts must be positive")
        if not 1 <= self.min_connections <= self.max_connections:
            raise InvalidArgumentError("need 1 <= min_connections <= max_connections")
        if self.idle_timeout <= 0 or self.max_value_size <= 0:
            raise InvalidArgumentError("idle_timeout and max_value_size must be positive")


class Cluster:
    """Nodes and the rendezvous routing of keys over them."""

    def __init__(self, servers: Sequence[str | Address], settings: ClientSettings) -> None:
        if isinstance(servers, str):
            servers = [servers]
        if not servers:
            raise InvalidArgumentError("at least one server address is needed")
        self.addresses: tuple[Address, ...] = tuple(
            s if isinstance(s, Address) else parse_address(s) for s in servers
        )
        self.settings = settings
        self.node_ids: tuple[str, ...] = tuple(a.node_id for a in self.addresses)
        self._hashing = Rendezvous(self.node_ids)
        self.single_node = len(self.addresses) == 1

    def __len__(self) -> int:
        return len(self.addresses)

    def node_index(self, key: bytes) -> int:
        return 0 if self.single_node else self._hashing.node_index(key)

    def group(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        """Keys by node index, in their original order within each node."""
        if self.single_node:
            return {0: list(keys)}
        return self._hashing.group(keys)
