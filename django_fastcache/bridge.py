"""The sync bridge: synchronous code running the client's coroutines to completion.

The commands are coroutines written once (:class:`~django_fastcache.client.commands.
CommandSet`). Run against the :class:`~django_fastcache.client.blocking.BlockingClient`,
whose I/O is done on blocking sockets owned by the calling thread, they never suspend: one
``send(None)`` runs them to the end on the caller's thread. There is no event loop to start,
no thread to wake and nothing to deadlock on, so the bridge also works from a thread that is
already running an event loop (it then blocks that loop for at most the operation's
timeout, as any synchronous cache call would).

Measured here on loopback (see ``bench/sync_vs_pylibmc.py``): driving a private event loop
with ``run_until_complete`` per call cost about twice a blocking round trip, and on the
main thread uvloop's ``run_until_complete`` sets up signal handling on every call, adding
about 40 µs; hopping to a loop thread costs more again. This path costs what the socket
round trip costs.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BridgeError(RuntimeError):
    """A coroutine given to the bridge tried to wait for asynchronous I/O."""


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to completion and return its result."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise BridgeError(
        "a command awaited asynchronous I/O on the synchronous path; "
        "use the BlockingClient for synchronous calls"
    )
