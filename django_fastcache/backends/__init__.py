"""Django cache backends: ``django_fastcache.backends.FastCache``."""

from .fastcache import FastCache

__all__ = ["FastCache"]
