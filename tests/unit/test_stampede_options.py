"""The meta protocol and stampede protection OPTIONS: bad values and their error ids."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_fastcache.backends import FastCache
from django_fastcache.backends.options import FastCacheOptions, parse_options


def ids(raw: dict[str, Any]) -> list[str]:
    return [problem.id for problem in parse_options(raw)[1]]


def test_the_defaults() -> None:
    options = FastCacheOptions()
    assert options.protocol == "auto"
    assert options.stampede_protection is True
    assert options.stampede_wait > options.stampede_lease > 0
    assert options.stale_while_revalidate == 0


@pytest.mark.parametrize("value", ["META", "binary", "", None, 1, ["meta"]])
def test_protocol_must_be_a_known_name_e016(value: Any) -> None:
    options, problems = parse_options({"protocol": value})
    assert [problem.id for problem in problems] == ["django_fastcache.E016"]
    assert "'auto', 'meta', 'classic'" in problems[0].message
    assert problems[0].hint is not None
    assert "mcrouter" in problems[0].hint
    assert options.protocol == "auto"


@pytest.mark.parametrize("name", ["stampede_lease", "stampede_wait"])
@pytest.mark.parametrize("value", [0, -1, "5", None, True, float("inf"), float("nan")])
def test_lease_and_wait_must_be_positive_seconds_e002(name: str, value: Any) -> None:
    assert ids({name: value}) == ["django_fastcache.E002"]


@pytest.mark.parametrize("value", [1, "yes", None])
def test_stampede_protection_must_be_a_bool_e004(value: Any) -> None:
    assert ids({"stampede_protection": value}) == ["django_fastcache.E004"]


@pytest.mark.parametrize("value", [-1, -0.5, "2", None, True, float("inf")])
def test_stale_while_revalidate_must_be_seconds_e017(value: Any) -> None:
    options, problems = parse_options({"stale_while_revalidate": value})
    assert [problem.id for problem in problems] == ["django_fastcache.E017"]
    assert options.stale_while_revalidate == 0


def test_the_backend_refuses_a_bad_protocol_on_use() -> None:
    cache = FastCache("127.0.0.1:9", {"OPTIONS": {"protocol": "binary"}})
    with pytest.raises(ImproperlyConfigured, match="protocol must be one of"):
        cache.get_or_set("k", 1)


@pytest.mark.parametrize("value", [-1, -0.5, "30", None, True, float("inf"), float("nan")])
def test_stale_on_delete_must_be_seconds_e018(value: Any) -> None:
    options, problems = parse_options({"stale_on_delete": value, "disk_tier": False})
    assert [problem.id for problem in problems] == ["django_fastcache.E018"]
    assert options.stale_on_delete == 0


def test_stale_on_delete_is_off_by_default_and_takes_seconds() -> None:
    assert FastCacheOptions().stale_on_delete == 0
    options, problems = parse_options({"stale_on_delete": 30, "disk_tier": False})
    assert problems == []
    assert options.stale_on_delete == 30
    assert parse_options({"stale_on_delete": 0})[1] == []  # off needs nothing


def test_stale_on_delete_needs_the_disk_tier_off_e019() -> None:
    options, problems = parse_options({"stale_on_delete": 30})
    assert [problem.id for problem in problems] == ["django_fastcache.E019"]
    assert "disk tier" in problems[0].message
    assert problems[0].hint is not None
    assert '"disk_tier": False' in problems[0].hint
    assert options.stale_on_delete == 0


def test_stale_on_delete_needs_the_meta_protocol_e019() -> None:
    raw = {"stale_on_delete": 30, "disk_tier": False, "protocol": "classic"}
    options, problems = parse_options(raw)
    assert [problem.id for problem in problems] == ["django_fastcache.E019"]
    assert "'classic'" in problems[0].message
    assert options.stale_on_delete == 0


def test_the_backend_refuses_stale_on_delete_with_the_disk_tier_on_use() -> None:
    cache = FastCache("127.0.0.1:9", {"OPTIONS": {"stale_on_delete": 30}})
    with pytest.raises(ImproperlyConfigured, match="stale_on_delete needs the disk tier off"):
        cache.delete("k")
