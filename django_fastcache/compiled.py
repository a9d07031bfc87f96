"""Which of the hot modules run compiled (mypyc) and which as pure Python.

The package is pure Python; a wheel built where a C compiler is available also carries
mypyc-compiled copies of the hot modules, which Python then imports in their place. Both
behave the same and run the same test suite.
"""

from __future__ import annotations

import importlib

#: The modules a build compiles: the reply parser, the blocking client, the backend's key
#: and value handling, and the disk tier's request path (the tiered store, its write
#: stamps, node states and writer behind; the SQLite stores and the journal stay Python).
#: Left out on purpose: the request encoders, the key rules and the command set, whose
#: public functions take any object and answer a wrong type with the project's own typed
#: errors (a compiled function refuses it with a bare TypeError first); and rendezvous
#: hashing, likewise.
HOT_MODULES = (
    "django_fastcache.protocol.parser",
    "django_fastcache.client.cluster",
    "django_fastcache.client.blocking",
    "django_fastcache.expiry",
    "django_fastcache.serializers",
    "django_fastcache.sealing",
    "django_fastcache.backends.fastcache",
    "django_fastcache.disk.nodestate",
    "django_fastcache.disk.readcopies",
    "django_fastcache.disk.stamps",
    "django_fastcache.disk.writebehind",
    "django_fastcache.tiered",
)

#: mypy's options for the build (setup.py). Not the project's configuration: its Django
#: plugin needs a settings module, which a build environment does not have. Untyped
#: imports compile as Any, except as a base class: a compiled class whose base mypy cannot
#: see (Django's ``BaseCache`` without django-stubs in the build environment) is laid out
#: without the base's attributes and fails at run time, on the first attribute Django's own
#: ``__init__`` set (SystemError). So the build refuses it, and installs pure Python.
MYPYC_OPTIONS: tuple[str, ...] = (
    "--config-file=",
    "--ignore-missing-imports",
    "--disallow-subclassing-any",
    "--python-version=3.11",
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


__all__ = ["HOT_MODULES", "MYPYC_OPTIONS", "compiled_modules", "describe", "is_compiled"]
