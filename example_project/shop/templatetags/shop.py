"""``{{ pk|product }}``: load a product from the template, so a cached fragment skips it."""

from __future__ import annotations

from django import template

from shop.catalog import Product, load_product

register = template.Library()


@register.filter
def product(pk: int) -> Product:
    return load_product(int(pk))
