"""``mypyc_attr`` and ``i64`` where the compiler's helper package is installed, stand-ins
elsewhere.

The hot modules are compiled with mypyc when a wheel is built with a C compiler at hand
(see ``setup.py``); the decorator tells the compiler how to build a class, and means
nothing at run time. ``i64`` annotates a variable the compiler keeps as a native 64-bit
integer (no tagged-integer checks per operation); run as Python it is ``int``, and code
using it must never leave the 64-bit range, so that both builds compute the same values.
A pure-Python install need not have ``mypy_extensions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import i64, mypyc_attr
else:
    try:
        from mypy_extensions import i64, mypyc_attr
    except ImportError:  # a pure-Python install without mypy
        i64 = int

        def mypyc_attr(*attrs, **kwattrs):
            return lambda cls: cls


__all__ = ["i64", "mypyc_attr"]
