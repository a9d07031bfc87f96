"""The asyncio memcached client: connection → pool → cluster routing → public API."""

from .address import Address, parse_address
from .client import Client

__all__ = ["Address", "Client", "parse_address"]
