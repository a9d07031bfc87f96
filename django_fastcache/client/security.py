"""TLS and ASCII authentication: what a new connection does before it carries requests.

Sans-IO: this module builds the TLS context and the authentication request, and judges
what came back; the asyncio and the blocking connect paths do the reading and writing.
Both happen once per connection, when it is opened, never per request.

memcached's ASCII authentication (``-Y <authfile>``, lines of ``user:password``) takes a
``set`` whose key, flags and expiry it ignores and whose value is ``<user> <password>``;
it answers ``STORED`` or ``CLIENT_ERROR ...``. The request carries expiry -1, so a server
started without ``-Y`` stores the credentials as an item that has already expired: they
can never be read back.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any

from ..errors import AuthenticationError, ConfigurationError, TLSError
from ..protocol import Status
from .address import Address

__all__ = [
    "SSLOption",
    "Security",
    "TLSOptions",
    "auth_request",
    "check_auth_reply",
    "make_security",
    "normalize_tls",
    "tls_error",
    "tls_session_error",
]

# memcached splits the value on spaces and its auth file on the first ':'; CR, LF and
# other control bytes would break the request line.
_BAD_USERNAME = re.compile(r"[\x00-\x20\x7f:]")
_BAD_PASSWORD = re.compile(r"[\x00-\x20\x7f]")
# What memcached reads of one auth file line.
_MAX_CREDENTIALS = 255

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = frozenset({62, 64})

TLS_KEYS = ("ca_file", "cert_file", "key_file", "server_hostname", "check_hostname")


@dataclass(frozen=True)
class TLSOptions:
    """The simple form of the ``ssl`` option; every field may be left out.

    ``ca_file``: PEM file of the CAs that sign memcached's certificate (default: the
    system's). ``cert_file``/``key_file``: a client certificate and its key, for a memcached
    that verifies clients (``-o ssl_verify_mode=2``). ``server_hostname``: the name the
    certificate must carry (default: each node's host). ``check_hostname``: whether it must.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_hostname: str | None = None
    check_hostname: bool = True

    @classmethod
    def from_mapping(cls, raw: Any) -> TLSOptions:
        """From a dict such as ``{"ca_file": "/etc/ssl/memcached-ca.pem"}``."""
        unknown = sorted(set(raw) - set(TLS_KEYS), key=repr)
        if unknown:
            raise ConfigurationError(
                f"unknown ssl key(s) {', '.join(map(repr, unknown))}; "
                f"the ssl dict takes {', '.join(TLS_KEYS)}"
            )
        for key in TLS_KEYS[:4]:
            value = raw.get(key)
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigurationError(f"ssl {key} must be a non-empty string or None")
        if not isinstance(raw.get("check_hostname", True), bool):
            raise ConfigurationError("ssl check_hostname must be True or False")
        if raw.get("key_file") is not None and raw.get("cert_file") is None:
            raise ConfigurationError("ssl key_file needs cert_file (the client certificate)")
        return cls(**raw)

    def context(self) -> ssl.SSLContext:
        """A client context: certificates verified, hostnames checked unless turned off."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"ssl: cannot load the certificate files: {exc}") from exc
        context.check_hostname = self.check_hostname
        return context


@dataclass(frozen=True)
class Security:
    """What every new connection does before its first request: TLS (TCP nodes only:
    memcached speaks TLS on TCP listeners, not on unix sockets) and authentication."""

    context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def hostname_for(self, address: Address) -> str | None:
        """The name ``address``'s certificate is checked against."""
        return self.server_hostname or address.host

    def uses_tls(self, address: Address) -> bool:
        return self.context is not None and address.path is None

    @property
    def authenticates(self) -> bool:
        return self.username is not None

    def auth_request(self) -> bytes:
        assert self.username is not None
        assert self.password is not None
        return auth_request(self.username, self.password)

    def __repr__(self) -> str:
        tls = "off" if self.context is None else f"on, server_hostname={self.server_hostname!r}"
        user = "none" if self.username is None else f"{self.username!r}, password hidden"
        return f"Security(tls {tls}; user {user})"


#: What the ``ssl`` option takes: a context, True (the system's CAs), the simple form, or
#: None/False for no TLS.
SSLOption = ssl.SSLContext | TLSOptions | dict[str, Any] | bool | None


def make_security(
    tls: SSLOption = None,
    username: str | None = None,
    password: str | None = None,
) -> Security | None:
    """The :class:`Security` of a client's ``ssl``, ``username`` and ``password`` options,
    or None when it uses neither TLS nor authentication. Bad values raise
    :class:`~django_fastcache.errors.ConfigurationError`."""
    check_credentials(username, password)
    options = normalize_tls(tls)
    context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    if isinstance(options, ssl.SSLContext):
        context = options
    elif options is not None:
        context = options.context()
        server_hostname = options.server_hostname
    if context is None and username is None:
        return None
    return Security(context, server_hostname, username, password)


def normalize_tls(tls: object) -> ssl.SSLContext | TLSOptions | None:
    """The ``ssl`` option in a hashable, checked form (no file is read here): None for no
    TLS, an ``SSLContext`` as given, else :class:`TLSOptions`."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return TLSOptions()
    if isinstance(tls, (ssl.SSLContext, TLSOptions)):
        return tls
    if isinstance(tls, dict):
        return TLSOptions.from_mapping(tls)
    raise ConfigurationError(
        "ssl must be an ssl.SSLContext, True, a dict of "
        f"{', '.join(TLS_KEYS)}, or None; got {type(tls).__name__}"
    )


def check_credentials(username: object, password: object) -> None:
    """Refuse credentials memcached's ASCII authentication cannot carry. The message never
    quotes the password."""
    if username is None and password is None:
        return
    if username is None or password is None:
        raise ConfigurationError("username and password go together: give both or neither")
    if not isinstance(username, str) or not username or _BAD_USERNAME.search(username):
        raise ConfigurationError(
            "username must be a non-empty string without spaces, ':' or control characters"
        )
    if not isinstance(password, str) or not password or _BAD_PASSWORD.search(password):
        raise ConfigurationError(
            "password must be a non-empty string without spaces or control characters "
            "(memcached splits the credentials on spaces)"
        )
    if len(username.encode()) + len(password.encode()) + 1 > _MAX_CREDENTIALS:
        raise ConfigurationError(
            f"username and password are too long: memcached reads {_MAX_CREDENTIALS} bytes "
            "of an auth file line"
        )


def auth_request(username: str, password: str) -> bytes:
    """The request that authenticates a connection (the reply is a storage reply)."""
    value = f"{username} {password}".encode()
    return b"set fastcache:auth 0 -1 %d\r\n%s\r\n" % (len(value), value)


def check_auth_reply(reply: object, address: object, username: str) -> None:
    """Raise :class:`AuthenticationError` unless ``reply`` (the parsed storage reply to
    :func:`auth_request`) says the credentials were accepted."""
    if reply is Status.STORED:
        return
    said = getattr(reply, "message", None) or str(reply)
    raise AuthenticationError(
        f"{address} refused the credentials of user {username!r} ({said}): check the "
        "username and password options against memcached's -Y auth file"
    )


def tls_error(address: object, hostname: str | None, exc: ssl.SSLError) -> TLSError:
    """The error for a TLS handshake with ``address`` that failed with ``exc``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or getattr(exc, "reason", None) or str(exc)
        if exc.verify_code in _NAME_MISMATCH:
            return TLSError(
                f"the TLS certificate of {address} is not valid for {hostname!r} ({reason}): "
                "set ssl server_hostname to a name the certificate carries, or connect by it"
            )
        return TLSError(
            f"the TLS certificate of {address} is not trusted ({reason}): set ssl ca_file "
            "to the CA certificate that signed memcached's certificate"
        )
    reason = getattr(exc, "reason", None) or str(exc)
    return TLSError(
        f"TLS handshake with {address} failed ({reason}): is memcached listening with TLS "
        "(-Z) on that port, and does it accept this client's certificate?"
    )


#: Why a TLS connection failed when it ended before its first reply without an error.
ENDED_UNANSWERED = "the connection ended before any reply"


def tls_session_error(address: object, exc: ssl.SSLError | OSError | str) -> TLSError:
    """The error for a TLS session with ``address`` that broke after the handshake: under
    TLS 1.3 that is how memcached refuses a client's certificate (or the lack of one), with
    an alert and a close, or (when a request of the client's was still unread there) a
    reset, which may overtake the alert. A reason as text: no exception said why."""
    reason = getattr(exc, "reason", None) or exc
    return TLSError(
        f"the TLS session with {address} failed ({reason}): if memcached verifies client "
        "certificates (ssl_verify_mode), set ssl cert_file and key_file"
    )
