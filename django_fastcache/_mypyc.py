"""``mypyc_attr`` where the compiler's helper package is installed, a no-op elsewhere.

The hot modules are compiled with mypyc when a wheel is built with a C compiler at hand
(see ``setup.py``); the decorator tells the compiler how to build a class, and means
nothing at run time. A pure-Python install need not have ``mypy_extensions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # a pure-Python install without mypy

        def mypyc_attr(*attrs, **kwattrs):
            return lambda cls: cls


__all__ = ["mypyc_attr"]
