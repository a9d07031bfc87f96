"""The ``config get cluster`` reply parser: every split, every way it can be wrong."""

from __future__ import annotations

import pytest

from django_fastcache.errors import ClientError, ProtocolError, ServerError, UnknownCommandError
from django_fastcache.protocol.discovery import (
    CONFIG_GET_CLUSTER,
    ClusterConfig,
    ClusterConfigParser,
    DiscoveredNode,
)
from django_fastcache.testing.config_endpoint import config_reply

NODES = [
    ("mycluster.0001.use1.cache.amazonaws.com", "10.82.235.120", 11211),
    ("mycluster.0002.use1.cache.amazonaws.com", "10.80.249.27", 11212),
]


def parse_all(data: bytes, splits: list[int]) -> list[ClusterConfig]:
    parser = ClusterConfigParser()
    configs = []
    start = 0
    for end in [*splits, len(data)]:
        parser.feed(data[start:end])
        start = end
        while (config := parser.next_config()) is not None:
            configs.append(config)
    assert parser.unread == 0
    return configs


def test_request_bytes() -> None:
    assert CONFIG_GET_CLUSTER == b"config get cluster\r\n"


def test_reply_read_whole() -> None:
    [config] = parse_all(config_reply(7, NODES), [])
    assert config.version == 7
    assert config.nodes == tuple(DiscoveredNode(*node) for node in NODES)
    assert [node.address for node in config.nodes] == ["10.82.235.120:11211", "10.80.249.27:11212"]


def test_longer_declared_length_waits_for_the_bytes() -> None:
    payload = b"1\n10.0.0.1|10.0.0.1|11211\n"
    parser = ClusterConfigParser()
    parser.feed(b"CONFIG cluster 0 %d\r\n%s\r\nEND\r\n" % (len(payload) + 20, payload))
    assert parser.next_config() is None  # the caller's timeout ends the wait


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_every_split_point(size: int) -> None:
    reply = config_reply(3, NODES) + config_reply(4, NODES[:1])
    expected = [ClusterConfig(3, tuple(DiscoveredNode(*n) for n in NODES)),
                ClusterConfig(4, (DiscoveredNode(*NODES[0]),))]  # fmt: skip
    for first in range(len(reply)):
        splits = [first, *range(first + size, len(reply), size)]
        assert parse_all(reply, splits) == expected


def test_every_single_split() -> None:
    reply = config_reply(9, NODES)
    for cut in range(len(reply) + 1):
        parser = ClusterConfigParser()
        parser.feed(reply[:cut])
        got = parser.next_config()
        if cut < len(reply):
            assert got is None, cut
            parser.feed(reply[cut:])
            got = parser.next_config()
        assert got is not None
        assert got.version == 9


def test_payload_ending_in_crlf_may_omit_the_extra_line_end() -> None:
    payload = b"5\n10.0.0.1|10.0.0.1|11211\r\n"
    reply = b"CONFIG cluster 0 %d\r\n%sEND\r\n" % (len(payload), payload)
    for cut in range(len(reply) + 1):
        assert parse_all(reply, [cut]) == [
            ClusterConfig(5, (DiscoveredNode("10.0.0.1", "10.0.0.1", 11211),))
        ]


def test_memorystore_form_and_ipv6() -> None:
    reply = config_reply(2, [("10.1.0.3", "10.1.0.3", 11211), ("", "2001:db8::5", 11211)])
    [config] = parse_all(reply, [])
    assert [n.address for n in config.nodes] == ["10.1.0.3:11211", "[2001:db8::5]:11211"]


def test_host_name_used_without_ip() -> None:
    [config] = parse_all(config_reply(1, [("cache-1.internal", "", 11211)]), [])
    assert config.nodes[0].address == "cache-1.internal:11211"


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"ERROR\r\n", UnknownCommandError),
        (b"CLIENT_ERROR bad command line format\r\n", ClientError),
        (b"SERVER_ERROR out of memory\r\n", ServerError),
        (b"END\r\n", ProtocolError),
        (b"VALUE k 0 1\r\nx\r\nEND\r\n", ProtocolError),
        (b"CONFIG cluster 0 -5\r\n", ProtocolError),
        (b"CONFIG cluster 0 99999999999\r\n", ProtocolError),
        (b"CONFIG cluster 0 x\r\n", ProtocolError),
    ],
)
def test_error_and_bad_headers(line: bytes, error: type[Exception]) -> None:
    parser = ClusterConfigParser()
    parser.feed(line)
    with pytest.raises(error):
        parser.next_config()


def test_error_names_the_fix() -> None:
    parser = ClusterConfigParser()
    parser.feed(b"ERROR\r\n")
    with pytest.raises(UnknownCommandError, match="configuration endpoint"):
        parser.next_config()


def test_header_without_line_end_is_bounded() -> None:
    parser = ClusterConfigParser()
    parser.feed(b"C" * 255)
    assert parser.next_config() is None
    parser.feed(b"C")
    with pytest.raises(ProtocolError, match="no line end"):
        parser.next_config()


def test_declared_length_is_bounded() -> None:
    parser = ClusterConfigParser(max_length=100)
    parser.feed(b"CONFIG cluster 0 101\r\n")
    with pytest.raises(ProtocolError, match="over 100"):
        parser.next_config()


def _reply_with_payload(payload: bytes) -> bytes:
    return b"CONFIG cluster 0 %d\r\n%s\r\nEND\r\n" % (len(payload), payload)


@pytest.mark.parametrize(
    "payload",
    [
        b"1\n",  # no node line
        b"1\n\n",  # an empty node list
        b"x\n10.0.0.1|10.0.0.1|11211\n",  # a version that is not a number
        b"1\n10.0.0.1|11211\n",  # two fields
        b"1\n10.0.0.1|10.0.0.1|0\n",  # port 0
        b"1\n10.0.0.1|10.0.0.1|65536\n",
        b"1\n10.0.0.1|10.0.0.1|port\n",
        b"1\n||11211\n",  # neither host name nor IP
        b"1\n10.0.0.1|10.0.0.1|11211\nextra\n",  # a third line
        b"1\n\xff|10.0.0.1|11211\n",  # not ASCII
    ],
)
def test_bad_payloads(payload: bytes) -> None:
    parser = ClusterConfigParser()
    parser.feed(_reply_with_payload(payload))
    with pytest.raises(ProtocolError):
        parser.next_config()


def test_length_that_lies_is_caught_not_trusted_to_end() -> None:
    payload = b"1\n10.0.0.1|10.0.0.1|11211\n"
    # Declared one byte short: what follows the counted bytes is not the trailer.
    reply = b"CONFIG cluster 0 %d\r\n%s\r\nEND\r\n" % (len(payload) - 1, payload)
    parser = ClusterConfigParser()
    parser.feed(reply)
    with pytest.raises(ProtocolError, match="not followed by END"):
        parser.next_config()
