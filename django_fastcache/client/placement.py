"""Placement modes: which node owns a key, ours or another client's way.

``"rendezvous"`` (the default, :class:`~django_fastcache.client.hashing.Rendezvous`) is
FastCache's own. The others put every key where another client puts it, so that a site
moving to FastCache finds the keys that client wrote (a warm cache on the first request):

``"ketama"``
    libmemcached's consistent hashing as pylibmc configures it with the behaviour
    ``{"ketama": True}`` (and ``{"distribution": "consistent"}``): 100 points per server,
    each the one-at-a-time hash of ``"host-N"`` (``"host:port-N"`` when the port is not
    11211), N = 0..99; a key goes to the first point at or after the one-at-a-time hash of
    the key, wrapping round.
``"ketama_md5"``
    The same with ``{"ketama": True, "hash": "md5"}``: MD5 (its first four bytes, little
    endian) for points and keys alike.
``"ketama_weighted"``
    pylibmc's ``{"ketama_weighted": True}`` (libmemcached's weighted distribution, all
    weights 1): MD5 keys, and 160 points per server (for equal weights; libmemcached
    computes the count in single-precision floats, reproduced here) taken four from each
    MD5 digest of ``"host-N"``, N = 0..39.
``"emcache"``
    emcache's rendezvous hashing: per node the MurmurHash3 (x64, 128-bit, seed 0) of the key
    followed by the node's id (``host`` and ``port`` written together without a separator,
    or the socket path), cut to 32 bits the way emcache's Cython code does: its bytes are
    sign-extended, which leaves 640 distinct scores. Ties go to the node whose own id hashes
    higher, then to the one listed first.

Servers are named as libmemcached and emcache name them: the host as written in
``LOCATION`` (lower-cased, IPv6 without brackets) and the port; a unix socket by its path
(port 0 for libmemcached). Node order matters only for exact ties, and it is the
``LOCATION`` order, as in both clients.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigurationError
from .address import DEFAULT_PORT, Address, parse_address
from .hashing import Placement, Rendezvous, check_node_ids

__all__ = [
    "PLACEMENTS",
    "EmcacheRendezvous",
    "Ketama",
    "Movement",
    "make_placement",
    "movement",
    "murmur3_x64_128",
    "one_at_a_time",
]

#: Every value of the ``placement`` option.
PLACEMENTS = ("rendezvous", "ketama", "ketama_md5", "ketama_weighted", "emcache")

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
# libmemcached's MEMCACHED_POINTS_PER_SERVER and MEMCACHED_POINTS_PER_SERVER_KETAMA.
_POINTS_PER_SERVER = 100
_POINTS_PER_SERVER_WEIGHTED = 160
_FLOAT32 = struct.Struct("<f")


def one_at_a_time(data: bytes) -> int:
    """libhashkit's one-at-a-time hash (its default), bytes read as C's signed ``char``."""
    value = 0
    for byte in data:
        # (uint32_t) of a signed char: bytes from 0x80 up are sign-extended.
        value = (value + (byte | 0xFFFFFF00 if byte & 0x80 else byte)) & _MASK32
        value = (value + (value << 10)) & _MASK32
        value ^= value >> 6
    value = (value + (value << 3)) & _MASK32
    value ^= value >> 11
    return (value + (value << 15)) & _MASK32


def md5_hash(data: bytes) -> int:
    """libhashkit's MD5 hash: the digest's first four bytes, little endian."""
    return int.from_bytes(hashlib.md5(data).digest()[:4], "little")


def _rotl64(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (64 - shift))) & _MASK64


def _fmix64(value: int) -> int:
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & _MASK64
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & _MASK64
    return value ^ (value >> 33)


_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def murmur3_x64_128(data: bytes, seed: int = 0) -> bytes:
    """MurmurHash3_x64_128 of ``data``: its 16 output bytes, as the reference C writes them."""
    length = len(data)
    h1 = h2 = seed & _MASK64
    whole = length - length % 16
    for offset in range(0, whole, 16):
        k1 = int.from_bytes(data[offset : offset + 8], "little")
        k2 = int.from_bytes(data[offset + 8 : offset + 16], "little")
        k1 = (_rotl64((k1 * _C1) & _MASK64, 31) * _C2) & _MASK64
        h1 ^= k1
        h1 = (((_rotl64(h1, 27) + h2) & _MASK64) * 5 + 0x52DCE729) & _MASK64
        k2 = (_rotl64((k2 * _C2) & _MASK64, 33) * _C1) & _MASK64
        h2 ^= k2
        h2 = (((_rotl64(h2, 31) + h1) & _MASK64) * 5 + 0x38495AB5) & _MASK64
    tail = data[whole:]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl64((k2 * _C2) & _MASK64, 33) * _C1) & _MASK64
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl64((k1 * _C1) & _MASK64, 31) * _C2) & _MASK64
    h1 ^= length
    h2 ^= length
    h1 = (h1 + h2) & _MASK64
    h2 = (h2 + h1) & _MASK64
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 = (h1 + h2) & _MASK64
    h2 = (h2 + h1) & _MASK64
    return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")


def emcache_score(data: bytes) -> int:
    """emcache's 32-bit score of ``data``, quirks included.

    Its Cython code reads the digest's bytes as signed ``char`` and masks each with a
    shifted 0xFFFFFFFF, so a negative byte sets every bit above its own too."""
    out = murmur3_x64_128(data)
    result = 0
    for position in range(4):
        byte = out[position]
        extended = byte | 0xFFFFFF00 if byte & 0x80 else byte
        result |= extended & ((_MASK32 << (8 * position)) & _MASK32)
    return result


def _server_name(address: Address) -> tuple[str, int]:
    """libmemcached's ``_hostname`` and port for a server."""
    if address.path is not None:
        return address.path, 0
    assert address.host is not None
    assert address.port is not None
    return address.host, address.port


def _float32(value: float) -> float:
    return float(_FLOAT32.unpack(_FLOAT32.pack(value))[0])


def _weighted_points(servers: int) -> int:
    """Points per server of libmemcached's weighted ketama, all weights 1: its float
    arithmetic (``floor(pct * 160 / 4 * live_servers + 1e-10) * 4``) step by step."""
    pct = _float32(_float32(1.0) / _float32(float(servers)))
    share = _float32(_float32(pct * 160.0) / 4.0)
    spread = _float32(share * _float32(float(servers)))
    return int(_float32(spread + 0.0000000001) // 1) * 4


class Ketama(Placement):
    """libmemcached's ketama continuum (see the module docs for the three variants)."""

    __slots__ = ("_ids", "_key_hash", "_owners", "_points", "_variant")

    def __init__(
        self,
        addresses: Sequence[Address],
        variant: str = "ketama",
        slots: Sequence[int] | None = None,
    ) -> None:
        if variant not in ("ketama", "ketama_md5", "ketama_weighted"):
            raise ConfigurationError(f"unknown ketama variant {variant!r}")
        self._ids = check_node_ids([a.node_id for a in addresses], slots)
        self._variant = variant
        self._key_hash = one_at_a_time if variant == "ketama" else md5_hash
        answers = list(range(len(addresses))) if slots is None else list(slots)
        points: list[tuple[int, int, int]] = []  # (value, server index, answer)
        weighted = variant == "ketama_weighted"
        per_server = _weighted_points(len(addresses)) if weighted else _POINTS_PER_SERVER
        for index, address in enumerate(addresses):
            host, port = _server_name(address)
            prefix = host if port == DEFAULT_PORT else f"{host}:{port}"
            if weighted:
                for number in range(per_server // 4):
                    digest = hashlib.md5(f"{prefix}-{number}".encode()).digest()
                    for quarter in range(4):
                        value = int.from_bytes(digest[4 * quarter : 4 * quarter + 4], "little")
                        points.append((value, index, answers[index]))
            else:
                for number in range(per_server):
                    value = self._key_hash(f"{prefix}-{number}".encode())
                    points.append((value, index, answers[index]))
        # libmemcached sorts by value, then by server index; a key takes the first point
        # whose value is at least the key's hash.
        points.sort()
        self._points = [value for value, _index, _answer in points]
        self._owners = [answer for _value, _index, answer in points]

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._ids

    def node_index(self, key: bytes) -> int:
        owners = self._owners
        if len(self._ids) == 1:
            return owners[0]  # libmemcached does not hash at all for one server
        position = bisect.bisect_left(self._points, self._key_hash(key))
        return owners[position if position < len(owners) else 0]

    def __repr__(self) -> str:
        return f"Ketama({list(self._ids)!r}, variant={self._variant!r})"


class EmcacheRendezvous(Placement):
    """emcache's rendezvous hashing, bit for bit (see the module docs)."""

    __slots__ = ("_answers", "_ids", "_nodes")

    def __init__(self, addresses: Sequence[Address], slots: Sequence[int] | None = None) -> None:
        self._ids = check_node_ids([a.node_id for a in addresses], slots)
        self._answers = tuple(range(len(addresses))) if slots is None else tuple(slots)
        nodes = []
        for address in addresses:
            if address.path is not None:
                rendezvous_id = address.path.encode()
            else:
                # No separator between host and port: emcache's own naming.
                rendezvous_id = f"{address.host}{address.port}".encode()
            nodes.append((rendezvous_id, emcache_score(rendezvous_id)))
        self._nodes = tuple(nodes)

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._ids

    def node_index(self, key: bytes) -> int:
        nodes = self._nodes
        if len(nodes) == 1:
            return self._answers[0]
        best = 0
        best_score = emcache_score(key + nodes[0][0])
        for position in range(1, len(nodes)):
            rendezvous_id, node_hash = nodes[position]
            node_score = emcache_score(key + rendezvous_id)
            if node_score > best_score or (node_score == best_score and node_hash > nodes[best][1]):
                best = position
                best_score = node_score
        return self._answers[best]

    def __repr__(self) -> str:
        return f"EmcacheRendezvous({list(self._ids)!r})"


def make_placement(
    mode: str, addresses: Sequence[Address], slots: Sequence[int] | None = None
) -> Placement:
    """The router for ``mode`` (one of :data:`PLACEMENTS`) over ``addresses``."""
    if mode == "rendezvous":
        return Rendezvous([a.node_id for a in addresses], slots)
    if mode in ("ketama", "ketama_md5", "ketama_weighted"):
        return Ketama(addresses, mode, slots)
    if mode == "emcache":
        return EmcacheRendezvous(addresses, slots)
    raise ConfigurationError(
        f"unknown placement {mode!r}; use one of {', '.join(map(repr, PLACEMENTS))}"
    )


@dataclass(frozen=True)
class Movement:
    """What a change of the node list does to the keys of a sample."""

    #: Keys looked at, and how many of them change node.
    keys: int
    moved: int
    #: Moved keys by the node they leave, and by the node they go to (node ids).
    moved_from: dict[str, int] = field(default_factory=dict)
    moved_to: dict[str, int] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        """The share of the sample that moves: with the default sample, an estimate of the
        share of the whole key space (and of the cache that goes cold)."""
        return self.moved / self.keys if self.keys else 0.0


#: Keys of the default sample: spread like real ones, and the same on every run.
DEFAULT_SAMPLE = 20_000


def movement(
    before: Sequence[str | Address],
    after: Sequence[str | Address],
    placement: str = "rendezvous",
    keys: Iterable[bytes] | None = None,
) -> Movement:
    """How many keys change node when the node list ``before`` becomes ``after``.

    ``keys`` defaults to :data:`DEFAULT_SAMPLE` made-up keys (``b"sample:<n>"``); give real
    keys (say, from a key dump) to count those. A moved key is a miss until it is written
    again on its new node."""
    old = [a if isinstance(a, Address) else parse_address(a) for a in before]
    new = [a if isinstance(a, Address) else parse_address(a) for a in after]
    old_router = make_placement(placement, old)
    new_router = make_placement(placement, new)
    old_ids = old_router.node_ids
    new_ids = new_router.node_ids
    sample = (b"sample:%d" % n for n in range(DEFAULT_SAMPLE)) if keys is None else keys
    total = 0
    moved_from: dict[str, int] = {}
    moved_to: dict[str, int] = {}
    for key in sample:
        total += 1
        source = old_ids[old_router.node_index(key)]
        target = new_ids[new_router.node_index(key)]
        if source != target:
            moved_from[source] = moved_from.get(source, 0) + 1
            moved_to[target] = moved_to.get(target, 0) + 1
    return Movement(total, sum(moved_from.values()), moved_from, moved_to)
