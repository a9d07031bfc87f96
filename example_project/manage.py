#!/usr/bin/env python
"""The example project's manage.py: ``runserver``, ``cachebench`` and Django's other commands."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    try:
        import django_fastcache  # noqa: F401
    except ImportError:
        # Run from a source checkout without installing the package: the package sits one
        # directory up. Benchmark workers inherit this path.
        sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
