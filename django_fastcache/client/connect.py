"""Opening one asyncio connection to a node: TCP or unix socket, then TLS and
authentication when the client's :class:`~django_fastcache.client.security.Security` asks.

The pool runs :func:`open_connection` as a task bounded by ``connect_timeout``; whatever
ends it early (timeout, cancellation, a refused handshake) closes what was opened.
"""

from __future__ import annotations

import asyncio
import ssl

from ..errors import ConnectionLostError
from ..protocol import ReplyKind
from .address import Address
from .connection import Connection
from .security import Security, check_auth_reply, tls_error


async def open_connection(
    loop: asyncio.AbstractEventLoop,
    address: Address,
    max_value_size: int,
    security: Security | None,
    connect_timeout: float,
) -> tuple[asyncio.BaseTransport, Connection]:
    """A connection to ``address`` ready for requests.

    A refused TLS handshake raises :class:`~django_fastcache.errors.TLSError`, refused
    credentials :class:`~django_fastcache.errors.AuthenticationError`; other failures to
    connect raise the ``OSError`` the loop gave (the pool classifies it)."""

    def factory() -> Connection:
        return Connection(loop, max_value_size, address)

    if address.path is not None:
        transport, connection = await loop.create_unix_connection(factory, address.path)
    else:
        assert address.host is not None
        assert address.port is not None
        if security is not None and security.context is not None:
            hostname = security.hostname_for(address)
            try:
                transport, connection = await loop.create_connection(
                    factory,
                    address.host,
                    address.port,
                    ssl=security.context,
                    server_hostname=hostname,
                    ssl_handshake_timeout=connect_timeout,
                )
            except ssl.SSLError as exc:
                raise tls_error(address, hostname, exc) from exc
        else:
            transport, connection = await loop.create_connection(
                factory, address.host, address.port
            )
    if security is not None and security.username is not None:
        try:
            await _authenticate(loop, connection, security, connect_timeout)
        except BaseException:
            connection.abort(ConnectionLostError(f"authentication with {address} failed"))
            raise
    return transport, connection


async def _authenticate(
    loop: asyncio.AbstractEventLoop,
    connection: Connection,
    security: Security,
    connect_timeout: float,
) -> None:
    assert security.username is not None
    deadline = loop.time() + connect_timeout
    reply = await connection.request(security.auth_request(), ReplyKind.STORAGE, deadline)
    check_auth_reply(reply, connection.address, security.username)
