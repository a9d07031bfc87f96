"""Views using the cache in four common ways.

- ``index``: the low-level API (get_many / set_many, get_or_set).
- ``product``: the per-view cache (``cache_page``).
- ``catalog``: template fragment caching (``{% cache %}``) in the template.
- ``cart_add`` / ``cart``: sessions stored in the cache (SESSION_ENGINE).
- ``hits``: an atomic counter (add + incr).
"""

from __future__ import annotations

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_page

from shop.catalog import PRODUCTS, Product, category_counts, load_product

PAGE_SIZE = 12
FEATURED = (3, 14, 15, 92, 65, 35, 89, 79)


def _key(pk: int) -> str:
    return f"product:{pk}"


def products(pks: list[int]) -> list[Product]:
    """Fetch many products with one cache round trip; build and store the missing ones."""
    found = cache.get_many([_key(pk) for pk in pks])
    missing = {_key(pk): load_product(pk) for pk in pks if _key(pk) not in found}
    if missing:
        cache.set_many(missing, timeout=300)
        found.update(missing)
    return [found[_key(pk)] for pk in pks]


def index(request: HttpRequest) -> HttpResponse:
    counts = cache.get_or_set("catalog:category-counts", category_counts, timeout=600)
    return render(
        request, "shop/index.html", {"featured": products(list(FEATURED)), "counts": counts}
    )


@cache_page(60)
def product(request: HttpRequest, pk: int) -> HttpResponse:
    return render(request, "shop/product.html", {"product": load_product(pk)})


def catalog(request: HttpRequest) -> HttpResponse:
    try:
        page = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        page = 1
    first = (page - 1) * PAGE_SIZE + 1
    pks = [pk for pk in range(first, first + PAGE_SIZE) if pk <= PRODUCTS]
    # The template caches each card and the sidebar; the products are built lazily so that
    # a cached fragment really saves the work.
    context = {"page": page, "pks": pks, "counts": category_counts}
    return render(request, "shop/catalog.html", context)


def cart_add(request: HttpRequest, pk: int) -> JsonResponse:
    cart = request.session.get("cart", {})
    cart[str(pk)] = cart.get(str(pk), 0) + 1
    request.session["cart"] = cart
    return JsonResponse({"items": sum(cart.values())})


def cart(request: HttpRequest) -> HttpResponse:
    in_cart = request.session.get("cart", {})
    items = [(load_product(int(pk)), count) for pk, count in in_cart.items()]
    return render(request, "shop/cart.html", {"items": items})


def hits(request: HttpRequest, name: str) -> JsonResponse:
    key = f"hits:{name}"
    cache.add(key, 0, timeout=None)  # no-op when the counter exists: incr needs a key
    try:
        count = cache.incr(key)
    except ValueError:  # evicted between add and incr
        cache.set(key, 1, timeout=None)
        count = 1
    return JsonResponse({"name": name, "hits": count})
