"""The client's settings: a wrong type or value is refused, naming the setting, the same
way pure and compiled (the constructor does no I/O, so no server is needed)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from django_fastcache.client import Client
from django_fastcache.client.cluster import ClientSettings
from django_fastcache.errors import InvalidArgumentError

ADDRESS = ["127.0.0.1:11211"]

WRONG_TYPES: list[tuple[dict[str, Any], str]] = [
    ({"timeout": "1"}, "timeout must be a number of seconds, got '1'"),
    ({"connect_timeout": None}, "connect_timeout must be a number of seconds, got None"),
    ({"idle_timeout": True}, "idle_timeout must be a number of seconds, got True"),
    ({"autodiscovery_interval": "60"}, "autodiscovery_interval must be a number of seconds"),
    ({"min_connections": 1.0}, "min_connections must be an int, got 1.0"),
    ({"max_connections": "4"}, "max_connections must be an int, got '4'"),
    ({"max_connections": True}, "max_connections must be an int, got True"),
    ({"max_value_size": 1.5}, "max_value_size must be an int, got 1.5"),
    ({"autodiscovery": "no"}, "autodiscovery must be a bool, got 'no'"),
    ({"meta": "yes"}, "meta must be a bool, got 'yes'"),
]

CLIENT_ONLY_FLAGS: list[tuple[dict[str, Any], str]] = [
    ({"latency_metrics": 1}, "latency_metrics must be a bool, got 1"),
    ({"autobatching": "yes"}, "autobatching must be a bool, got 'yes'"),
    ({"pipelining": None}, "pipelining must be a bool, got None"),
]

WRONG_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"timeout": 0}, "timeouts must be positive"),
    ({"timeout": math.nan}, "timeouts must be positive"),
    ({"connect_timeout": -1.0}, "timeouts must be positive"),
    ({"min_connections": 5, "max_connections": 4}, "min_connections <= max_connections"),
    ({"min_connections": 0}, "min_connections <= max_connections"),
    ({"idle_timeout": math.nan}, "idle_timeout and max_value_size must be positive"),
    ({"max_value_size": 0}, "idle_timeout and max_value_size must be positive"),
    ({"autodiscovery_interval": 0.0}, "autodiscovery_interval must be positive"),
    ({"placement": "round-robin"}, "placement must be one of"),
]


@pytest.mark.parametrize(("given", "message"), WRONG_TYPES + CLIENT_ONLY_FLAGS + WRONG_VALUES)
def test_the_client_refuses_a_wrong_setting_by_name(given: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        Client(ADDRESS, **given)
    assert message in str(raised.value)


@pytest.mark.parametrize(("given", "message"), WRONG_TYPES)
def test_client_settings_built_directly_refuse_a_wrong_type_by_name(
    given: dict[str, Any], message: str
) -> None:
    # As the client does: compiled too, where a field's declared type would otherwise
    # refuse it first with a bare TypeError (or take a bool for a count).
    with pytest.raises(InvalidArgumentError) as raised:
        ClientSettings(**given)
    assert message in str(raised.value)


@pytest.mark.parametrize(("given", "message"), WRONG_VALUES)
def test_client_settings_refuse_a_wrong_value(given: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        ClientSettings(**given)


def test_numbers_of_either_kind_are_seconds() -> None:
    client = Client(ADDRESS, timeout=2, connect_timeout=0.5, idle_timeout=30)
    assert client.timeout == 2
    settings = ClientSettings(timeout=2, autodiscovery_interval=5)
    assert (settings.timeout, settings.autodiscovery_interval) == (2, 5)
