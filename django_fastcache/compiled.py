"""Which of the hot modules run compiled (mypyc) and which as pure Python.

The package is pure Python; a wheel built where a C compiler is available also carries
mypyc-compiled copies of the hot modules, which Python then imports in their place. Both
behave the same and run the same test suite.
"""

from __future__ import annotations

import importlib

#: The modules a build may compile: the wire protocol, the commands, the blocking client
#: and the backend's key and value handling.
HOT_MODULES = (
    "django_fastcache.protocol.keys",
    "django_fastcache.protocol.commands",
    "django_fastcache.protocol.parser",
    "django_fastcache.client.hashing",
    "django_fastcache.client.cluster",
    "django_fastcache.client.commands",
    "django_fastcache.client.blocking",
    "django_fastcache.expiry",
    "django_fastcache.serializers",
    "django_fastcache.backends.fastcache",
)


def is_compiled(module_name: str) -> bool:
    """Whether ``module_name`` was loaded from a compiled extension."""
    module = importlib.import_module(module_name)
    return not (getattr(module, "__file__", None) or "").endswith(".py")


def compiled_modules() -> dict[str, bool]:
    """Each hot module and whether it runs compiled."""
    return {name: is_compiled(name) for name in HOT_MODULES}


def describe() -> str:
    """``compiled (7 of 7 hot modules)`` or ``pure Python``, for reports and benchmarks."""
    count = sum(compiled_modules().values())
    if count == 0:
        return "pure Python"
    return f"compiled ({count} of {len(HOT_MODULES)} hot modules)"


__all__ = ["HOT_MODULES", "compiled_modules", "describe", "is_compiled"]
