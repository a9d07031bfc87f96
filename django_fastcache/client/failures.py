"""What a failed connect or a refusing server means, as an error of our own family.

Shared by the asyncio and the blocking client so both classify the same evidence the same
way: the node failed (:class:`ConnectFailedError`), the node refused us for now
(:class:`ServerRefusedConnectionError`), or this process ran short of something
(:class:`LocalResourceError`, which says nothing about the node).
"""

from __future__ import annotations

import errno

from ..errors import (
    ConnectFailedError,
    LocalResourceError,
    NetworkError,
    ServerRefusedConnectionError,
    UnknownCommandError,
)

#: What memcached writes to a connection beyond its ``-c`` limit before closing it.
REFUSAL_LINE = b"ERROR Too many open connections"
_REFUSAL_TEXT = "Too many open connections"

#: socket()/connect() failures caused by this process or host running short, not the node.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connect_error(address: object, exc: OSError) -> NetworkError:
    """The error for a connect to ``address`` that failed with ``exc``."""
    if exc.errno in LOCAL_ERRNOS:
        return LocalResourceError(
            f"cannot open a connection to {address}: this process is out of resources "
            f"({exc.strerror or exc}); raise the open-files limit (ulimit -n) or close "
            "descriptors, the node itself may be fine"
        )
    if exc.errno == errno.ECONNREFUSED or isinstance(exc, ConnectionRefusedError):
        return ConnectFailedError(
            f"connection refused: is memcached running on {address}? check LOCATION"
        )
    if exc.errno == errno.ENOENT:
        return ConnectFailedError(
            f"no socket at {address}: is memcached running there? check LOCATION"
        )
    return ConnectFailedError(f"cannot connect to {address}: {exc}")


def refusal_error(reply: BaseException, address: object) -> ServerRefusedConnectionError | None:
    """The error for memcached's connection-limit refusal, or None for any other reply.

    memcached answers ``ERROR Too many open connections`` and closes: the connection is
    gone, so this is a network failure of the node, not an unknown command."""
    if isinstance(reply, UnknownCommandError) and reply.message.startswith(_REFUSAL_TEXT):
        return refused(address)
    return None


def refused(address: object) -> ServerRefusedConnectionError:
    return ServerRefusedConnectionError(
        f"{address} refused the connection: too many open connections (raise memcached's "
        "-c limit or lower max_connections)"
    )
