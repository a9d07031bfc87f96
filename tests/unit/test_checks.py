"""The system check over settings.CACHES: every FastCache alias, its OPTIONS and addresses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.cache.backends.base import InvalidCacheKey
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_fastcache.backends import FastCache
from django_fastcache.checks import check_fastcache_settings
from django_fastcache.disk.location import default_directory
from django_fastcache.errors import ConfigurationError
from django_fastcache.testing.servers import free_port

BACKEND = "django_fastcache.backends.FastCache"
GOOD = "127.0.0.1:11211"


class SubclassedFastCache(FastCache):
    """A project's own subclass is checked like FastCache itself."""


def run(caches: dict[str, dict[str, Any]]) -> list[Error]:
    with override_settings(CACHES=caches):
        return check_fastcache_settings()


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_good_settings_give_no_messages() -> None:
    caches = {
        "default": {"BACKEND": BACKEND, "LOCATION": GOOD},
        "many": {
            "BACKEND": BACKEND,
            "LOCATION": ["10.0.0.5:11211", "[::1]:11212", "unix:/run/memcached.sock"],
            "OPTIONS": {"serializer": "json", "min_connections": 2},
        },
        "joined": {"BACKEND": BACKEND, "LOCATION": "a.example:11211;b.example:11211"},
    }
    assert run(caches) == []


def test_other_backends_are_not_checked() -> None:
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "not an address at all",
            "OPTIONS": {"bogus": 1},
        },
        "missing": {"BACKEND": "no.such.module.Backend", "OPTIONS": {"bogus": 1}},
        "undotted": {"BACKEND": "nonsense"},
    }
    assert run(caches) == []


def test_every_bad_option_is_an_error_with_its_id_and_alias() -> None:
    caches = {
        "default": {"BACKEND": BACKEND, "LOCATION": GOOD},
        "shared": {
            "BACKEND": BACKEND,
            "LOCATION": GOOD,
            "OPTIONS": {
                "bogus": 1,
                "connect_timeout": 0,
                "max_value_size": 1.5,
                "hash_invalid_keys": "yes",
                "serializer": "yaml",
                "pickle_protocol": -1,
                "compress_level": 10,
            },
        },
    }
    messages = run(caches)
    assert sorted(ids(messages)) == [f"django_fastcache.E00{n}" for n in (1, 2, 3, 4, 6, 7, 8)]
    for message in messages:
        assert isinstance(message, Error)
        assert message.msg.startswith("CACHES['shared']: ")
    unknown = next(m for m in messages if m.id == "django_fastcache.E001")
    assert "'bogus'" in unknown.msg
    assert unknown.hint


def test_min_above_max_connections_is_e005() -> None:
    caches = {
        "default": {
            "BACKEND": BACKEND,
            "LOCATION": GOOD,
            "OPTIONS": {"min_connections": 8, "max_connections": 2},
        }
    }
    assert ids(run(caches)) == ["django_fastcache.E005"]


def test_options_that_are_not_a_dict_are_e009() -> None:
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD, "OPTIONS": ["serializer"]}}
    messages = run(caches)
    assert ids(messages) == ["django_fastcache.E009"]


@pytest.mark.parametrize("options", [["serializer"], "serializer=json", 5])
def test_options_that_are_not_a_dict_reach_the_check_and_the_first_call(options: Any) -> None:
    # Django's own checks build every cache, and its BaseCache reads OPTIONS with .get():
    # the backend must be built all the same, for E009 to be reported and the first call
    # to refuse the settings.
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD, "OPTIONS": options}}
    with override_settings(CACHES=caches):
        messages = checks.run_checks(tags=[checks.Tags.caches])
    assert "django_fastcache.E009" in ids(messages)
    cache = FastCache(GOOD, {"OPTIONS": options})
    with pytest.raises(ImproperlyConfigured, match="OPTIONS must be a dict"):
        cache.get("k")


def test_options_of_none_are_no_options() -> None:
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD, "OPTIONS": None}}
    with override_settings(CACHES=caches):
        assert checks.run_checks(tags=[checks.Tags.caches]) == []
    assert FastCache(GOOD, {"OPTIONS": None}).default_timeout == 300


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"KEY_PREFIX": "my site"}, "KEY_PREFIX 'my site'"),
        ({"KEY_PREFIX": "tab\there"}, "KEY_PREFIX 'tab\\there'"),
        ({"KEY_PREFIX": "caf\udce9"}, "KEY_PREFIX"),
        ({"VERSION": "v 2"}, "VERSION 'v 2'"),
        ({"KEY_PREFIX": "x" * 247}, "make 250 bytes"),
        ({"KEY_PREFIX": "x" * 247, "KEY_FUNCTION": None}, "make 250 bytes"),
        ({"VERSION": "9" * 300}, "KEY_PREFIX and VERSION make 302 bytes"),
    ],
)
def test_a_key_prefix_that_makes_every_key_invalid_is_e022(
    given: dict[str, Any], named: str
) -> None:
    (message,) = run({"default": {"BACKEND": BACKEND, "LOCATION": GOOD, **given}})
    assert message.id == "django_fastcache.E022"
    assert named in message.msg
    backend_params = {k: v for k, v in given.items() if k != "KEY_FUNCTION"}
    with pytest.raises(InvalidCacheKey):  # what every call with a key would meet
        FastCache(GOOD, backend_params).make_and_validate_key("k")


@pytest.mark.parametrize(
    "config",
    [
        {"KEY_PREFIX": "x" * 246},  # "x…x:1:k" is 250 bytes: fits
        {"KEY_PREFIX": "my site", "OPTIONS": {"hash_invalid_keys": True}},
        {"KEY_PREFIX": "my site", "KEY_FUNCTION": "myproject.cache.make_key"},
        {"KEY_PREFIX": "café", "VERSION": 7},
    ],
)
def test_a_key_prefix_keys_can_live_with_is_no_error(config: dict[str, Any]) -> None:
    assert run({"default": {"BACKEND": BACKEND, "LOCATION": GOOD, **config}}) == []


@pytest.mark.parametrize("location", [None, "", [], " ; , "])
def test_missing_location_is_e011(location: Any) -> None:
    config: dict[str, Any] = {"BACKEND": BACKEND}
    if location is not None:
        config["LOCATION"] = location
    messages = run({"default": config})
    assert ids(messages) == ["django_fastcache.E011"]
    assert "'default'" in messages[0].msg
    assert messages[0].hint


@pytest.mark.parametrize("location", [None, "", [], " ; , "])
def test_missing_location_is_refused_by_the_backend_too(location: Any) -> None:
    # Check time says E011; run time must refuse the same settings, as a configuration
    # error (not as an argument error from deep in the client).
    config: dict[str, Any] = {"BACKEND": BACKEND}
    if location is not None:
        config["LOCATION"] = location
    assert ids(run({"default": config})) == ["django_fastcache.E011"]
    cache = FastCache(location if location is not None else "", {})
    with pytest.raises(ImproperlyConfigured, match="LOCATION"):
        cache.get("k")


@pytest.mark.parametrize(
    ("location", "fix"),
    [
        ("memcache://10.0.0.5:11211", "write '10.0.0.5:11211'"),
        ("run/memcached.sock", "unix:/"),
    ],
)
def test_bad_address_messages_name_the_fix(location: str, fix: str) -> None:
    messages = run({"default": {"BACKEND": BACKEND, "LOCATION": location}})
    assert ids(messages) == ["django_fastcache.E012"]
    assert fix in messages[0].msg


def test_unknown_option_check_names_the_nearest_option() -> None:
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD, "OPTIONS": {"disk_teir": 1}}}
    messages = run(caches)
    assert ids(messages) == ["django_fastcache.E001"]
    assert "did you mean 'disk_tier'?" in messages[0].msg


@pytest.mark.parametrize(
    ("location", "bad"),
    [
        ("127.0.0.1:port", ["127.0.0.1:port"]),
        ("127.0.0.1:99999", ["127.0.0.1:99999"]),
        ("10.0.0.256:11211", ["10.0.0.256:11211"]),
        ("unix:relative.sock", ["unix:relative.sock"]),
        ("good.example:1;bad host:2", ["bad host:2"]),
        (["ok.example:1", "::1:11211:x", "[::1"], ["::1:11211:x", "[::1"]),
    ],
)
def test_each_bad_address_is_e012(location: Any, bad: list[str]) -> None:
    messages = run({"default": {"BACKEND": BACKEND, "LOCATION": location}})
    assert ids(messages) == ["django_fastcache.E012"] * len(bad)
    for message, text in zip(messages, bad):
        assert repr(text) in message.msg
        assert message.msg.startswith("CACHES['default']: ")


@pytest.mark.parametrize(
    "location",
    [
        11211,
        ["127.0.0.1:11211", 11211],
        ("a", None),
        0,
        False,
        # Their order is not the one written (a set's changes with each process's hash seed).
        {"127.0.0.1:11211", "127.0.0.1:11212"},
        {"127.0.0.1:11211": 1},
    ],
)
def test_location_of_the_wrong_type_is_e012_not_a_crash(location: Any) -> None:
    messages = run({"default": {"BACKEND": BACKEND, "LOCATION": location}})
    assert ids(messages) == ["django_fastcache.E012"]
    assert "LOCATION must be a string or a list of strings" in messages[0].msg
    with pytest.raises(ImproperlyConfigured, match="LOCATION"):
        FastCache(location, {}).get("k")


@pytest.mark.parametrize(
    "location", [["127.0.0.1:11211", "127.0.0.1:11211"], "127.0.0.1:11211; 127.0.0.1:11211"]
)
def test_a_node_named_twice_is_e012(location: Any) -> None:
    # The backend refuses it on first use (duplicate nodes): the check says so first.
    messages = run({"default": {"BACKEND": BACKEND, "LOCATION": location}})
    assert ids(messages) == ["django_fastcache.E012"]
    assert "twice" in messages[0].msg
    with pytest.raises(ConfigurationError, match="duplicate nodes"):
        FastCache(location, {}).get("k")


@pytest.mark.parametrize("options", [{}, {"sign_values": True}])
def test_an_empty_secret_key_with_sealing_on_is_e021(options: dict[str, Any]) -> None:
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD, "OPTIONS": options}}
    with override_settings(SECRET_KEY=""):
        assert ids(run(caches)) == ["django_fastcache.E021"]
        # Not with a key of its own, or with sealing off.
        for fine in ({"signing_key": "k"}, {"sign_values": False}):
            caches["default"]["OPTIONS"] = fine
            assert ids(run(caches)) == []


def test_a_location_of_none_is_missing_e011() -> None:
    assert ids(run({"default": {"BACKEND": BACKEND, "LOCATION": None}})) == [
        "django_fastcache.E011"
    ]
    with pytest.raises(ImproperlyConfigured, match="names no memcached server"):
        FastCache(None, {}).get("k")


def test_subclasses_of_fastcache_are_checked() -> None:
    caches = {
        "default": {
            "BACKEND": f"{__name__}.SubclassedFastCache",
            "LOCATION": "nohost:xx",
            "OPTIONS": {"bogus": True},
        }
    }
    assert sorted(ids(run(caches))) == ["django_fastcache.E001", "django_fastcache.E012"]


def test_options_and_address_problems_are_reported_together() -> None:
    caches = {
        "a": {"BACKEND": BACKEND, "LOCATION": "x:0", "OPTIONS": {"compress_level": 0}},
        "b": {"BACKEND": BACKEND, "OPTIONS": {"idle_timeout": -1}},
    }
    messages = run(caches)
    assert sorted((m.msg.split(":")[0], m.id) for m in messages) == [
        ("CACHES['a']", "django_fastcache.E008"),
        ("CACHES['a']", "django_fastcache.E012"),
        ("CACHES['b']", "django_fastcache.E002"),
        ("CACHES['b'] has no LOCATION.", "django_fastcache.E011"),
    ]


def test_the_check_runs_with_django_cache_checks() -> None:
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD, "OPTIONS": {"serializer": "toml"}}}
    with override_settings(CACHES=caches):
        messages = checks.run_checks(tags=[checks.Tags.caches])
    assert "django_fastcache.E006" in ids(messages)


# -- E014: a disk tier directory others may write to ------------------------------------------


def disk_caches(directory: Any, **options: Any) -> dict[str, dict[str, Any]]:
    return {
        "default": {
            "BACKEND": BACKEND,
            "LOCATION": GOOD,
            "OPTIONS": {"disk_directory": str(directory), **options},
        }
    }


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_a_disk_directory_writable_by_others_is_e014(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "disk"
    directory.mkdir()
    directory.chmod(mode)
    messages = run(disk_caches(directory))
    assert ids(messages) == ["django_fastcache.E014"]
    assert messages[0].msg.startswith("CACHES['default']: ")
    assert str(directory) in messages[0].msg
    assert messages[0].hint


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o500])
def test_a_disk_directory_only_this_user_writes_is_fine(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "disk"
    directory.mkdir()
    directory.chmod(mode)
    try:
        assert run(disk_caches(directory)) == []
    finally:
        directory.chmod(0o700)


def test_a_disk_directory_not_made_yet_is_fine(tmp_path: Path) -> None:
    # The backend creates it, 0700, on first use.
    assert run(disk_caches(tmp_path / "not" / "yet")) == []
    assert not (tmp_path / "not").exists()  # and the check created nothing


def test_a_disk_directory_is_not_checked_when_the_tier_is_off(tmp_path: Path) -> None:
    directory = tmp_path / "disk"
    directory.mkdir()
    directory.chmod(0o777)
    assert run(disk_caches(directory, disk_tier=False)) == []


def test_the_derived_disk_directory_is_checked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    caches = {"default": {"BACKEND": BACKEND, "LOCATION": GOOD}}
    assert run(caches) == []
    derived = Path(default_directory([GOOD]))
    assert derived.is_relative_to(tmp_path)
    derived.mkdir(parents=True)
    derived.chmod(0o777)
    messages = run(caches)
    assert ids(messages) == ["django_fastcache.E014"]
    assert str(derived) in messages[0].msg


def test_the_backend_refuses_a_disk_directory_writable_by_others(tmp_path: Path) -> None:
    directory = tmp_path / "disk"
    directory.mkdir()
    directory.chmod(0o777)
    # Nothing listens at that port; the directory is refused before any connection.
    cache = FastCache(f"127.0.0.1:{free_port()}", {"OPTIONS": {"disk_directory": str(directory)}})
    with pytest.raises(ImproperlyConfigured, match="writable by other users"):
        cache.get("k")
    with pytest.raises(ImproperlyConfigured, match="writable by other users"):
        cache.set("k", 1)
    assert list(directory.iterdir()) == []  # nothing was written into it


def test_two_caches_sharing_a_disk_directory_over_different_nodes_is_e052(tmp_path: Path) -> None:
    directory = str(tmp_path / "tier")
    shared = {"BACKEND": BACKEND, "OPTIONS": {"disk_directory": directory}}
    messages = run(
        {
            "default": {**shared, "LOCATION": "127.0.0.1:11211"},
            "sessions": {**shared, "LOCATION": "127.0.0.1:11212"},
            # The same nodes in another spelling and order, and another key prefix: fine.
            "pages": {
                **shared,
                "LOCATION": ["127.0.0.1:11211"],
                "KEY_PREFIX": "pages",
            },
            "elsewhere": {
                "BACKEND": BACKEND,
                "LOCATION": "127.0.0.1:11212",
                "OPTIONS": {"disk_directory": str(tmp_path / "other")},
            },
        }
    )
    assert ids(messages) == ["django_fastcache.E052"]
    assert "CACHES['sessions'] and CACHES['default']" in messages[0].msg
