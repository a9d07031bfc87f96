"""Cluster autodiscovery's wire format, without I/O: ``config get cluster`` and its reply.

AWS ElastiCache (memcached 1.4.14 and later, on the configuration endpoint) and GCP
Memorystore for Memcached (on the discovery endpoint) answer the same command the same way::

    config get cluster\\r\\n

    CONFIG cluster 0 <length>\\r\\n
    <version>\\n
    <hostname>|<ip>|<port> <hostname>|<ip>|<port> ...\\n
    \\r\\n
    END\\r\\n

``<length>`` counts the bytes of the two lines that follow the header (their ``\\n``
included). The version grows by one with every change of the node list. Memorystore fills
both the host name and the IP address with the node's IP.

The reply is read by its declared length, never by looking for ``END`` (a host name could
hold anything), and it may arrive split anywhere: feed the parser whatever was read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ClientError, ProtocolError, ServerError, UnknownCommandError

__all__ = [
    "CONFIG_GET_CLUSTER",
    "ClusterConfig",
    "ClusterConfigParser",
    "DiscoveredNode",
]

CONFIG_GET_CLUSTER = b"config get cluster\r\n"

_HEADER = b"CONFIG cluster 0 "
# No header line is longer; a peer that sends more without a line end is not a config
# endpoint.
_MAX_HEADER = 256
_TRAILER = b"\r\nEND\r\n"
_MAX_PORT = 65535


@dataclass(frozen=True)
class DiscoveredNode:
    """One node as the configuration lists it."""

    hostname: str
    ip: str
    port: int

    @property
    def address(self) -> str:
        """The address to connect to, as ``LOCATION`` writes it: the IP when the
        configuration gives one (no DNS lookup needed), else the host name."""
        host = self.ip or self.hostname
        if ":" in host:
            return f"[{host}]:{self.port}"
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class ClusterConfig:
    """A configuration version and its node list, in the order listed."""

    version: int
    nodes: tuple[DiscoveredNode, ...]


class ClusterConfigParser:
    """Reads replies to ``config get cluster`` from bytes fed in any pieces.

    :meth:`next_config` returns a :class:`ClusterConfig` once a whole reply has arrived,
    None while more bytes are needed, and raises for an error reply
    (``UnknownCommandError`` for ``ERROR``: the peer does not know the command) or for
    bytes that are not such a reply (``ProtocolError``). After an error the stream is out
    of step: drop the connection.
    """

    def __init__(self, max_length: int = 1024 * 1024) -> None:
        self.max_length = max_length
        self._buffer = bytearray()
        self._length: int | None = None  # the payload's length, once the header is read

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def unread(self) -> int:
        return len(self._buffer)

    def next_config(self) -> ClusterConfig | None:
        buffer = self._buffer
        if self._length is None:
            end = buffer.find(b"\r\n", 0, _MAX_HEADER)
            if end < 0:
                if len(buffer) >= _MAX_HEADER:
                    raise ProtocolError(
                        f"no line end in the first {_MAX_HEADER} bytes of a config reply"
                    )
                return None
            self._length = _header_length(bytes(buffer[:end]), self.max_length)
            del buffer[: end + 2]
        length = self._length
        # The trailer follows the payload; a payload that ends in "\r\n" itself may be
        # followed by "END\r\n" alone.
        if len(buffer) < length + len(_TRAILER) - 2:
            return None
        payload = bytes(buffer[:length])
        rest = bytes(buffer[length : length + len(_TRAILER)])
        if rest == _TRAILER:
            used = length + len(_TRAILER)
        elif payload.endswith(b"\r\n") and rest[:5] == b"END\r\n":
            used = length + 5
        elif _TRAILER.startswith(rest) or (
            payload.endswith(b"\r\n") and b"END\r\n".startswith(rest)
        ):
            return None  # the trailer is still arriving
        else:
            raise ProtocolError(
                f"a config reply's {length} bytes are not followed by END: {rest!r}"
            )
        del buffer[:used]
        self._length = None
        return _parse_payload(payload)


def _header_length(line: bytes, max_length: int) -> int:
    """The payload length declared by the header ``line``, or the error the line names."""
    if line == b"ERROR":
        raise UnknownCommandError(
            "the endpoint does not know 'config get cluster': autodiscovery needs an "
            "ElastiCache configuration endpoint or a Memorystore discovery endpoint"
        )
    if line.startswith(b"CLIENT_ERROR"):
        raise ClientError(line[len(b"CLIENT_ERROR") :].strip().decode("ascii", "replace"))
    if line.startswith(b"SERVER_ERROR"):
        raise ServerError(line[len(b"SERVER_ERROR") :].strip().decode("ascii", "replace"))
    if line == b"END":
        raise ProtocolError("the endpoint holds no cluster configuration")
    if not line.startswith(_HEADER):
        raise ProtocolError(f"not a config reply: {line[:80]!r}")
    digits = line[len(_HEADER) :]
    if not (digits.isdigit() and len(digits) <= 10):
        raise ProtocolError(f"bad length in config reply header {line!r}")
    length = int(digits)
    if length > max_length:
        raise ProtocolError(f"a config reply of {length} bytes is over {max_length}")
    return length


def _parse_payload(payload: bytes) -> ClusterConfig:
    try:
        text = payload.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("a config reply holds bytes that are not ASCII") from None
    lines = [line.strip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) != 2:
        raise ProtocolError(
            f"a config reply must hold a version line and a node line, got {len(lines)} lines"
        )
    version_text, node_text = lines
    if not (version_text.isdigit() and len(version_text) <= 20):
        raise ProtocolError(f"bad configuration version {version_text!r}")
    nodes = []
    for entry in node_text.split():
        parts = entry.split("|")
        if len(parts) != 3:
            raise ProtocolError(f"a node must be hostname|ip|port, got {entry!r}")
        hostname, ip, port_text = parts
        if not (hostname or ip):
            raise ProtocolError(f"a node without host name or IP: {entry!r}")
        if not (port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) <= _MAX_PORT):
            raise ProtocolError(f"bad port in node {entry!r}")
        nodes.append(DiscoveredNode(hostname, ip, int(port_text)))
    if not nodes:
        raise ProtocolError("the cluster configuration lists no node")
    return ClusterConfig(int(version_text), tuple(nodes))
