"""The local disk tier: values, the outage journal and the host-wide node states."""

from .journal import Journal
from .nodestate import NodeStates
from .store import DiskEntry, DiskError, DiskStore

__all__ = ["DiskEntry", "DiskError", "DiskStore", "Journal", "NodeStates"]
