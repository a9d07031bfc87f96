"""FastCache OPTIONS: defaults, each option's validation and error id, LOCATION parsing."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import ssl
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_fastcache.backends import FastCache
from django_fastcache.backends.options import (
    OPTION_NAMES,
    FastCacheOptions,
    OptionProblem,
    parse_options,
)
from django_fastcache.client.security import TLSOptions

# Nothing listens here and nothing may try: building the backend does no I/O.
NOWHERE = "127.0.0.1:9"


def ids(problems: list[OptionProblem]) -> list[str]:
    return [problem.id for problem in problems]


def only_problem(raw: Any) -> OptionProblem:
    _options, problems = parse_options(raw)
    assert len(problems) == 1, problems
    return problems[0]


# -- defaults and good values ------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, {}])
def test_no_options_gives_the_defaults(raw: Any) -> None:
    options, problems = parse_options(raw)
    assert problems == []
    assert options == FastCacheOptions()


def test_option_names_are_the_dataclass_fields() -> None:
    assert {f.name for f in dataclasses.fields(FastCacheOptions)} == OPTION_NAMES
    assert "serializer" in OPTION_NAMES
    assert "hash_invalid_keys" in OPTION_NAMES


GOOD_VALUES: dict[str, list[Any]] = {
    "operation_timeout": [0.001, 2, 2.5],
    "connect_timeout": [0.25, 3],
    "idle_timeout": [1, 600.0],
    "min_connections": [1, 2],
    "max_connections": [4, 64],
    "max_value_size": [1, 8 * 1024 * 1024],
    "serializer": ["pickle", "json"],
    "pickle_protocol": list(range(pickle.HIGHEST_PROTOCOL + 1)),
    "compress_min_length": [None, 1, 4096],
    "compress_level": list(range(1, 10)),
    "hash_invalid_keys": [True, False],
    "sign_values": [True, False],
    "latency_metrics": [True, False],
    "signing_key": [None, "a secret of its own"],
    "disk_tier": [True, False],
    "disk_directory": [None, "/var/cache/site", "/srv/cache/site"],
    "disk_shards": [1, 8, 64],
    "disk_size_limit": [1, 10 * 1024**3],
    "disk_eviction_policy": [
        "least-recently-stored",
        "least-recently-used",
        "least-frequently-used",
        "none",
    ],
    "disk_timeout": [0.001, 1, 2.5],
    "disk_max_staleness": [0.5, 300, 86400.0],
    "disk_read_copies": [0, 1, 64 * 1024**2],
    "disk_write_delay": [0.001, 1, 3.0, 299.5],
    "placement": ["rendezvous", "ketama", "ketama_md5", "ketama_weighted", "emcache"],
    # True only with the disk tier off: tests/unit/test_placement_command.py.
    "autodiscovery": [False],
    "autodiscovery_interval": [0.5, 60, 300.0],
    "autobatching": [True, False],
    "pipelining": [True, False],
    "protocol": ["auto", "meta", "classic"],
    "stampede_protection": [True, False],
    "stampede_lease": [0.5, 10, 60.0],
    "stampede_wait": [0.1, 15, 120.0],
    "stale_while_revalidate": [0, 0.5, 30],
    # (positive: with disk_tier False only, see test_stampede_options.py)
    "stale_on_delete": [0, 0.0],
    # The dict and True forms become TLSOptions: tests/unit/test_security.py.
    "ssl": [None, TLSOptions(ca_file="/etc/ssl/memcached-ca.pem"), ssl.create_default_context()],
    # Only together: tests/unit/test_security.py.
    "username": [None],
    "password": [None],
}


def test_every_option_has_good_values_listed() -> None:
    assert set(GOOD_VALUES) == OPTION_NAMES


@pytest.mark.parametrize(
    ("name", "value"), [(name, value) for name, values in GOOD_VALUES.items() for value in values]
)
def test_good_values_are_taken(name: str, value: Any) -> None:
    options, problems = parse_options({name: value})
    assert problems == []
    assert getattr(options, name) == value
    assert type(getattr(options, name)) is type(value)


def test_several_good_options_together() -> None:
    raw = {
        "operation_timeout": 0.5,
        "min_connections": 2,
        "max_connections": 2,
        "serializer": "json",
        "compress_min_length": 100,
        "compress_level": 9,
        "hash_invalid_keys": True,
    }
    options, problems = parse_options(raw)
    assert problems == []
    assert dataclasses.asdict(options) == {**dataclasses.asdict(FastCacheOptions()), **raw}


def test_parse_options_does_not_change_its_argument() -> None:
    raw = {"bogus": 1, "min_connections": 0, "serializer": "yaml"}
    copy = dict(raw)
    parse_options(raw)
    assert raw == copy


# -- bad values, one id per kind of problem ------------------------------------------------


def test_unknown_option_is_e001_with_hint() -> None:
    problem = only_problem({"operation_timout": 1})
    assert problem.id == "django_fastcache.E001"
    assert "'operation_timout'" in problem.message
    assert problem.hint


@pytest.mark.parametrize(
    ("name", "nearest"),
    [
        ("operation_timout", "operation_timeout"),
        ("max_connection", "max_connections"),
        ("Serializer", "serializer"),
        ("disk_teir", "disk_tier"),
        ("compress_min_len", "compress_min_length"),
        # Other backends' names for the same idea.
        ("timeout", "operation_timeout"),
        ("socket_timeout", "operation_timeout"),
        ("pool_size", "max_connections"),
    ],
)
def test_unknown_option_names_the_nearest_known_one(name: str, nearest: str) -> None:
    problem = only_problem({name: 1})
    assert problem.id == "django_fastcache.E001"
    assert f"did you mean {nearest!r}?" in problem.message
    assert nearest in OPTION_NAMES


def test_unknown_option_far_from_every_name_lists_the_known_ones() -> None:
    problem = only_problem({"behaviors": {}})
    assert "did you mean" not in problem.message
    assert problem.hint is not None
    for name in OPTION_NAMES:
        assert name in problem.hint


@pytest.mark.parametrize("name", ["TIMEOUT", "KEY_PREFIX", "VERSION"])
def test_a_cache_setting_inside_options_says_where_it_belongs(name: str) -> None:
    problem = only_problem({name: 1})
    assert problem.id == "django_fastcache.E001"
    assert "put it beside OPTIONS" in problem.message


def test_backend_error_carries_the_suggestion() -> None:
    cache = FastCache(NOWHERE, {"OPTIONS": {"max_connection": 2}})
    with pytest.raises(ImproperlyConfigured, match="did you mean 'max_connections'"):
        cache.get("k")


def test_each_unknown_option_is_reported_and_the_known_ones_kept() -> None:
    options, problems = parse_options({"b_bogus": 1, "a_bogus": 2, "compress_level": 3})
    assert ids(problems) == ["django_fastcache.E001"] * 2
    assert "'a_bogus'" in problems[0].message
    assert "'b_bogus'" in problems[1].message
    assert options.compress_level == 3


def test_unknown_keys_of_mixed_types_are_reported() -> None:
    _options, problems = parse_options({1: "x", "bogus": 2})
    assert ids(problems) == ["django_fastcache.E001"] * 2


@pytest.mark.parametrize(
    "name",
    [
        "operation_timeout",
        "connect_timeout",
        "idle_timeout",
        "disk_timeout",
        "disk_max_staleness",
        "disk_write_delay",
    ],
)
@pytest.mark.parametrize("value", [0, -1, -0.5, "1", None, True, float("nan"), float("inf"), [1]])
def test_timeouts_must_be_positive_finite_numbers_e002(name: str, value: Any) -> None:
    options, problems = parse_options({name: value})
    assert ids(problems) == ["django_fastcache.E002"]
    assert name in problems[0].message
    # The bad value is dropped: the default stands in for it.
    assert getattr(options, name) == getattr(FastCacheOptions(), name)


@pytest.mark.parametrize(
    "name",
    [
        "min_connections",
        "max_connections",
        "max_value_size",
        "compress_min_length",
        "disk_shards",
        "disk_size_limit",
    ],
)
@pytest.mark.parametrize("value", [0, -3, 1.5, 2.0, "2", True, [2]])
def test_counts_must_be_positive_integers_e003(name: str, value: Any) -> None:
    options, problems = parse_options({name: value})
    assert ids(problems) == ["django_fastcache.E003"]
    assert name in problems[0].message
    assert getattr(options, name) == getattr(FastCacheOptions(), name)


@pytest.mark.parametrize(
    ("delay", "staleness"), [(300, None), (300.0, None), (5, 5), (6.5, 6), (1, 0.5)]
)
def test_disk_write_delay_must_be_below_disk_max_staleness_e053(
    delay: float, staleness: float | None
) -> None:
    given: dict[str, Any] = {"disk_write_delay": delay}
    if staleness is not None:
        given["disk_max_staleness"] = staleness
    options, problems = parse_options(given)
    assert ids(problems) == ["django_fastcache.E053"]
    assert "disk_write_delay" in problems[0].message
    assert "disk_max_staleness" in (problems[0].hint or "")
    assert options.disk_write_delay == FastCacheOptions().disk_write_delay


def test_disk_write_delay_just_below_disk_max_staleness_stands() -> None:
    options, problems = parse_options({"disk_write_delay": 5.5, "disk_max_staleness": 6})
    assert problems == []
    assert options.disk_write_delay == 5.5


def test_disk_write_delay_default_is_the_writers() -> None:
    from django_fastcache.disk.writebehind import MIN_AGE

    assert FastCacheOptions().disk_write_delay == MIN_AGE


@pytest.mark.parametrize("value", [-1, 1.5, 4.0, "4096", True, None])
def test_disk_read_copies_must_be_a_number_of_bytes_e020(value: Any) -> None:
    options, problems = parse_options({"disk_read_copies": value})
    assert ids(problems) == ["django_fastcache.E020"]
    assert "disk_read_copies" in problems[0].message
    assert options.disk_read_copies == FastCacheOptions().disk_read_copies


@pytest.mark.parametrize("value", [1, 0, "yes", "True", None])
def test_hash_invalid_keys_must_be_a_bool_e004(value: Any) -> None:
    options, problems = parse_options({"hash_invalid_keys": value})
    assert ids(problems) == ["django_fastcache.E004"]
    assert "hash_invalid_keys" in problems[0].message
    assert options.hash_invalid_keys is False


@pytest.mark.parametrize("value", [1, 0, "yes", "False", None])
def test_disk_tier_must_be_a_bool_e004(value: Any) -> None:
    options, problems = parse_options({"disk_tier": value})
    assert ids(problems) == ["django_fastcache.E004"]
    assert "disk_tier" in problems[0].message
    assert options.disk_tier is True


@pytest.mark.parametrize("value", [1, 0, "no", None])
def test_sign_values_must_be_a_bool_e004(value: Any) -> None:
    options, problems = parse_options({"sign_values": value})
    assert ids(problems) == ["django_fastcache.E004"]
    assert "sign_values" in problems[0].message
    assert options.sign_values is True


@pytest.mark.parametrize("name", ["autobatching", "pipelining"])
@pytest.mark.parametrize("value", [1, 0, "yes", "False", None])
def test_async_request_sharing_switches_must_be_bools_e004(name: str, value: Any) -> None:
    options, problems = parse_options({name: value})
    assert ids(problems) == ["django_fastcache.E004"]
    assert name in problems[0].message
    assert getattr(options, name) is True


@pytest.mark.parametrize("value", ["", b"secret", 42, ["secret"]])
def test_signing_key_must_be_a_non_empty_string_e015(value: Any) -> None:
    options, problems = parse_options({"signing_key": value})
    assert ids(problems) == ["django_fastcache.E015"]
    assert options.signing_key is None


@pytest.mark.parametrize("value", ["lru", "LEAST-RECENTLY-USED", "", None, 1, ["none"]])
def test_disk_eviction_policy_must_be_a_known_name_e010(value: Any) -> None:
    options, problems = parse_options({"disk_eviction_policy": value})
    assert ids(problems) == ["django_fastcache.E010"]
    assert "least-recently-stored" in problems[0].message
    assert options.disk_eviction_policy == "least-recently-stored"


@pytest.mark.parametrize(
    "value",
    [1, b"/var/cache", ["/var/cache"], True, "cache", "./cache", Path("cache"), "~/cache", ""],
)
def test_disk_directory_must_be_an_absolute_path_e013(value: Any) -> None:
    # A relative directory would be each process's working directory's: processes started
    # from different ones would keep disk tiers of their own.
    options, problems = parse_options({"disk_directory": value})
    assert ids(problems) == ["django_fastcache.E013"]
    assert "absolute path" in problems[0].message
    assert options.disk_directory is None


@pytest.mark.parametrize("value", ["/var/cache/site", Path("/var/cache/site")])
def test_disk_directory_may_be_a_path_object_and_is_kept_as_a_string(value: Any) -> None:
    options, problems = parse_options({"disk_directory": value})
    assert problems == []
    assert options.disk_directory == "/var/cache/site"
    assert hash(options) == hash(parse_options({"disk_directory": "/var/cache/site"})[0])


@pytest.mark.parametrize(
    "raw", [{"min_connections": 5}, {"min_connections": 3, "max_connections": 2}]
)
def test_min_connections_above_max_is_e005(raw: dict[str, int]) -> None:
    options, problems = parse_options(raw)
    assert ids(problems) == ["django_fastcache.E005"]
    assert options.min_connections <= options.max_connections


def test_min_equal_to_max_is_fine() -> None:
    options, problems = parse_options({"min_connections": 3, "max_connections": 3})
    assert problems == []
    assert (options.min_connections, options.max_connections) == (3, 3)


@pytest.mark.parametrize("value", ["yaml", "Pickle", "", None, 1, ["pickle"], {"json": 1}])
def test_serializer_must_be_a_known_name_e006(value: Any) -> None:
    options, problems = parse_options({"serializer": value})
    assert ids(problems) == ["django_fastcache.E006"]
    assert "'pickle'" in problems[0].message
    assert "'json'" in problems[0].message
    assert options.serializer == "pickle"


@pytest.mark.parametrize("value", [-1, pickle.HIGHEST_PROTOCOL + 1, "5", 4.0, True, None])
def test_pickle_protocol_must_be_in_range_e007(value: Any) -> None:
    options, problems = parse_options({"pickle_protocol": value})
    assert ids(problems) == ["django_fastcache.E007"]
    assert str(pickle.HIGHEST_PROTOCOL) in problems[0].message
    assert options.pickle_protocol == pickle.HIGHEST_PROTOCOL


@pytest.mark.parametrize("value", [0, 10, -1, "6", 6.0, True, None])
def test_compress_level_must_be_1_to_9_e008(value: Any) -> None:
    options, problems = parse_options({"compress_level": value})
    assert ids(problems) == ["django_fastcache.E008"]
    assert options.compress_level == 6


@pytest.mark.parametrize("raw", ["operation_timeout=1", ["serializer"], 3, ("a", "b")])
def test_options_that_are_not_a_mapping_are_e009(raw: Any) -> None:
    options, problems = parse_options(raw)
    assert ids(problems) == ["django_fastcache.E009"]
    assert type(raw).__name__ in problems[0].message
    assert options == FastCacheOptions()


def test_every_problem_is_reported_at_once() -> None:
    raw = {
        "bogus": 1,
        "operation_timeout": 0,
        "max_connections": -1,
        "hash_invalid_keys": "no",
        "serializer": "xml",
        "pickle_protocol": 99,
        "compress_level": 0,
    }
    _options, problems = parse_options(raw)
    assert sorted(ids(problems)) == [
        "django_fastcache.E001",
        "django_fastcache.E002",
        "django_fastcache.E003",
        "django_fastcache.E004",
        "django_fastcache.E006",
        "django_fastcache.E007",
        "django_fastcache.E008",
    ]


# -- the backend refuses bad OPTIONS on first use ------------------------------------------
# Not at construction: Django's own cache checks build every alias, and an exception there
# would hide FastCache's check, which reports each problem with its id.

BAD_OPTIONS: list[Any] = [
    {"bogus": 1},
    {"operation_timeout": -1},
    {"min_connections": 9},
    {"serializer": "marshal"},
    {"compress_level": 11},
    {"disk_eviction_policy": "lru"},
    {"disk_directory": 7},
]


@pytest.mark.parametrize("raw", BAD_OPTIONS)
def test_backend_with_bad_options_raises_improperly_configured_on_use(raw: Any) -> None:
    _options, problems = parse_options(raw)
    assert problems
    cache = FastCache(NOWHERE, {"OPTIONS": raw})  # builds, as Django's checks need
    for use in (lambda: cache.get("k"), lambda: cache.set("k", 1), lambda: cache.client):
        with pytest.raises(ImproperlyConfigured) as caught:
            use()
        for problem in problems:
            assert problem.message in str(caught.value)


@pytest.mark.parametrize("raw", BAD_OPTIONS[:2])
def test_async_use_with_bad_options_raises_improperly_configured(raw: Any) -> None:
    cache = FastCache(NOWHERE, {"OPTIONS": raw})

    async def use() -> None:
        await cache.aget("k")

    with pytest.raises(ImproperlyConfigured):
        asyncio.run(use())


def test_backend_message_lists_every_problem() -> None:
    cache = FastCache(NOWHERE, {"OPTIONS": {"bogus": 1, "compress_level": 0}})
    with pytest.raises(ImproperlyConfigured) as caught:
        cache.has_key("k")
    assert "'bogus'" in str(caught.value)
    assert "compress_level" in str(caught.value)


@pytest.mark.parametrize("location", [11211, ""])
def test_backend_message_lists_a_bad_location_with_bad_options(location: Any) -> None:
    cache = FastCache(location, {"OPTIONS": {"compress_level": 0}})
    with pytest.raises(ImproperlyConfigured) as caught:
        cache.get("k")
    assert "Bad FastCache LOCATION" in str(caught.value)
    assert "compress_level" in str(caught.value)


@pytest.mark.parametrize("location", [11211, ["127.0.0.1:11211", 11211]])
def test_backend_with_a_location_of_the_wrong_type_raises_on_use(location: Any) -> None:
    cache = FastCache(location, {})
    with pytest.raises(ImproperlyConfigured, match="LOCATION"):
        cache.get("k")


@pytest.mark.parametrize("location", ["", [], "  "])
def test_backend_with_no_server_says_so_on_use(location: Any) -> None:
    cache = FastCache(location, {})
    with pytest.raises(ImproperlyConfigured, match="names no memcached server"):
        cache.get("k")


def test_backend_takes_good_options() -> None:
    cache = FastCache(
        NOWHERE, {"OPTIONS": {"serializer": "json", "max_value_size": 100}, "TIMEOUT": 7}
    )
    assert cache._options.serializer == "json"
    assert cache._options.max_value_size == 100
    assert cache.default_timeout == 7


# -- LOCATION -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "servers"),
    [
        ("10.0.0.1:11211", ["10.0.0.1:11211"]),
        ("10.0.0.1:11211;10.0.0.2:11211", ["10.0.0.1:11211", "10.0.0.2:11211"]),
        ("10.0.0.1:11211,10.0.0.2:11211", ["10.0.0.1:11211", "10.0.0.2:11211"]),
        (" a:1 ; b:2 ,c:3; ", ["a:1", "b:2", "c:3"]),
        (["a:1", "unix:/run/mc.sock"], ["a:1", "unix:/run/mc.sock"]),
        (("a:1", "b:2"), ["a:1", "b:2"]),
    ],
)
def test_location_becomes_the_server_list(location: Any, servers: list[str]) -> None:
    cache = FastCache(location, {})
    assert cache._servers == servers
