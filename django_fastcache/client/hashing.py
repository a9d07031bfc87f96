"""Rendezvous (highest random weight) hashing of keys onto memcached nodes.

Every (node, key) pair gets a 64-bit score and the key goes to the node with the highest
score. Placement therefore depends only on the node ids, not on their order, and when a
node is removed only its own keys move (each to its next-best node); when one is added it
takes about ``1 / (n + 1)`` of the keys and nothing else moves.

The score is BLAKE2b with an 8-byte digest, keyed with a per-node key, over the cache key:

    node_key = blake2b(node_id.encode("utf-8", "surrogatepass"), digest_size=32,
                       person=b"fastcache-node").digest()
    score    = int.from_bytes(blake2b(key, digest_size=8, key=node_key).digest(), "big")

Higher score wins; equal scores (about a 2**-64 chance) go to the smaller node id.

This was measured against hashing the key once and mixing the result with a per-node seed
through a 64-bit integer finaliser (splitmix64) in Python: copying a keyed hasher prepared
per node was faster up to five nodes and about even at ten for keys of typical length,
and being a keyed cryptographic hash it needs no hand-picked mixing constants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from hashlib import blake2b

from ..errors import ConfigurationError

__all__ = ["Placement", "Rendezvous", "node_key", "score"]

# Separates node-key derivation from every other use of BLAKE2b in the process.
_PERSON = b"fastcache-node"


def node_key(node_id: str) -> bytes:
    """The 32-byte BLAKE2b key that scores keys for ``node_id``.

    Derived by hashing rather than using the id directly because BLAKE2b keys are limited
    to 64 bytes and unix socket paths can be longer. "surrogatepass" lets any ``str`` be
    encoded while keeping distinct ids distinct.
    """
    data = node_id.encode("utf-8", "surrogatepass")
    return blake2b(data, digest_size=32, person=_PERSON).digest()


def score(node_id: str, key: bytes) -> int:
    """The 64-bit rendezvous score of ``key`` on ``node_id`` (slow path, for reference)."""
    return int.from_bytes(blake2b(key, digest_size=8, key=node_key(node_id)).digest(), "big")


class Placement:
    """Routes keys to nodes. Subclasses: :class:`Rendezvous` (the default) and the
    compatibility modes of :mod:`django_fastcache.client.placement`.

    ``slots``, when given, are the numbers :meth:`node_index` answers instead of positions
    in ``node_ids`` (a cluster whose node list changes keeps one slot per node it ever had).
    """

    __slots__ = ()

    @property
    def node_ids(self) -> tuple[str, ...]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.node_ids)

    def node_index(self, key: bytes) -> int:
        """The slot (by default the index into ``node_ids``) of the node that owns ``key``."""
        raise NotImplementedError

    def group(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        """Keys grouped by owning node, in their original order within each node.

        Only nodes that own at least one of the keys appear.
        """
        groups: dict[int, list[bytes]] = {}
        node_index = self.node_index
        for key in keys:
            index = node_index(key)
            bucket = groups.get(index)
            if bucket is None:
                groups[index] = [key]
            else:
                bucket.append(key)
        return groups


def check_node_ids(node_ids: Sequence[str], slots: Sequence[int] | None) -> tuple[str, ...]:
    """The ids as a tuple, refused with ConfigurationError unless usable."""
    # A bare string is a Sequence[str] too, and would become one node per character.
    if isinstance(node_ids, str):
        raise ConfigurationError(f"node ids must be a sequence of strings, not {node_ids!r}")
    ids = tuple(node_ids)
    if not ids:
        raise ConfigurationError("at least one node is needed")
    for node_id in ids:
        if not isinstance(node_id, str) or not node_id:
            raise ConfigurationError(f"node ids must be non-empty strings, got {node_id!r}")
    if len(set(ids)) != len(ids):
        duplicates = sorted({node_id for node_id in ids if ids.count(node_id) > 1})
        raise ConfigurationError(f"duplicate nodes: {', '.join(duplicates)}")
    if slots is not None and len(slots) != len(ids):
        raise ConfigurationError("one slot per node id is needed")
    return ids


class Rendezvous(Placement):
    """Maps keys to indices into the ``node_ids`` it was given (or to their ``slots``)."""

    __slots__ = ("_copiers", "_ids", "_order")

    def __init__(self, node_ids: Sequence[str], slots: Sequence[int] | None = None) -> None:
        ids = check_node_ids(node_ids, slots)
        self._ids = ids
        # Nodes are visited in node-id order and a later node must score strictly higher
        # to win, so ties go to the smaller id at no cost per comparison, and the result
        # does not depend on the order the ids were given in.
        visit = sorted(range(len(ids)), key=ids.__getitem__)
        # What node_index answers for each visited node: its index, or its slot.
        self._order = tuple(visit) if slots is None else tuple(slots[index] for index in visit)
        # Copying a hasher that already holds the node's key skips re-keying per lookup.
        self._copiers: tuple[Callable[[], blake2b], ...] = tuple(
            blake2b(digest_size=8, key=node_key(ids[index])).copy for index in visit
        )

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def node_index(self, key: bytes) -> int:
        """Index (into the node ids given), or slot, of the node that owns ``key``."""
        order = self._order
        if len(order) == 1:
            return order[0]
        # Big-endian digests compare as bytes exactly as their integer scores would.
        best = b""
        best_position = 0
        for position, copy in enumerate(self._copiers):
            hasher = copy()
            hasher.update(key)
            digest = hasher.digest()
            if digest > best:
                best = digest
                best_position = position
        return order[best_position]

    def ranked(self, key: bytes) -> list[int]:
        """All node indices (or slots), the owner of ``key`` first, then the fallbacks."""
        order = self._order
        if len(order) == 1:
            return [order[0]]
        digests = []
        for copy in self._copiers:
            hasher = copy()
            hasher.update(key)
            digests.append(hasher.digest())
        # sorted() is stable even with reverse=True, so equal scores keep node-id order.
        positions = sorted(range(len(order)), key=digests.__getitem__, reverse=True)
        return [order[position] for position in positions]

    def group(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        """Keys grouped by owning node index, in their original order within each node.

        Only nodes that own at least one of the keys appear.
        """
        if len(self._order) == 1:  # one node owns everything: no hashing
            single = list(keys)
            return {self._order[0]: single} if single else {}
        return super().group(keys)

    def __repr__(self) -> str:
        return f"Rendezvous({list(self._ids)!r})"
