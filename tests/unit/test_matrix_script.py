"""scripts/matrix's choice of Pythons to build, with apt and the interpreters stubbed out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "matrix"
#: Every command the script would use to fetch, install or find an interpreter: each stub
#: writes its name to a log and fails, so nothing on the machine is touched.
STUBBED = ("apt-get", "apt-cache", "dpkg-query", "tee", "sudo", "python3.13", "python3.14")


def _build_only(tmp_path: Path, pythons: str | None) -> tuple[int, list[str], str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    log = tmp_path / "called"
    for name in STUBBED:
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexit 1\n')
        stub.chmod(0o755)
    environment = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "MATRIX_CACHE": str(tmp_path / "pythons"),
    }
    environment.pop("MATRIX_PYTHONS", None)
    if pythons is not None:
        environment["MATRIX_PYTHONS"] = pythons
    done = subprocess.run(
        ["bash", str(SCRIPT), "--build-only"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    called = log.read_text().split() if log.exists() else []
    return done.returncode, called, done.stderr


@pytest.mark.skipif(not SCRIPT.exists(), reason="scripts/ is not in this tree")
def test_an_empty_list_builds_no_python(tmp_path: Path) -> None:
    returncode, called, stderr = _build_only(tmp_path, "")
    assert (returncode, called) == (0, []), stderr


@pytest.mark.skipif(not SCRIPT.exists(), reason="scripts/ is not in this tree")
def test_unset_looks_for_the_default_versions(tmp_path: Path) -> None:
    _returncode, called, stderr = _build_only(tmp_path, None)
    # Both defaults looked for (and found missing, so the script goes on to apt).
    assert {"python3.13", "python3.14"} <= set(called), stderr
