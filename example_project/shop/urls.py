from __future__ import annotations

from django.urls import path

from shop import views

urlpatterns = [
    path("", views.index, name="index"),
    path("product/<int:pk>/", views.product, name="product"),
    path("catalog/", views.catalog, name="catalog"),
    path("cart/", views.cart, name="cart"),
    path("cart/add/<int:pk>/", views.cart_add, name="cart-add"),
    path("hits/<slug:name>/", views.hits, name="hits"),
]
