from __future__ import annotations

from django.apps import AppConfig


class FastCacheConfig(AppConfig):
    name = "django_fastcache"
    verbose_name = "FastCache"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
