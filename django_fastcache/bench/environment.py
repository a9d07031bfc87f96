"""The header printed before the tables: the machine, the versions, the timer, the method."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from .. import compiled

# Distributions whose versions a reader needs to compare runs.
LIBRARIES: tuple[str, ...] = (
    "Django",
    "django-fastcache",
    "diskcache",
    "pylibmc",
    "pymemcache",
    "django-redis",
    "redis",
    "uvloop",
)


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, or what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        if distribution == "django-fastcache":
            # Run from a checkout, not installed: the package knows its own version.
            from django_fastcache import __version__

            return f"{__version__} (source tree)"
        return "not installed"


def server_version(binary: str) -> str:
    """``memcached -V`` / ``redis-server --version``, reduced to the version number."""
    path = shutil.which(binary)
    if path is None:
        return "not installed"
    flag = "-V" if binary == "memcached" else "--version"
    try:
        output = subprocess.run(
            [path, flag], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"v=(\S+)", output) or re.search(r"(\d+\.\d+\.\d+\S*)", output)
    return match.group(1) if match else output.strip() or "unknown"


def timer_description() -> str:
    info = time.get_clock_info("perf_counter")
    return (
        f"time.perf_counter_ns() around each call ({info.implementation}, "
        f"resolution {info.resolution:.0e} s)"
    )


def machine_fields() -> list[tuple[str, str]]:
    return [
        ("Machine", f"{platform.platform()}, {os.cpu_count()} CPUs, {cpu_model()}"),
        ("Python", f"{platform.python_implementation()} {sys.version.split()[0]}"),
        ("Libraries", ", ".join(f"{name} {package_version(name)}" for name in LIBRARIES)),
        ("FastCache build", compiled.describe()),
        (
            "Servers",
            f"memcached {server_version('memcached')}, "
            f"redis-server {server_version('redis-server')}",
        ),
        ("Timer", timer_description()),
    ]


def render_fields(fields: Sequence[tuple[str, str | Sequence[str]]]) -> str:
    """An RST field list, so the header reads as text and renders in the docs.

    A field with several values becomes an indented bullet list under its name.
    """
    lines = []
    for name, value in fields:
        if isinstance(value, str):
            lines.append(f":{name}: {value}")
        else:
            lines.append(f":{name}:")
            lines += [f"    - {item}" for item in value] or ["    - none"]
    return "\n".join(lines)
