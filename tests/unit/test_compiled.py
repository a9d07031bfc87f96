"""Which build runs: the pure-Python package or its mypyc-compiled hot modules.

scripts/test runs the suite on both; in the compiled run (FASTCACHE_EXPECT_COMPILED=1) this
module fails unless every hot module really is compiled, so a build that quietly fell back
to pure Python cannot pass for a compiled one.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from django_fastcache import compiled

EXPECT_COMPILED = os.environ.get("FASTCACHE_EXPECT_COMPILED") == "1"


def test_every_hot_module_is_a_python_source_of_the_package() -> None:
    # setup.py compiles exactly these files: each must exist as a .py file.
    for name in compiled.HOT_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None, name
        assert spec.origin is not None, name
        source = Path(spec.origin).with_suffix(".py")
        if not source.exists():  # compiled: origin is the .so beside the .py
            source = Path(spec.origin).parent / (name.rsplit(".", 1)[1] + ".py")
        assert source.exists(), name


def test_describe_agrees_with_the_modules() -> None:
    states = compiled.compiled_modules()
    count = sum(states.values())
    text = compiled.describe()
    if count == 0:
        assert text == "pure Python"
    else:
        assert re.fullmatch(rf"compiled \({count} of {len(states)} hot modules\)", text)


@pytest.mark.skipif(not EXPECT_COMPILED, reason="the pure-Python run")
def test_the_compiled_run_runs_every_hot_module_compiled() -> None:
    assert all(compiled.compiled_modules().values()), compiled.compiled_modules()


@pytest.mark.skipif(EXPECT_COMPILED, reason="the compiled run")
def test_the_pure_run_runs_every_hot_module_from_source() -> None:
    assert not any(compiled.compiled_modules().values()), compiled.compiled_modules()


def test_the_build_refuses_a_compiled_class_whose_base_it_cannot_see(tmp_path: Path) -> None:
    # Built where Django's types are missing (no django-stubs: a build without isolation,
    # or an old build requirement), mypy saw the backend's base class as Any, and mypyc
    # compiled a FastCache that failed on its construction (SystemError). The build's
    # options make that a type error, so that the build falls back to pure Python.
    api = pytest.importorskip("mypy.api")
    backend = Path(compiled.__file__).parent / "backends" / "fastcache.py"
    out, err, status = api.run(
        [*compiled.MYPYC_OPTIONS, "--no-site-packages", f"--cache-dir={tmp_path}", str(backend)]
    )
    assert status == 1, out + err
    assert 'Class cannot subclass "BaseCache" (has type "Any")' in out
