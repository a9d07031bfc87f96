"""The ``django_fastcache`` logger, and a rate limit for warnings that would repeat.

Standard :mod:`logging` only: no handler of our own is installed, so the project's
``LOGGING`` setting decides where the records go (see docs/logging.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Hashable

logger = logging.getLogger("django_fastcache")

#: Seconds between two records of one repeating warning (a node still out, a failing disk).
REPEAT_INTERVAL = 60.0


class RateLimit:
    """Lets one record per subject through every ``interval`` seconds."""

    def __init__(self, interval: float = REPEAT_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[Hashable, float] = {}
        self._lock = threading.Lock()
        _rate_limits.add(self)

    def allow(self, subject: Hashable) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(subject)
            if last is not None and now - last < self.interval:
                return False
            self._last[subject] = now
            return True

    def forget(self, subject: Hashable) -> None:
        """The condition ended: the next record of ``subject`` goes through at once."""
        with self._lock:
            self._last.pop(subject, None)


_rate_limits: weakref.WeakSet[RateLimit] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held a lock at the fork: in the child nothing
    # would ever release it, and the first warning would hang.
    for limit in list(_rate_limits):
        limit._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
