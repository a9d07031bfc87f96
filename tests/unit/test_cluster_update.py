"""A cluster's node list changing under it: slots, routing, listeners and the log."""

from __future__ import annotations

import logging

import pytest

from django_fastcache.client.address import parse_address
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.placement import make_placement
from django_fastcache.errors import ConfigurationError, InvalidArgumentError

A, B, C, D = (parse_address(f"10.0.0.{n}:11211") for n in (1, 2, 3, 4))
KEYS = [b"key:%d" % n for n in range(300)]


def dynamic(placement: str = "rendezvous") -> Cluster:
    settings = ClientSettings(placement=placement, autodiscovery=True)
    return Cluster(["cfg.example.com:11211"], settings)


def test_a_dynamic_cluster_starts_empty_and_does_no_io() -> None:
    cluster = dynamic()
    assert cluster.live == ()
    assert cluster.addresses == ()
    assert cluster.endpoints == (parse_address("cfg.example.com:11211"),)
    assert not cluster.discovery.running


@pytest.mark.parametrize("placement", ["rendezvous", "ketama", "emcache"])
def test_slots_are_kept_and_routing_follows(placement: str) -> None:
    cluster = dynamic(placement)
    assert cluster.update([A, B, C]) is True
    assert cluster.live == (0, 1, 2)
    assert cluster.update([B, C, D]) is True  # A leaves, D joins
    assert cluster.live == (1, 2, 3)
    assert cluster.node_ids == tuple(a.node_id for a in (A, B, C, D))
    expected = make_placement(placement, [B, C, D], [1, 2, 3])
    assert [cluster.node_index(k) for k in KEYS] == [expected.node_index(k) for k in KEYS]
    assert cluster.group(KEYS) == expected.group(KEYS)
    assert cluster.update([A, C]) is True  # A comes back under its old slot
    assert cluster.live == (0, 2)
    assert len(cluster) == 4
    assert {cluster.node_index(k) for k in KEYS} == {0, 2}


def test_one_node_left_takes_every_key() -> None:
    cluster = dynamic()
    cluster.update([A, B])
    cluster.update([B])
    assert cluster.single_node
    assert {cluster.node_index(k) for k in KEYS} == {1}
    assert cluster.group(KEYS) == {1: KEYS}
    cluster.update([B, C])
    assert not cluster.single_node
    assert {cluster.node_index(k) for k in KEYS} == {1, 2}


def test_nothing_changed_and_duplicates() -> None:
    cluster = dynamic()
    assert cluster.update([A, B, A]) is True
    assert cluster.live == (0, 1)
    assert cluster.update([A, B]) is False
    with pytest.raises(ConfigurationError):
        cluster.update([])


def test_listeners_see_the_new_slots_before_routing_and_the_old_after() -> None:
    cluster = dynamic()
    cluster.update([A, B])
    seen: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    def added(slots: tuple[int, ...]) -> None:
        # Addresses exist for the new slots, but no key is routed to them yet.
        assert len(cluster.addresses) > max(slots)
        seen.append(("added", slots, tuple(sorted({cluster.node_index(k) for k in KEYS}))))

    def removed(slots: tuple[int, ...]) -> None:
        seen.append(("removed", slots, tuple(sorted({cluster.node_index(k) for k in KEYS}))))

    cluster.add_listener(added, removed)
    cluster.update([B, C])
    assert seen == [("added", (2,), (0, 1)), ("removed", (0,), (1, 2))]


def test_a_change_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    cluster = dynamic()
    cluster.update([A, B])
    with caplog.at_level(logging.INFO, logger="django_fastcache"):
        cluster.update([B, C], reason="configuration version 7")
    assert (
        "memcached node list changed (configuration version 7): 10.0.0.2:11211, "
        "10.0.0.3:11211 (added 10.0.0.3:11211, removed 10.0.0.1:11211)"
    ) in caplog.text


def test_bad_settings() -> None:
    with pytest.raises(InvalidArgumentError, match="placement must be one of"):
        ClientSettings(placement="modula")
    with pytest.raises(InvalidArgumentError, match="autodiscovery_interval"):
        ClientSettings(autodiscovery_interval=0)


def test_a_fixed_cluster_is_unchanged() -> None:
    cluster = Cluster([A.node_id, B.node_id], ClientSettings())
    assert cluster.live == (0, 1)
    assert cluster.live_nodes() == (0, 1)
    assert cluster.discovery is None
    assert not cluster.dynamic
