"""Rendezvous hashing: pinned placement, spread, minimal movement, and the small API."""

from __future__ import annotations

import math
from collections import Counter
from hashlib import blake2b

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_fastcache.client import hashing
from django_fastcache.client.hashing import Rendezvous, node_key, score
from django_fastcache.errors import ConfigurationError

THREE = ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"]
FIVE = [
    "cache-a.example.com:11211",
    "[2001:db8::1]:11211",
    "unix:/run/memcached/m.sock",
    "10.0.0.4:11212",
    "[::1]:11211",
]

A, B, C = THREE
NAME, V6, SOCK, V4, LOOP = FIVE

# key -> (owner among THREE, owner among FIVE). Computed once; any change to the scoring
# changes where existing deployments put their keys, so it must show up here.
GOLDEN: list[tuple[bytes, str, str]] = [
    (b"", A, V6),
    (b"a", B, V6),
    (b"b", B, LOOP),
    (b"key", B, LOOP),
    (b":1:user:42", A, LOOP),
    (b":1:session:abc123", A, SOCK),
    (b":1:views.decorators.cache.cache_page.f00d", C, V4),
    (b"template.cache.sidebar.d41d8cd98f00b204e9800998ecf8427e", A, V6),
    (b"\x00\x01\x02\xff", A, NAME),
    ("café".encode(), B, V6),
    (b"x" * 250, B, V4),
    (b"10.0.0.1:11211", C, V4),
    (b"counter", C, V6),
    (b"lock:report", B, NAME),
    (b":2:user:42", C, LOOP),
    (b"user:1", C, V4),
    (b"user:2", C, V4),
    (b"user:3", A, LOOP),
    (b"user:4", B, V4),
    (b"user:5", C, V6),
    (b"user:6", B, V6),
    (b"user:7", C, V4),
    (b"user:8", A, V4),
    (b"user:9", A, LOOP),
]

# A few raw scores, so the score function itself is pinned and not only who wins.
GOLDEN_SCORES: list[tuple[str, bytes, int]] = [
    ("10.0.0.1:11211", b"", 0xE9DF738D992ED3E8),
    ("10.0.0.1:11211", b"key", 0x335203E9EAA20229),
    ("unix:/run/memcached/m.sock", b":1:user:42", 0x5BE6EA80F04C114D),
]


# -- a plain re-implementation of the documented algorithm --------------------------------


def reference_score(node_id: str, key: bytes) -> int:
    derived = blake2b(node_id.encode("utf-8"), digest_size=32, person=b"fastcache-node")
    scored = blake2b(key, digest_size=8, key=derived.digest())
    return int.from_bytes(scored.digest(), "big")


def reference_owner(node_ids: list[str], key: bytes) -> str:
    scores = {node_id: reference_score(node_id, key) for node_id in node_ids}
    best = max(scores.values())
    # Highest score wins; equal scores go to the smaller node id.
    return min(node_id for node_id, value in scores.items() if value == best)


def owners(router: Rendezvous, keys: list[bytes]) -> list[str]:
    return [router.node_ids[router.node_index(key)] for key in keys]


KEYS = [b"k:%d" % number for number in range(3000)]

node_ids_strategy = st.text(min_size=1, max_size=24)


# -- golden vectors --------------------------------------------------------------------------


def test_golden_vectors_cover_every_node() -> None:
    # Otherwise a node that never wins could be mis-scored without a vector noticing.
    assert {three for _, three, _ in GOLDEN} == set(THREE)
    assert {five for _, _, five in GOLDEN} == set(FIVE)


@pytest.mark.parametrize(("key", "on_three", "on_five"), GOLDEN)
def test_golden_placement(key: bytes, on_three: str, on_five: str) -> None:
    assert THREE[Rendezvous(THREE).node_index(key)] == on_three
    assert FIVE[Rendezvous(FIVE).node_index(key)] == on_five


@pytest.mark.parametrize(("key", "on_three", "on_five"), GOLDEN)
def test_golden_placement_follows_the_documented_algorithm(
    key: bytes, on_three: str, on_five: str
) -> None:
    assert reference_owner(THREE, key) == on_three
    assert reference_owner(FIVE, key) == on_five


@pytest.mark.parametrize(("node_id", "key", "expected"), GOLDEN_SCORES)
def test_golden_scores(node_id: str, key: bytes, expected: int) -> None:
    assert score(node_id, key) == expected
    assert reference_score(node_id, key) == expected


def test_ranked_follows_reference_scores() -> None:
    router = Rendezvous(FIVE)
    for key, _, _ in GOLDEN:
        expected = sorted(FIVE, key=lambda node_id: reference_score(node_id, key), reverse=True)
        assert [FIVE[index] for index in router.ranked(key)] == expected


def test_node_key_is_domain_separated() -> None:
    # An unpersonalised hash of the id would let a key equal to a node id hash like the id.
    plain = blake2b(b"10.0.0.1:11211", digest_size=32).digest()
    assert node_key("10.0.0.1:11211") != plain
    assert len(node_key("10.0.0.1:11211")) == 32


def test_long_and_unusual_node_ids_are_scored() -> None:
    # Longer than a BLAKE2b key may be, and with a lone surrogate that strict UTF-8 refuses.
    long_id = "unix:/" + "d" * 300 + ".sock"
    odd_id = "node-\udc80"
    router = Rendezvous([long_id, odd_id])
    placed = Counter(router.node_ids[router.node_index(key)] for key in KEYS[:200])
    assert set(placed) == {long_id, odd_id}
    assert node_key(long_id) != node_key("unix:/" + "d" * 299 + ".sock")


# -- distribution ----------------------------------------------------------------------------


def test_distribution_over_five_nodes() -> None:
    router = Rendezvous(FIVE)
    keys = [b":1:item:%d" % number for number in range(20_000)]
    counts = Counter(router.node_index(key) for key in keys)
    mean = len(keys) / len(FIVE)
    assert set(counts) == set(range(len(FIVE)))
    for index in range(len(FIVE)):
        assert abs(counts[index] - mean) <= 0.10 * mean, counts
    # Chi-square with 4 degrees of freedom: 18.47 is the 0.1% critical value.
    chi_square = sum((counts[index] - mean) ** 2 / mean for index in range(len(FIVE)))
    assert chi_square < 18.47, counts


def test_fallback_choice_is_spread_too() -> None:
    # When the owner is out, its keys must spread over the others, not pile onto one.
    router = Rendezvous(FIVE)
    seconds = Counter(router.ranked(b"fallback:%d" % number)[1] for number in range(10_000))
    mean = 10_000 / len(FIVE)
    for index in range(len(FIVE)):
        assert abs(seconds[index] - mean) <= 0.10 * mean, seconds


# -- movement when nodes come and go ---------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(node_ids_strategy, min_size=2, max_size=10, unique=True),
    st.data(),
)
def test_removing_a_node_moves_only_its_keys(node_ids: list[str], data: st.DataObject) -> None:
    removed = data.draw(st.sampled_from(node_ids), label="removed")
    before = Rendezvous(node_ids)
    remaining = [node_id for node_id in node_ids if node_id != removed]
    after = Rendezvous(remaining)

    old = owners(before, KEYS)
    new = owners(after, KEYS)
    moved = {key for key, was, now in zip(KEYS, old, new, strict=True) if was != now}
    on_removed = {key for key, was in zip(KEYS, old, strict=True) if was == removed}
    assert moved == on_removed
    # Each key of the removed node goes to what was its second choice.
    for key in on_removed:
        second = node_ids[before.ranked(key)[1]]
        assert remaining[after.node_index(key)] == second


@settings(max_examples=40, deadline=None)
@given(st.lists(node_ids_strategy, min_size=3, max_size=11, unique=True), st.data())
def test_adding_a_node_moves_only_keys_onto_it(ids: list[str], data: st.DataObject) -> None:
    node_ids, added = ids[:-1], ids[-1]
    position = data.draw(st.integers(0, len(node_ids)), label="position")
    grown = [*node_ids[:position], added, *node_ids[position:]]

    old = owners(Rendezvous(node_ids), KEYS)
    new = owners(Rendezvous(grown), KEYS)
    moved = [now for was, now in zip(old, new, strict=True) if was != now]
    assert set(moved) <= {added}
    assert new.count(added) == len(moved)

    # About 1/(n+1) of the keys move; six standard deviations of a binomial count.
    share = 1 / len(grown)
    expected = len(KEYS) * share
    tolerance = 6 * math.sqrt(len(KEYS) * share * (1 - share))
    assert abs(len(moved) - expected) <= tolerance, (len(moved), expected)


@settings(max_examples=40, deadline=None)
@given(st.lists(node_ids_strategy, min_size=1, max_size=10, unique=True), st.data())
def test_placement_does_not_depend_on_node_order(node_ids: list[str], data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(node_ids), label="shuffled")
    keys = KEYS[:300]
    assert owners(Rendezvous(node_ids), keys) == owners(Rendezvous(shuffled), keys)
    first, second = Rendezvous(node_ids), Rendezvous(shuffled)
    for key in keys[:50]:
        assert [node_ids[i] for i in first.ranked(key)] == [shuffled[i] for i in second.ranked(key)]


# -- ties ------------------------------------------------------------------------------------


class _ConstantBlake2b:
    """Stands in for hashlib.blake2b so that every node scores every key the same."""

    def __init__(self, data: bytes = b"", *, digest_size: int = 64, **options: object) -> None:
        self.size = digest_size

    def copy(self) -> _ConstantBlake2b:
        return self

    def update(self, data: bytes) -> None:
        pass

    def digest(self) -> bytes:
        return b"\x07" * self.size


def test_equal_scores_go_to_the_smallest_node_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "blake2b", _ConstantBlake2b)
    node_ids = ["b:1", "c:1", "a:1", "d:1"]
    router = Rendezvous(node_ids)
    assert router.node_index(b"anything") == 2
    assert [node_ids[index] for index in router.ranked(b"anything")] == sorted(node_ids)
    assert Rendezvous(list(reversed(node_ids))).node_index(b"anything") == 1


# -- the API ---------------------------------------------------------------------------------


class _NoHashing:
    """A blake2b whose per-key hashers must never be used."""

    def __init__(self, data: bytes = b"", **options: object) -> None:
        pass

    def copy(self) -> _NoHashing:
        raise AssertionError("a single node must not hash keys")

    def digest(self) -> bytes:
        return b"\x00" * 32


def test_single_node_does_not_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "blake2b", _NoHashing)
    router = Rendezvous(["10.0.0.1:11211"])
    assert router.node_index(b"key") == 0
    assert router.ranked(b"key") == [0]
    assert router.group([b"b", b"a", b"b"]) == {0: [b"b", b"a", b"b"]}
    assert router.group([]) == {}


def test_two_nodes_do_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    # The counterpart of the test above: it only means something if hashing would trip it.
    monkeypatch.setattr(hashing, "blake2b", _NoHashing)
    router = Rendezvous(["10.0.0.1:11211", "10.0.0.2:11211"])
    with pytest.raises(AssertionError):
        router.node_index(b"key")


@pytest.mark.parametrize(
    "node_ids",
    [
        ["10.0.0.1:11211", "10.0.0.1:11211"],
        ["a", "b", "c", "b"],
    ],
)
def test_duplicate_node_ids_are_rejected(node_ids: list[str]) -> None:
    with pytest.raises(ConfigurationError, match="duplicate"):
        Rendezvous(node_ids)


@pytest.mark.parametrize(
    "node_ids",
    [[], (), "10.0.0.1:11211", [""], ["a", 1], [b"a"]],
)
def test_bad_node_lists_are_rejected(node_ids: object) -> None:
    with pytest.raises(ConfigurationError):
        Rendezvous(node_ids)  # type: ignore[arg-type]


def test_node_ids_are_kept_in_the_given_order() -> None:
    router = Rendezvous(tuple(FIVE))
    assert router.node_ids == tuple(FIVE)
    assert len(router) == 5
    assert repr(router) == f"Rendezvous({FIVE!r})"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(node_ids_strategy, min_size=1, max_size=10, unique=True),
    st.lists(st.binary(max_size=40), max_size=60),
)
def test_group_partitions_keys_in_order(node_ids: list[str], keys: list[bytes]) -> None:
    router = Rendezvous(node_ids)
    groups = router.group(iter(keys))
    assert all(groups.values())
    assert sorted(key for bucket in groups.values() for key in bucket) == sorted(keys)
    for index, bucket in groups.items():
        assert bucket == [key for key in keys if router.node_index(key) == index]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(node_ids_strategy, min_size=1, max_size=10, unique=True),
    st.binary(max_size=250),
)
def test_ranked_is_a_permutation_led_by_the_owner(node_ids: list[str], key: bytes) -> None:
    router = Rendezvous(node_ids)
    ranked = router.ranked(key)
    assert sorted(ranked) == list(range(len(node_ids)))
    assert ranked[0] == router.node_index(key)
