"""The cachebench harness: the eight-process latency benchmark and the throughput mode.

Importable so that ``manage.py cachebench`` and ``python -m django_fastcache.bench`` stay
thin. This package module imports nothing heavy: spawned workers import the submodules
they need and no more.
"""

from __future__ import annotations
