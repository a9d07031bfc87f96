"""A generated catalogue standing in for a database.

Building a product costs real CPU time (a key derivation), like a query and its ORM work
would: that is the cost the cache is there to save, and what a load test can see.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

PRODUCTS = 500
CATEGORIES = ("books", "garden", "kitchen", "music", "toys", "tools")
# Rounds of PBKDF2 per product: about a millisecond of work on a current CPU.
WORK_ROUNDS = 2000


@dataclass(frozen=True)
class Product:
    pk: int
    name: str
    category: str
    price_cents: int
    description: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_product(pk: int) -> Product:
    """The slow path: what a page pays for each product the cache does not have."""
    digest = hashlib.pbkdf2_hmac("sha256", str(pk).encode(), b"catalogue", WORK_ROUNDS)
    return Product(
        pk=pk,
        name=f"Product {pk}",
        category=CATEGORIES[pk % len(CATEGORIES)],
        price_cents=100 + digest[0] * 37 + digest[1],
        description=f"Item {pk}, lot {digest.hex()[:12]}. " * 4,
    )


def category_counts() -> dict[str, int]:
    """A report over the whole catalogue: expensive enough that only a cache makes it cheap."""
    counts = dict.fromkeys(CATEGORIES, 0)
    for pk in range(1, PRODUCTS + 1):
        counts[load_product(pk).category] += 1
    return counts
