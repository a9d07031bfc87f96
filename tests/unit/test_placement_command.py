"""``manage.py fastcache placement`` and the placement/autodiscovery options."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_fastcache.backends.options import parse_options
from django_fastcache.client.placement import movement

NODES = ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"]


def caches(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "fast": {
            "BACKEND": "django_fastcache.backends.FastCache",
            "LOCATION": NODES,
            "OPTIONS": {"disk_tier": False, **options},
        },
    }


def placement(*args: str, options: dict[str, Any] | None = None) -> str:
    out = io.StringIO()
    with override_settings(CACHES=caches(options or {})):
        call_command("fastcache", "placement", *args, stdout=out)
    return out.getvalue()


def test_adding_a_node_reports_its_share() -> None:
    text = placement("--add", "10.0.0.4:11211")
    expected = movement(NODES, [*NODES, "10.0.0.4:11211"])
    assert "fast: rendezvous placement, 3 node(s) -> 4 node(s)" in text
    assert f"{expected.moved} of 20000 sample keys move: {expected.fraction:.1%}" in text
    assert f"to   10.0.0.4:11211: {expected.moved}" in text


def test_removing_a_node_under_the_aliases_placement() -> None:
    text = placement("--remove", "10.0.0.2:11211", options={"placement": "ketama"})
    expected = movement(NODES, [NODES[0], NODES[2]], "ketama")
    assert "ketama placement, 3 node(s) -> 2 node(s)" in text
    assert f"from 10.0.0.2:11211: {expected.moved}" in text


def test_keys_from_a_file_and_another_placement(tmp_path: Any) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"".join(b":1:user:%d\n" % n for n in range(500)))
    text = placement("--add", "10.0.0.4:11211", "--placement", "emcache", "--keys", str(keys))
    expected = movement(
        NODES, [*NODES, "10.0.0.4:11211"], "emcache", [b":1:user:%d" % n for n in range(500)]
    )
    assert f"{expected.moved} of 500 keys from {keys} move" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "say which nodes change"),
        (("--remove", "10.0.0.9:11211"), "is not one of fast's nodes"),
        (("--add", "http://x"), "addresses take no scheme"),
        (("--remove", NODES[0], "--remove", NODES[1], "--remove", NODES[2]), "no node"),
    ],
)
def test_mistakes_are_named(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        placement(*args)


def test_placement_option_is_checked() -> None:
    options, problems = parse_options({"placement": "consistent"})
    assert [p.id for p in problems] == ["django_fastcache.E031"]
    assert "ketama" in problems[0].message
    assert options.placement == "rendezvous"


def test_autodiscovery_needs_the_disk_tier_off() -> None:
    _options, problems = parse_options({"autodiscovery": True})
    assert [p.id for p in problems] == ["django_fastcache.E032"]
    assert problems[0].hint == 'Add "disk_tier": False to OPTIONS.'
    options, problems = parse_options(
        {"autodiscovery": True, "disk_tier": False, "autodiscovery_interval": 5}
    )
    assert problems == []
    assert options.autodiscovery is True
    assert options.autodiscovery_interval == 5


@pytest.mark.parametrize("value", [0, -1, "60", True, float("inf")])
def test_autodiscovery_interval_must_be_positive(value: Any) -> None:
    _options, problems = parse_options({"autodiscovery_interval": value})
    assert [p.id for p in problems] == ["django_fastcache.E002"]
