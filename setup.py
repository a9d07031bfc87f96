"""Build script: everything but the compiled modules is declared in pyproject.toml.

The package is pure Python. Where mypyc and a C compiler are at hand, a wheel also carries
compiled copies of the hot modules (``django_fastcache.compiled.HOT_MODULES``), which
Python then imports in place of the ``.py`` files; ``django_fastcache.compiled.describe()``
says which run. ``FASTCACHE_COMPILE`` chooses:

* unset or ``auto``: compile when possible, else install pure Python with a warning;
  editable installs stay pure Python (compiled modules in the source tree would shadow
  the ``.py`` files being edited);
* ``1``: compile, also in place, and fail the build if that fails;
* ``0``: never compile.
"""

from __future__ import annotations

import os
import runpy
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

MODE = os.environ.get("FASTCACHE_COMPILE", "auto").strip().lower()
if MODE not in {"auto", "0", "1"}:
    raise SystemExit(f"FASTCACHE_COMPILE must be auto, 0 or 1, not {MODE!r}")

HERE = os.path.dirname(os.path.abspath(__file__))
_COMPILED = runpy.run_path(os.path.join(HERE, "django_fastcache", "compiled.py"))
HOT_MODULES: tuple[str, ...] = _COMPILED["HOT_MODULES"]
MYPYC_OPTIONS: tuple[str, ...] = _COMPILED["MYPYC_OPTIONS"]


def compiled_extensions() -> list[Any]:
    if MODE == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        if MODE == "1":
            raise
        print("django-fastcache: mypyc is not installed; installing pure Python")
        return []
    paths = [name.replace(".", "/") + ".py" for name in HOT_MODULES]
    try:
        return list(
            mypycify([*MYPYC_OPTIONS, *paths], opt_level="3", group_name="django_fastcache")
        )
    except SystemExit:  # mypy's errors are printed above
        if MODE == "1":
            raise
        # The build environment lacks Django's types (django-stubs, a build requirement:
        # a build without isolation may not have it): compiled, the backend would fail.
        print(
            "django-fastcache: mypyc could not type the hot modules (is django-stubs "
            "installed where the package is built?); installing pure Python"
        )
        return []


class OptionalBuildExt(build_ext):
    """Builds the compiled modules, or, unless FASTCACHE_COMPILE=1, leaves them out when
    that is not possible (no C compiler) or not wanted (an editable install)."""

    def run(self) -> None:
        editable = self.inplace or getattr(self, "editable_mode", False)
        if MODE == "auto" and editable:
            print("django-fastcache: editable install, pure Python (FASTCACHE_COMPILE=1 compiles)")
            self.extensions = []
            return
        try:
            super().run()
        except Exception as exc:
            if MODE == "1":
                raise
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)  # a partial build must not shadow the .py files
            print(f"django-fastcache: compiling failed ({exc}); installing pure Python")
            self.extensions = []


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": OptionalBuildExt})
