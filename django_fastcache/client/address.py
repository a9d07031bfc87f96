"""Memcached server addresses: parsing Django ``LOCATION`` entries into canonical form.

Every node gets a :attr:`Address.node_id`, a canonical text that is the node's identity
for key routing. Two spellings of the same address (``Cache.Example.com:11211`` and
``cache.example.com:11211``, ``[::0001]`` and ``[::1]``) share one node id, so they route
keys identically; two different addresses never share one.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError

__all__ = ["DEFAULT_PORT", "Address", "NoServerError", "parse_address", "parse_locations"]

DEFAULT_PORT = 11211

_UNIX_PREFIX = "unix:"

# Host names are checked against a deliberately plain shape: dot-separated labels of ASCII
# letters, digits, "-" and "_" (container and service names often use "_"), with an optional
# trailing dot for fully qualified names. Internationalised names can be given in punycode.
_HOSTNAME = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*\.?")
# Names made only of digits and dots are mistyped IPv4 addresses ("10.0.0.256", "11211"),
# not host names: resolvers would read some of them as numeric addresses anyway.
_NUMERIC = re.compile(r"[0-9.]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Interface names after "%" in a scoped IPv6 address ("eth0", "enp0s3", "br-1", "vlan.10").
# ipaddress itself accepts any text there, spaces and control characters included.
_SCOPE_ID = re.compile(r"[A-Za-z0-9_.-]+")

# "memcache://", "memcached://", "tcp://"... : Django's LOCATION takes none of them.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# What a socket file name tends to end with; no public top-level domain is spelt so.
_SOCKET_SUFFIXES = (".sock", ".socket")

# Builds the ConfigurationError for the address being parsed, given the reason.
_Fail = Callable[[str], ConfigurationError]


@dataclass(frozen=True, slots=True)
class Address:
    """One memcached node: either ``host`` and ``port``, or the ``path`` of a unix socket.

    Build it with :func:`parse_address`, which validates and canonicalises the parts: the
    host is lower-cased and IPv6 addresses are stored compressed, without brackets.
    """

    host: str | None
    port: int | None
    path: str | None

    def __post_init__(self) -> None:
        # Only the shape is checked here; parse_address is the validating entry point.
        is_tcp = self.host is not None and self.port is not None and self.path is None
        is_unix = self.host is None and self.port is None and self.path is not None
        if not (is_tcp or is_unix):
            raise ConfigurationError(
                f"an address needs either host and port or a unix path, got {self!r}"
            )

    @property
    def is_unix(self) -> bool:
        return self.path is not None

    def open_blocking(self, timeout: float) -> socket.socket:
        """A stream socket connected to this address, in blocking mode with ``timeout``.

        The connect's own ``OSError`` or ``TimeoutError`` propagates: callers name the
        failure for what they were connecting to.
        """
        if self.path is None:
            assert self.host is not None
            assert self.port is not None
            return socket.create_connection((self.host, self.port), timeout)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    @property
    def node_id(self) -> str:
        """Canonical text of the address, e.g. ``10.0.0.5:11211``, ``[::1]:11211``,
        ``unix:/run/memcached.sock``. Parsing it again yields an equal address."""
        if self.path is not None:
            return _UNIX_PREFIX + self.path
        # Only IPv6 hosts contain ":", and the brackets keep the port unambiguous.
        if self.host is not None and ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.node_id


def parse_address(text: str, default_port: int = DEFAULT_PORT) -> Address:
    """Parse one server address as written in a Django cache ``LOCATION``.

    Accepted forms (surrounding whitespace is ignored):

    * ``host``, ``host:port``, ``1.2.3.4``, ``1.2.3.4:port``
    * ``[::1]``, ``[::1]:port``, ``[fe80::1%eth0]:port``
    * a bare IPv6 address such as ``::1`` or ``2001:db8::1``: more than one ``:`` without
      brackets always means IPv6 without a port
    * ``unix:/abs/path.sock`` or a bare ``/abs/path.sock`` for a unix socket

    Raises :class:`~django_fastcache.errors.ConfigurationError` naming the text otherwise.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"a server address must be a string, got {text!r}")
    if not _valid_port(default_port):
        raise ConfigurationError(f"default port {default_port!r} is not in 1..65535")

    def fail(reason: str) -> ConfigurationError:
        return ConfigurationError(f"invalid memcached server address {text!r}: {reason}")

    stripped = text.strip()
    if not stripped:
        raise fail("it is empty")

    scheme = _SCHEME.match(stripped)
    if scheme is not None and not stripped.startswith(_UNIX_PREFIX):
        raise fail(_without_scheme(stripped, scheme.group(1)))

    if stripped.startswith(_UNIX_PREFIX) or stripped.startswith("/"):
        path = stripped[len(_UNIX_PREFIX) :] if stripped.startswith(_UNIX_PREFIX) else stripped
        if not path.startswith("/"):
            raise fail(
                "a unix socket path must be absolute, e.g. unix:/run/memcached/memcached.sock"
            )
        if _CONTROL.search(path):
            raise fail("the unix socket path contains control characters")
        return Address(host=None, port=None, path=path)

    if stripped.startswith("["):
        closing = stripped.find("]")
        if closing < 0:
            raise fail("the '[' of an IPv6 address is not closed")
        host = _ipv6(stripped[1:closing])
        if host is None:
            raise fail("brackets must hold an IPv6 address")
        rest = stripped[closing + 1 :]
        if not rest:
            return Address(host=host, port=default_port, path=None)
        if not rest.startswith(":"):
            raise fail("only ':port' may follow ']'")
        return Address(host=host, port=_port(rest[1:], fail), path=None)

    if stripped.count(":") > 1:
        host = _ipv6(stripped)
        if host is None:
            raise fail("too many ':' (write IPv6 addresses with a port as [addr]:port)")
        return Address(host=host, port=default_port, path=None)

    if _looks_like_path(stripped):
        raise fail(
            "this looks like a relative unix socket path; write the absolute path, "
            "as unix:/abs/path.sock or /abs/path.sock"
        )
    host_text, colon, port_text = stripped.partition(":")
    port = _port(port_text, fail) if colon else default_port
    return Address(host=_host(host_text, fail), port=port, path=None)


class NoServerError(ConfigurationError):
    """A ``LOCATION`` that names no server at all."""

    def __init__(self) -> None:
        super().__init__(
            "LOCATION names no memcached server; give one or more, e.g. '127.0.0.1:11211'"
        )


def parse_locations(location: str | Sequence[str]) -> list[str]:
    """Split a Django cache ``LOCATION`` into server address texts, keeping their spelling.

    As in Django's memcached backends, a string is split on ``;`` or ``,``; the pieces are
    stripped and empty ones dropped. A list or tuple is taken as is. A ``LOCATION`` that
    names no server at all (``""``, ``[]``, ``" ; "``, ``None``) is a
    :class:`NoServerError`; one of another type (a set or a dict, whose order is not the
    one written, among them) a :class:`TypeError`.
    """
    if location is None:
        raise NoServerError
    if isinstance(location, str):
        pieces = (piece.strip() for piece in re.split(r"[;,]", location))
        servers = [piece for piece in pieces if piece]
    elif isinstance(location, (list, tuple)):
        servers = list(location)
        for server in servers:
            if not isinstance(server, str):
                raise ConfigurationError(f"server addresses must be strings, got {server!r}")
    else:
        raise TypeError(f"a string or a list of strings, got {location!r}")
    if not servers:
        raise NoServerError
    return servers


def _valid_port(port: object) -> bool:
    # bool is an int subclass, but True is not a port.
    return isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535


def _port(text: str, fail: _Fail) -> int:
    # isdigit() alone also accepts characters such as "²" that int() refuses, and int()
    # alone accepts "+1", " 1" and "1_000": only plain ASCII digits are a port.
    if not (text.isascii() and text.isdigit()):
        raise fail(f"port {text!r} is not a number")
    port = int(text)
    if not _valid_port(port):
        raise fail(f"port {port} is not in 1..65535")
    return port


def _ipv6(text: str) -> str | None:
    """The compressed lower-case form of an IPv6 address (scope id kept), or None."""
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    if address.scope_id is not None and not _SCOPE_ID.fullmatch(address.scope_id):
        return None
    return str(address)


def _host(text: str, fail: _Fail) -> str:
    if not text:
        raise fail("the host is empty")
    # Checked before lower-casing: a few non-ASCII letters (the Kelvin sign) lower-case to
    # ASCII ones and would otherwise slip through as a different, valid-looking name.
    if not text.isascii():
        raise fail(f"{text!r} is not a valid host name (use punycode for non-ASCII names)")
    host = text.lower()
    if _NUMERIC.fullmatch(host):
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            raise fail(f"{text!r} is not a valid IPv4 address") from None
    if len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise fail(f"{text!r} is not a valid host name")
    return host


def _without_scheme(text: str, scheme: str) -> str:
    """The reason for refusing ``scheme://rest``, with the address to write instead."""
    rest = text[len(scheme) + 3 :].rstrip("/")
    # "memcache://host:11211/0": a path or query after the address means nothing here.
    suggestion = re.split(r"[/?#]", rest, maxsplit=1)[0] or "host:11211"
    return f"addresses take no scheme ({scheme}://); write {suggestion!r}"


def _looks_like_path(text: str) -> bool:
    # Host names never contain "/" nor start with "~"; a relative socket path ("run/mc.sock",
    # "./mc.sock", "~/mc.sock", "mc.sock") would otherwise be read as a host name.
    return "/" in text or text.startswith("~") or text.lower().endswith(_SOCKET_SUFFIXES)
