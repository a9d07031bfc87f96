"""The one exception family every layer raises.

Callers catch :class:`FastCacheError` for "anything went wrong with the cache", or one of
its branches when they care why:

* :class:`InvalidKeyError` / :class:`InvalidArgumentError` — the request was refused before
  anything was sent (also ``ValueError``).
* :class:`CommandError` — the server answered with ``ERROR``, ``CLIENT_ERROR`` or
  ``SERVER_ERROR``; the connection is still in step and stays in use.
* :class:`ProtocolError` — the server sent bytes that do not parse; the connection is
  discarded. :class:`ReplyTooLargeError`: a value over this client's ``max_value_size``.
* :class:`NetworkError` — connecting failed, the connection dropped, the node is marked
  out, the server refused the connection, or the call ran past its timeout; the connection
  is discarded. :class:`ConnectFailedError` (:class:`ConnectTimeoutError` among them) says
  the request was never sent, except a :class:`TLSError`: :class:`TLSError` and
  :class:`AuthenticationError` are connects that failed because the node's certificate or
  the credentials did not check out, and a :class:`TLSError` is also a TLS session that
  broke on an established connection.
  :class:`LocalResourceError` is the one branch that blames this process (out of
  descriptors), not the node.
"""

from __future__ import annotations

import builtins


class FastCacheError(Exception):
    """Root of every error raised by django_fastcache's client and protocol layers."""


class InvalidKeyError(FastCacheError, ValueError):
    """A key that memcached's text protocol cannot carry (too long, space or control bytes)."""


class InvalidArgumentError(FastCacheError, ValueError):
    """A flag, expiry, delta or value outside what the protocol allows."""


class ConfigurationError(FastCacheError, ValueError):
    """A server address or option that cannot be used."""


class CommandError(FastCacheError):
    """The server refused a command; the connection stays usable."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class UnknownCommandError(CommandError):
    """The server answered ``ERROR``: it does not know the command."""


class ClientError(CommandError):
    """The server answered ``CLIENT_ERROR <message>``: it judged the request malformed."""


class NonIntegerValueError(ClientError, TypeError):
    """``incr``/``decr`` of a value memcached cannot count (not a non-negative integer)."""


class ServerError(CommandError):
    """The server answered ``SERVER_ERROR <message>``."""


class ValueTooLargeError(ServerError, ValueError):
    """The value exceeds the server's item size limit (``SERVER_ERROR object too large``)."""


class ProtocolError(FastCacheError):
    """The server sent bytes that do not follow the protocol; the connection is discarded."""


class ReplyTooLargeError(ProtocolError):
    """A reply declares a value larger than this client's ``max_value_size`` allows: stored
    by a client with a larger limit (another process's, during a deploy that raised it).
    The connection is discarded; the node is not at fault."""


class NetworkError(FastCacheError):
    """A transport-level failure; the connection involved is discarded."""


class ConnectFailedError(NetworkError, builtins.ConnectionError):
    """A connection to a node could not be opened."""


class ConnectionLostError(NetworkError, builtins.ConnectionError):
    """The connection closed while a request was waiting for its reply."""


class OperationTimeoutError(NetworkError, builtins.TimeoutError):
    """A call ran past its timeout; its connection was discarded."""


class ConnectTimeoutError(ConnectFailedError, OperationTimeoutError):
    """No connection to the node within the time allowed: ``connect_timeout`` ran out
    (connecting, the TLS handshake or authentication), or the call's timeout while it
    waited for a connection. The request was not sent, so it did not run."""


class OutcomeUnknownError(NetworkError):
    """With the disk tier: an ``incr``/``decr`` or ``add`` whose node failed while it ran (a
    timeout, a lost connection, or a reply that came after the node was marked out), so
    that memcached may or may not have made it, and the disk tier cannot make it without
    contradicting what memcached may have answered meanwhile. It may have taken effect."""


class ServerRefusedConnectionError(NetworkError, builtins.ConnectionError):
    """The server refused the connection (memcached's ``Too many open connections``)."""


class LocalResourceError(NetworkError, builtins.ConnectionError):
    """This process could not open a connection (out of file descriptors or memory), or an
    async call found every connection of its pool busy until its timeout.

    It says nothing about the node: the disk tier answers without marking the node out."""


class TLSError(ConnectFailedError):
    """A TLS connection to a node could not be set up: its certificate is not trusted or
    names another host, or the node does not speak TLS. The message names the fix."""


class AuthenticationError(ConnectFailedError):
    """memcached refused the ``username``/``password`` (ASCII authentication, ``-Y``)."""


class ClientClosedError(FastCacheError):
    """The client was closed."""


class ValueRefusedError(FastCacheError, ValueError):
    """A compressed value read back that must not be loaded: it would inflate past
    ``max_value_size``, or does not decompress (raised by a serializer's ``loads``). The
    backend reads it as a miss, as it does a value that fails the seal check."""


__all__ = [
    "AuthenticationError",
    "ClientClosedError",
    "ClientError",
    "CommandError",
    "ConfigurationError",
    "ConnectFailedError",
    "ConnectTimeoutError",
    "ConnectionLostError",
    "FastCacheError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "LocalResourceError",
    "NetworkError",
    "NonIntegerValueError",
    "OperationTimeoutError",
    "OutcomeUnknownError",
    "ProtocolError",
    "ReplyTooLargeError",
    "ServerError",
    "ServerRefusedConnectionError",
    "TLSError",
    "UnknownCommandError",
    "ValueRefusedError",
    "ValueTooLargeError",
]
