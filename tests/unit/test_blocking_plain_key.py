"""The blocking client's short key check agrees with validate_key on every byte and length."""

from __future__ import annotations

import pytest

from django_fastcache.client.blocking import _plain_key
from django_fastcache.errors import InvalidKeyError
from django_fastcache.protocol.keys import MAX_KEY_LENGTH, validate_key


def _valid(key: object) -> bool:
    try:
        validate_key(key)  # type: ignore[arg-type]
    except InvalidKeyError:
        return False
    return True


@pytest.mark.parametrize("byte", range(256))
def test_each_byte_alone_and_inside_a_key(byte: int) -> None:
    for key in (bytes([byte]), b"ab" + bytes([byte]) + b"cd", b"k" * 249 + bytes([byte])):
        assert _plain_key(key) is _valid(key), key


@pytest.mark.parametrize("length", [0, 1, MAX_KEY_LENGTH - 1, MAX_KEY_LENGTH, MAX_KEY_LENGTH + 1])
def test_lengths(length: int) -> None:
    key = b"k" * length
    assert _plain_key(key) is _valid(key)


def test_a_bytes_subclass_takes_the_long_check() -> None:
    class Key(bytes):
        pass

    assert _plain_key(Key(b"fine")) is False  # validate_key then accepts it
    assert _valid(Key(b"fine"))


@pytest.mark.parametrize("key", [b"", b"a key", b"k" * (MAX_KEY_LENGTH + 1), b"\x7f"])
def test_get_now_refuses_an_invalid_key_before_any_connection(key: bytes) -> None:
    from django_fastcache.client.blocking import BlockingClient
    from django_fastcache.client.cluster import ClientSettings, Cluster

    # Port 1 on loopback: a connection attempt would fail with ConnectFailedError instead.
    client = BlockingClient(Cluster(["127.0.0.1:1"], ClientSettings(timeout=1.0)))
    with pytest.raises(InvalidKeyError):
        client.get_now(key)
