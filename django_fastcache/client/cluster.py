"""The process-wide view of a set of memcached nodes: addresses, routing and settings.

A :class:`Cluster` holds nothing tied to an event loop, a thread or a socket, so one
instance is shared by every thread and loop of the process; the async client and the
blocking client both route through it.

Nodes are numbered by *slot*: the position of their address in :attr:`Cluster.addresses`.
A fixed cluster's slots are its ``LOCATION`` order. With autodiscovery the node list
changes, and slots are never reused or renumbered: a node seen for the first time gets the
next slot, a node that leaves keeps its slot (it is just no longer routed to) and gets it
back if it returns. So a slot that a request was routed to stays valid whatever changes
meanwhile, and the request path needs no lock and no extra check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._mypyc import mypyc_attr
from ..errors import ConfigurationError, InvalidArgumentError
from .address import Address, parse_address
from .hashing import Placement
from .placement import PLACEMENTS, make_placement
from .security import Security

logger = logging.getLogger("django_fastcache")

#: Told the slots that joined (before keys are routed to them) or left (after).
SlotsListener = Callable[[tuple[int, ...]], None]

#: The settings by kind, for :func:`check_setting_types`.
_SECONDS = ("timeout", "connect_timeout", "idle_timeout", "autodiscovery_interval")
_COUNTS = ("min_connections", "max_connections", "max_value_size")


def check_setting_types(values: dict[str, object]) -> None:
    """Refuse a setting of the wrong type, naming it (:class:`InvalidArgumentError`).

    Without this a wrong type passed unseen (a string where a flag belongs is true, a
    float where a count belongs counts) or failed with a message naming neither the
    setting nor what it takes (compiled, a native class's bare ``TypeError``). ``bool``
    is not taken for a number. Values that are not settings' (``placement``,
    ``security``) are left to their own checks."""
    for name, value in values.items():
        if name in _SECONDS:
            if type(value) is bool or not isinstance(value, (int, float)):
                raise InvalidArgumentError(f"{name} must be a number of seconds, got {value!r}")
        elif name in _COUNTS:
            if type(value) is bool or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
        elif name != "placement" and name != "security" and not isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be a bool, got {value!r}")


#: The settings whose type __post_init__ checks (placement and security check themselves).
_CHECKED_SETTINGS = (
    "timeout",
    "connect_timeout",
    "min_connections",
    "max_connections",
    "idle_timeout",
    "max_value_size",
    "autodiscovery",
    "autodiscovery_interval",
    "meta",
)


# A Python class when compiled too: a native class checks its fields' types in its own
# __init__, before __post_init__ runs, and refuses a wrong one with a bare TypeError naming
# neither the setting nor what it takes (and turns a bool given for a count into an int),
# where check_setting_types names both. Settings are read when connections are made.
@mypyc_attr(native_class=False)
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
    #: How keys are placed on nodes: one of ``placement.PLACEMENTS``.
    placement: str = "rendezvous"
    #: The addresses given are configuration endpoints (``config get cluster``), not nodes.
    autodiscovery: bool = False
    #: Seconds between two refreshes of the node list.
    autodiscovery_interval: float = 60.0
    #: Whether meta commands may be sent. False for nodes, or a proxy in front of them,
    #: that do not speak meta (mcrouter, memcached before 1.6): each meta command then
    #: raises MetaUnsupportedError unsent, which callers with a classic way (the disk
    #: tier) take at once, where an ``ERROR`` would cost a round trip and the connection.
    meta: bool = True

    def __post_init__(self) -> None:
        # The values as given, read from the instance's dict: compiled, reading a field
        # checks its declared type first, and refuses a wrong one with a bare TypeError.
        given: dict[str, object] = vars(self)
        check_setting_types({name: given[name] for name in _CHECKED_SETTINGS})
        # (``not x > 0`` rather than ``x <= 0``: NaN is refused too.)
        if not self.timeout > 0 or not self.connect_timeout > 0:
            raise InvalidArgumentError("timeouts must be positive")
        if not 1 <= self.min_connections <= self.max_connections:
            raise InvalidArgumentError("need 1 <= min_connections <= max_connections")
        if not self.idle_timeout > 0 or not self.max_value_size > 0:
            raise InvalidArgumentError("idle_timeout and max_value_size must be positive")
        if self.placement not in PLACEMENTS:
            raise InvalidArgumentError(
                f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, "
                f"not {self.placement!r}"
            )
        if not self.autodiscovery_interval > 0:
            raise InvalidArgumentError("autodiscovery_interval must be positive")


class Cluster:
    """Nodes and the routing of keys over them."""

    def __init__(self, servers: Sequence[str | Address], settings: ClientSettings) -> None:
        if isinstance(servers, str):
            servers = [servers]
        if not servers:
            raise InvalidArgumentError("at least one server address is needed")
        given = tuple(s if isinstance(s, Address) else parse_address(s) for s in servers)
        self.settings = settings
        #: Whether the node list can change (autodiscovery).
        self.dynamic = settings.autodiscovery
        self._listeners: list[tuple[SlotsListener | None, SlotsListener | None]] = []
        self._update_lock = threading.Lock()
        self.discovery: Any = None
        if not self.dynamic:
            self.endpoints: tuple[Address, ...] = ()
            #: Every node's address, by slot.
            self.addresses: tuple[Address, ...] = given
            self.node_ids: tuple[str, ...] = tuple(a.node_id for a in given)
            #: The slots keys are routed to now, in the order the nodes were listed.
            self.live: tuple[int, ...] = tuple(range(len(given)))
            self._slots = {node_id: slot for slot, node_id in enumerate(self.node_ids)}
            self._hashing: Placement = make_placement(settings.placement, given)
            self._only = 0
            self.single_node = len(given) == 1
            return
        from .discovery import Discovery  # only clusters that discover need it

        self.endpoints = given
        self.addresses = ()
        self.node_ids = ()
        self.live = ()
        self._slots = {}
        # Until the first node list arrives, routing a key fetches it (see Discovery).
        self.discovery = Discovery(self)
        self._hashing = self.discovery.pending_placement()
        self._only = 0
        self.single_node = False

    def __len__(self) -> int:
        """The number of slots (every node ever known; see :attr:`live` for the current)."""
        return len(self.addresses)

    def node_index(self, key: bytes) -> int:
        return self._only if self.single_node else self._hashing.node_index(key)

    def group(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        """Keys by node slot, in their original order within each node."""
        if self.single_node:
            return {self._only: list(keys)}
        return self._hashing.group(keys)

    def live_nodes(self) -> tuple[int, ...]:
        """The slots of the nodes in use now (fetching the node list first if need be)."""
        if not self.live and self.discovery is not None:
            self.discovery.refresh_now()
        return self.live

    @property
    def placement(self) -> Placement:
        """The current router (for reports; requests go through :meth:`node_index`)."""
        return self._hashing

    # -- node list changes (autodiscovery) -------------------------------------------------
    def add_listener(
        self, added: SlotsListener | None = None, removed: SlotsListener | None = None
    ) -> None:
        """Have ``added(slots)`` called before keys are routed to new slots, and
        ``removed(slots)`` once no key is routed to slots any more."""
        self._listeners.append((added, removed))

    def update(self, servers: Sequence[Address], reason: str = "") -> bool:
        """Route keys over ``servers`` from now on; False when nothing changed."""
        if not servers:
            raise ConfigurationError("a node list must name at least one node")
        with self._update_lock:
            addresses = list(self.addresses)
            slots: list[int] = []
            for address in servers:
                slot = self._slots.get(address.node_id)
                if slot is None:
                    slot = len(addresses)
                    addresses.append(address)
                    self._slots[address.node_id] = slot
                if slot not in slots:
                    slots.append(slot)
            if tuple(slots) == self.live:
                return False
            before = set(self.live)
            added = tuple(slot for slot in slots if slot not in before)
            removed = tuple(slot for slot in self.live if slot not in set(slots))
            self.addresses = tuple(addresses)
            self.node_ids = tuple(a.node_id for a in addresses)
            for on_added, _on_removed in self._listeners:
                if on_added is not None and added:
                    on_added(added)
            hashing = make_placement(
                self.settings.placement, [addresses[slot] for slot in slots], slots
            )
            # Readers take no lock: every order of these writes routes by the old list or
            # by the new one, and both name valid slots.
            if len(slots) == 1:
                self._only = slots[0]
                self.single_node = True
                self._hashing = hashing
            else:
                self._hashing = hashing
                self.single_node = False
            self.live = tuple(slots)
            for _on_added, on_removed in self._listeners:
                if on_removed is not None and removed:
                    on_removed(removed)
        logger.info(
            "memcached node list changed%s: %s (added %s, removed %s)",
            f" ({reason})" if reason else "",
            ", ".join(addresses[slot].node_id for slot in slots),
            ", ".join(addresses[slot].node_id for slot in added) or "none",
            ", ".join(addresses[slot].node_id for slot in removed) or "none",
        )
        return True

    def reset_lock_after_fork(self) -> None:
        """In a forked child: the parent's refresher may have held the lock at the fork."""
        self._update_lock = threading.Lock()
