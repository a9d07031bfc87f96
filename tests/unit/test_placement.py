"""Placement modes: pinned placement, the hashes they rest on, emcache bit for bit, slots,
and the movement report."""

from __future__ import annotations

import random

import pytest

from django_fastcache.client.address import parse_address
from django_fastcache.client.hashing import Rendezvous
from django_fastcache.client.placement import (
    PLACEMENTS,
    EmcacheRendezvous,
    Ketama,
    make_placement,
    movement,
    murmur3_x64_128,
    one_at_a_time,
)
from django_fastcache.client.placement import _weighted_points as weighted_points
from django_fastcache.errors import ConfigurationError

LOCATIONS = ["10.0.0.1:11211", "10.0.0.2:11212", "cache-c.example.com:11211"]
ADDRESSES = [parse_address(text) for text in LOCATIONS]
KEYS = [b"", b"a", b":1:user:42", b":1:session:abc123", "café".encode(), b"x" * 250, b"lock:report"]

# Owners (index into LOCATIONS) of KEYS. ketama's were checked against pylibmc writing to real
# servers, emcache's against emcache's own code (see the integration tests); any change to
# a mode moves existing deployments' keys, so it must show up here.
GOLDEN = {
    "rendezvous": [0, 2, 1, 0, 1, 1, 1],
    "ketama": [2, 0, 0, 2, 1, 1, 0],
    "ketama_md5": [2, 2, 0, 1, 0, 0, 1],
    "ketama_weighted": [1, 1, 0, 1, 2, 0, 1],
    "emcache": [0, 1, 2, 0, 0, 2, 0],
}


@pytest.mark.parametrize("mode", PLACEMENTS)
def test_golden_placement(mode: str) -> None:
    router = make_placement(mode, ADDRESSES)
    assert [router.node_index(key) for key in KEYS] == GOLDEN[mode]


def test_every_mode_is_pinned() -> None:
    assert set(GOLDEN) == set(PLACEMENTS)


def test_murmur3_reference_vectors() -> None:
    # Published MurmurHash3_x64_128 values, seed 0.
    assert murmur3_x64_128(b"") == bytes(16)
    assert murmur3_x64_128(b"The quick brown fox jumps over the lazy dog").hex() == (
        "6c1b07bc7bbc4be347939ac4a93c437a"
    )


def test_one_at_a_time_reads_bytes_as_signed_char() -> None:
    assert one_at_a_time(b"") == 0
    assert one_at_a_time(b"hello") == 3372029979
    # With unsigned bytes "é" (0xC3 0xA9) would hash differently; libmemcached's char is
    # signed, and keys written by pylibmc with non-ASCII names are found only this way.
    assert one_at_a_time("é".encode()) == 26298542


def test_weighted_points_follow_libmemcacheds_float_arithmetic() -> None:
    # Equal weights give 160 points per server, except where single-precision rounding
    # leaves the product just under 40 (25 servers: 156).
    assert weighted_points(3) == 160
    assert weighted_points(25) == 156
    assert {n for n in range(1, 41) if weighted_points(n) != 160} == {25}


def test_emcache_matches_emcache_itself() -> None:
    cyemcache = pytest.importorskip("emcache._cython.cyemcache")
    locations = [*LOCATIONS, "[::1]:11300", "unix:/run/memcached.sock"]
    addresses = [parse_address(text) for text in locations]
    nodes = [
        cyemcache.RendezvousNode(a.path if a.path is not None else f"{a.host}{a.port}", index)
        for index, a in enumerate(addresses)
    ]
    rng = random.Random(11)
    for _ in range(5000):
        key = bytes(rng.randrange(33, 256) for _ in range(rng.randrange(1, 80)))
        for count in (2, 3, 5):
            router = EmcacheRendezvous(addresses[:count])
            assert router.node_index(key) == cyemcache.node_selection(key, nodes[:count])


def test_emcache_scores_have_640_values() -> None:
    from django_fastcache.client.placement import emcache_score

    assert len({emcache_score(b"%d" % n) for n in range(50_000)}) == 640


@pytest.mark.parametrize("mode", PLACEMENTS)
def test_slots_are_answered_instead_of_positions(mode: str) -> None:
    plain = make_placement(mode, ADDRESSES)
    slotted = make_placement(mode, ADDRESSES, slots=[7, 3, 12])
    assert [slotted.node_index(k) for k in KEYS] == [[7, 3, 12][plain.node_index(k)] for k in KEYS]
    assert slotted.group(KEYS) == {
        [7, 3, 12][index]: keys for index, keys in plain.group(KEYS).items()
    }
    single = make_placement(mode, ADDRESSES[:1], slots=[5])
    assert {single.node_index(k) for k in KEYS} == {5}


def test_ketama_variants_and_errors() -> None:
    with pytest.raises(ConfigurationError, match="unknown ketama variant"):
        Ketama(ADDRESSES, "ketama_sha1")
    with pytest.raises(ConfigurationError, match="unknown placement"):
        make_placement("consistent", ADDRESSES)
    with pytest.raises(ConfigurationError, match="duplicate"):
        Ketama([ADDRESSES[0], ADDRESSES[0]])
    with pytest.raises(ConfigurationError, match="one slot per node"):
        Rendezvous(LOCATIONS, slots=[1])


def test_ketama_names_servers_as_libmemcached_does() -> None:
    # The default port is left out of the point names: "host-N", not "host:11211-N".
    on_default = Ketama([parse_address("10.0.0.9:11211"), parse_address("10.0.0.8:11211")])
    on_other = Ketama([parse_address("10.0.0.9:11212"), parse_address("10.0.0.8:11212")])
    owners = [(on_default.node_index(k), on_other.node_index(k)) for k in KEYS * 3]
    assert any(a != b for a, b in owners)


@pytest.mark.parametrize("mode", PLACEMENTS)
def test_movement_adding_a_node_moves_about_its_share(mode: str) -> None:
    grown = [*LOCATIONS, "10.0.0.4:11211"]
    report = movement(LOCATIONS, grown, mode)
    assert report.keys == 20_000
    # Each of these modes is consistent: only the new node's share moves, all of it to it.
    assert 0.2 < report.fraction < 0.3
    assert set(report.moved_to) == {"10.0.0.4:11211"}
    assert sum(report.moved_from.values()) == report.moved


@pytest.mark.parametrize("mode", PLACEMENTS)
def test_movement_removing_a_node_moves_only_its_keys(mode: str) -> None:
    keys = [b"k:%d" % n for n in range(3000)]
    report = movement(LOCATIONS, LOCATIONS[:2], mode, keys)
    router = make_placement(mode, ADDRESSES)
    on_removed = sum(router.node_index(k) == 2 for k in keys)
    assert report.moved == on_removed
    assert set(report.moved_from) == {LOCATIONS[2]}


def test_movement_of_no_change_is_zero() -> None:
    assert movement(LOCATIONS, list(reversed(LOCATIONS))).moved == 0
