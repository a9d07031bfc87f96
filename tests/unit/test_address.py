"""Server address parsing: accepted forms, rejected forms, canonical node ids."""

from __future__ import annotations

import dataclasses
import ipaddress
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_fastcache.client.address import Address, NoServerError, parse_address, parse_locations
from django_fastcache.errors import ConfigurationError

# text, host, port, path, node_id
ACCEPTED: list[tuple[str, str | None, int | None, str | None, str]] = [
    ("localhost", "localhost", 11211, None, "localhost:11211"),
    ("localhost:11212", "localhost", 11212, None, "localhost:11212"),
    ("cache.example.com:11211", "cache.example.com", 11211, None, "cache.example.com:11211"),
    ("Cache.Example.COM:11211", "cache.example.com", 11211, None, "cache.example.com:11211"),
    ("memcached_1:11211", "memcached_1", 11211, None, "memcached_1:11211"),
    ("cache-2.internal.:1", "cache-2.internal.", 1, None, "cache-2.internal.:1"),
    ("host:65535", "host", 65535, None, "host:65535"),
    ("host:011211", "host", 11211, None, "host:11211"),
    ("1.2.3.4", "1.2.3.4", 11211, None, "1.2.3.4:11211"),
    ("1.2.3.4:11211", "1.2.3.4", 11211, None, "1.2.3.4:11211"),
    ("10.0.0.5:11213", "10.0.0.5", 11213, None, "10.0.0.5:11213"),
    ("[::1]", "::1", 11211, None, "[::1]:11211"),
    ("[::1]:11211", "::1", 11211, None, "[::1]:11211"),
    ("[::1]:22122", "::1", 22122, None, "[::1]:22122"),
    ("[fe80::1%eth0]:11211", "fe80::1%eth0", 11211, None, "[fe80::1%eth0]:11211"),
    ("[2001:DB8:0:0::0001]:11211", "2001:db8::1", 11211, None, "[2001:db8::1]:11211"),
    ("::1", "::1", 11211, None, "[::1]:11211"),
    ("2001:db8::1", "2001:db8::1", 11211, None, "[2001:db8::1]:11211"),
    ("fe80::1%eth0", "fe80::1%eth0", 11211, None, "[fe80::1%eth0]:11211"),
    ("unix:/run/m.sock", None, None, "/run/m.sock", "unix:/run/m.sock"),
    ("/run/m.sock", None, None, "/run/m.sock", "unix:/run/m.sock"),
    ("unix:/tmp/my dir/m.sock", None, None, "/tmp/my dir/m.sock", "unix:/tmp/my dir/m.sock"),
    ("  host:11211 \n", "host", 11211, None, "host:11211"),
    ("\t[::1]:11211 ", "::1", 11211, None, "[::1]:11211"),
    (" unix:/run/m.sock\t", None, None, "/run/m.sock", "unix:/run/m.sock"),
]

REJECTED: list[str] = [
    "",
    "   ",
    "host:",
    ":11211",
    "host:0",
    "host:65536",
    "host:-1",
    "host:+1",
    "host:1_000",
    "host: 11211",
    "host:abc",
    "host:\u00b2",
    "host:11211:extra",
    "a:b:c",
    "::1:11211",
    "[::1",
    "[::1]:",
    "[::1]x",
    "[::1]:abc",
    "[::1]:70000",
    "[]",
    "[1.2.3.4]:11211",
    "[host]:11211",
    "[fe80::1%eth 0]:11211",
    "unix:",
    "unix:relative.sock",
    "unix:./m.sock",
    "unix:/run/m\x00.sock",
    "unix:/run/m\n.sock",
    "./m.sock",
    "run/m.sock",
    "my host:11211",
    "my\thost",
    "ho\x00st:11211",
    "ho\x7fst",
    "a..b:11211",
    ".:11211",
    "a" * 64 + ".example.com",
    ".".join(["a" * 63] * 5),
    "caché.example.com",
    "\u212aelvin.example.com",
    "10.0.0.256",
    "1.2.3",
    "1.2.3.4.5:11211",
    "11211",
    "user@host:11211",
]


@pytest.mark.parametrize(("text", "host", "port", "path", "node_id"), ACCEPTED)
def test_accepted(
    text: str, host: str | None, port: int | None, path: str | None, node_id: str
) -> None:
    address = parse_address(text)
    assert address == Address(host=host, port=port, path=path)
    assert address.node_id == node_id
    assert str(address) == node_id
    assert address.is_unix is (path is not None)


@pytest.mark.parametrize("text", REJECTED)
def test_rejected_with_the_text_in_the_message(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_address(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("host", "host:22122"),
        ("[::1]", "[::1]:22122"),
        ("::1", "[::1]:22122"),
        ("host:11211", "host:11211"),
        ("unix:/run/m.sock", "unix:/run/m.sock"),
    ],
)
def test_default_port(text: str, expected: str) -> None:
    assert parse_address(text, default_port=22122).node_id == expected


@pytest.mark.parametrize("default_port", [0, 65536, -1, True])
def test_bad_default_port(default_port: int) -> None:
    with pytest.raises(ConfigurationError, match="default port"):
        parse_address("host", default_port=default_port)


# -- messages that name the fix ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("memcache://10.0.0.5:11211", "no scheme (memcache://); write '10.0.0.5:11211'"),
        ("memcached://cache.example:11211/", "write 'cache.example:11211'"),
        ("pymemcache://[::1]:11211?x=1", "write '[::1]:11211'"),
        ("tcp://10.0.0.5", "write '10.0.0.5'"),
    ],
)
def test_a_scheme_is_refused_naming_the_address_to_write(text: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_address(text)
    assert fix in str(info.value)
    # What the message says to write is accepted.
    written = str(info.value).rsplit("write ", 1)[1].strip("'")
    assert parse_address(written)


@pytest.mark.parametrize("text", ["run/memcached.sock", "./m.sock", "~/m.sock", "memcached.sock"])
def test_a_relative_socket_path_is_refused_naming_unix_and_absolute(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_address(text)
    message = str(info.value)
    assert "relative unix socket path" in message
    assert "unix:/" in message
    assert "absolute" in message


@pytest.mark.parametrize("text", ["unix:relative.sock", "unix:./m.sock"])
def test_a_relative_unix_path_is_refused_with_an_absolute_example(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"must be absolute, e\.g\. unix:/run/"):
        parse_address(text)


def test_a_host_name_with_a_dot_is_still_a_host() -> None:
    # Only socket-like suffixes are taken for paths: ordinary names keep working.
    assert parse_address("memcached.internal:11211").host == "memcached.internal"


def test_not_a_string() -> None:
    with pytest.raises(ConfigurationError):
        parse_address(b"host:11211")  # type: ignore[arg-type]


def test_address_shape_is_checked() -> None:
    for host, port, path in [
        ("host", None, None),
        (None, 11211, None),
        (None, None, None),
        ("host", 11211, "/run/m.sock"),
        (None, 11211, "/run/m.sock"),
    ]:
        with pytest.raises(ConfigurationError):
            Address(host=host, port=port, path=path)


def test_address_is_frozen_and_hashable() -> None:
    address = parse_address("Host:11211")
    with pytest.raises(dataclasses.FrozenInstanceError):
        address.port = 1  # type: ignore[misc]
    assert {address, parse_address("host:11211")} == {address}


# -- parse_locations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("10.0.0.1:11211", ["10.0.0.1:11211"]),
        ("a:1;b:2,c:3", ["a:1", "b:2", "c:3"]),
        (" a:1 ; ;b:2 , ", ["a:1", "b:2"]),
        ("[::1]:11211;[::2]:11211", ["[::1]:11211", "[::2]:11211"]),
        ("unix:/run/m.sock", ["unix:/run/m.sock"]),
        (["a:1", " B:2 "], ["a:1", " B:2 "]),
        (("a:1", "b:2"), ["a:1", "b:2"]),
    ],
)
def test_parse_locations(location: str | list[str] | tuple[str, ...], expected: list[str]) -> None:
    servers = parse_locations(location)
    assert type(servers) is list
    assert servers == expected


def test_parse_locations_copies_lists() -> None:
    given_list = ["a:1"]
    servers = parse_locations(given_list)
    servers.append("b:2")
    assert given_list == ["a:1"]


@pytest.mark.parametrize("location", ["", " ; , ", [], ()])
def test_a_location_naming_no_server_is_refused_with_an_example(location: Any) -> None:
    with pytest.raises(NoServerError, match=r"no memcached server.*e\.g\. '127\.0\.0\.1:11211'"):
        parse_locations(location)


@pytest.mark.parametrize("location", [["a:1", 2], [b"a:1"]])
def test_parse_locations_rejects_non_strings(location: object) -> None:
    with pytest.raises(ConfigurationError):
        parse_locations(location)  # type: ignore[arg-type]


@pytest.mark.parametrize("location", [b"a:1", {"a:1", "b:1"}, {"a:1": 1}, 11211, iter(["a:1"])])
def test_parse_locations_takes_only_a_string_a_list_or_a_tuple(location: object) -> None:
    # (A set's order, and so the nodes' numbering, would change with the hash seed.)
    with pytest.raises(TypeError, match="a string or a list of strings"):
        parse_locations(location)  # type: ignore[arg-type]


# -- canonical node ids ----------------------------------------------------------------------

_LABEL_CHARS = string.ascii_letters + string.digits + "-_"

labels = st.text(_LABEL_CHARS, min_size=1, max_size=12)
host_names = (
    st.lists(labels, min_size=1, max_size=4)
    .map(".".join)
    # All digits and dots is read as an IPv4 address, not a name.
    .filter(lambda name: not set(name) <= set(string.digits + "."))
)
ports = st.integers(1, 65535)

# (identity the test computes on its own, text to parse); equal identities mean the same
# server however it is written.
Identity = tuple[object, ...]


def _name_spec(name: str, port: int, bare: bool) -> tuple[Identity, str]:
    # Names are case-insensitive; without a port the default one is meant.
    if bare:
        return ("name", name.lower(), 11211), name
    return ("name", name.lower(), port), f"{name}:{port}"


names = st.builds(_name_spec, host_names, ports, st.booleans())
ipv4s = st.builds(lambda ip, port: (("ip", ip, port), f"{ip}:{port}"), st.ip_addresses(v=4), ports)
ipv6s = st.builds(
    lambda ip, port, exploded: (
        ("ip", ip, port),
        f"[{ip.exploded.upper() if exploded else ip}]:{port}",
    ),
    st.ip_addresses(v=6),
    ports,
    st.booleans(),
)
unix_paths = st.builds(
    lambda path: (("unix", path), f"unix:{path}"),
    st.text(string.ascii_letters + string.digits + "/._- ", max_size=30).map(
        lambda rest: "/" + rest.strip()
    ),
)
addresses = st.one_of(names, ipv4s, ipv6s, unix_paths)


@given(addresses)
def test_node_id_parses_back_to_the_same_address(spec: tuple[Identity, str]) -> None:
    address = parse_address(spec[1])
    assert parse_address(address.node_id) == address
    assert parse_address(f"  {address.node_id} ") == address


@given(st.lists(addresses, max_size=12))
def test_node_ids_are_distinct_exactly_for_distinct_servers(
    specs: list[tuple[Identity, str]],
) -> None:
    identities = [identity for identity, _ in specs]
    node_ids = [parse_address(text).node_id for _, text in specs]
    pairs = set(zip(identities, node_ids, strict=True))
    # A bijection: no two servers share a node id, no server gets two.
    assert len(pairs) == len(set(identities)) == len(set(node_ids))


@given(st.ip_addresses(v=6), ports)
def test_ipv6_spellings_share_a_node_id(ip: ipaddress.IPv6Address, port: int) -> None:
    short = parse_address(f"[{ip.compressed}]:{port}")
    long = parse_address(f"[{ip.exploded.upper()}]:{port}")
    assert short == long
    assert short.node_id == f"[{ip}]:{port}"
