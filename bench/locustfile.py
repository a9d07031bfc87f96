"""Load on the example project's views, for comparing cache backends under a real site.

Each simulated visitor browses the way shop visitors do: mostly the home page and product
pages, some catalogue pages, now and then a cart update (a session write) and a hit
counter (an atomic incr). Product numbers are drawn from a skewed distribution so that a
few products are hot, as on real sites.

See bench/README.md for the headless command and the server to run it against.
"""

from __future__ import annotations

import random

from locust import HttpUser, between, task

PRODUCTS = 500


def popular_product() -> int:
    # A Pareto draw: low numbers are far more likely, the tail still gets visits.
    return min(PRODUCTS, int(random.paretovariate(1.2)))


class ShopVisitor(HttpUser):
    # A short pause keeps a visitor's requests from being one tight loop; the load is
    # still set by the number of users.
    wait_time = between(0.0, 0.005)

    def on_start(self) -> None:
        # The first request creates the session cookie the cart tasks then reuse.
        self.client.get("/", name="/")

    @task(4)
    def home(self) -> None:
        self.client.get("/", name="/")

    @task(4)
    def product(self) -> None:
        self.client.get(f"/product/{popular_product()}/", name="/product/[pk]/")

    @task(2)
    def catalog(self) -> None:
        page = min(40, int(random.paretovariate(1.5)))
        self.client.get(f"/catalog/?page={page}", name="/catalog/?page=[n]")

    @task(1)
    def add_to_cart(self) -> None:
        self.client.get(f"/cart/add/{popular_product()}/", name="/cart/add/[pk]/")

    @task(1)
    def cart(self) -> None:
        self.client.get("/cart/", name="/cart/")

    @task(1)
    def hits(self) -> None:
        self.client.get(f"/hits/page{random.randrange(20)}/", name="/hits/[name]/")
