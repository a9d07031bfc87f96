"""Sealed values: only what this site wrote is ever loaded (see docs/security.md).

Anyone who can reach memcached, or write to the disk tier's directory, can put bytes under
a key. Each test plants such bytes next to a real memcached and checks that FastCache reads
a miss, counts and logs it, and never runs the planted pickle.
"""

from __future__ import annotations

import logging
import pickle
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.sealing import FLAG_SEALED
from django_fastcache.serializers import FLAG_INTEGER, FLAG_PICKLE, FLAG_TEXT, FLAG_ZLIB
from django_fastcache.testing.servers import MemcachedServer
from tests.conftest import LANDING_WAIT

pytestmark = pytest.mark.integration

#: Set when a planted pickle runs: it must never be.
RAN: list[str] = []


def _planted_code_ran(marker: str) -> str:
    RAN.append(marker)
    return marker


class Payload:
    """Unpickling this calls _planted_code_ran: what an attacker's pickle would do."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_planted_code_ran, ("pwned",))


@pytest.fixture(autouse=True)
def _nothing_ran() -> Iterator[None]:
    RAN.clear()
    yield
    assert RAN == [], "a planted pickle was loaded"


@pytest.fixture
def raw(memcached: MemcachedServer) -> Iterator[BlockingClient]:
    client = BlockingClient(Cluster([memcached.location], ClientSettings(timeout=2.0)))
    yield client
    client.close_thread_connections()


def make_cache(location: str, **options: Any) -> FastCache:
    return FastCache(location, {"OPTIONS": {"disk_tier": False, **options}})


def plant(raw: BlockingClient, wire: bytes, data: bytes, flags: int) -> None:
    assert run_blocking(raw.set(wire, data, flags=flags))


def test_a_pickle_planted_in_memcached_is_a_logged_miss(
    memcached: MemcachedServer, raw: BlockingClient, caplog: pytest.LogCaptureFixture
) -> None:
    cache = make_cache(memcached.location)
    wire = cache.wire_key("session")
    plant(raw, wire, pickle.dumps(Payload()), FLAG_PICKLE)
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        assert cache.get("session", "default") == "default"
    assert cache.get_many(["session"]) == {}
    assert cache.has_key("session") is False
    assert cache.refused_values >= 1
    assert any("not sealed" in record.getMessage() for record in caplog.records)


def test_the_async_api_refuses_it_too(memcached: MemcachedServer, raw: BlockingClient) -> None:
    import asyncio

    cache = make_cache(memcached.location)
    plant(raw, cache.wire_key("k"), pickle.dumps(Payload()), FLAG_PICKLE)

    async def read() -> tuple[Any, Any, bool]:
        return await cache.aget("k"), await cache.aget_many(["k"]), await cache.ahas_key("k")

    assert asyncio.run(read()) == (None, {}, False)


def test_a_value_moved_from_another_key_is_refused(
    memcached: MemcachedServer, raw: BlockingClient
) -> None:
    cache = make_cache(memcached.location)
    cache.set("admin-flag", {"is_admin": True})
    item = run_blocking(raw.get(cache.wire_key("admin-flag")))
    assert item is not None
    assert item.flags & FLAG_SEALED
    plant(raw, cache.wire_key("user-flag"), item.value, item.flags)
    assert cache.get("user-flag") is None
    assert cache.get("admin-flag") == {"is_admin": True}


def test_a_value_sealed_with_another_secret_is_refused(memcached: MemcachedServer) -> None:
    ours = make_cache(memcached.location)
    theirs = make_cache(memcached.location, signing_key="another site's secret")
    theirs.set("shared", ["theirs"])
    assert ours.get("shared") is None
    assert theirs.get("shared") == ["theirs"]


def test_values_sealed_before_a_secret_key_rotation_open_with_its_fallbacks(
    memcached: MemcachedServer,
) -> None:
    # Django's rotation: the new SECRET_KEY, the old one in SECRET_KEY_FALLBACKS. Values
    # sealed with the old key still open; new ones are sealed with the new key only.
    with override_settings(SECRET_KEY="the old secret"):
        before = make_cache(memcached.location)
        before.set("written-before", ["old"])
    with override_settings(SECRET_KEY="the new secret", SECRET_KEY_FALLBACKS=["the old secret"]):
        rotating = make_cache(memcached.location)
        assert rotating.get("written-before") == ["old"]
        rotating.set("written-during", ["new"])
    with override_settings(SECRET_KEY="the new secret"):
        after = make_cache(memcached.location)
        assert after.get("written-during") == ["new"]
        assert after.get("written-before") is None  # the fallback dropped: refused
    with override_settings(SECRET_KEY="the old secret"):
        assert make_cache(memcached.location).get("written-during") is None


def test_a_tampered_value_is_refused(memcached: MemcachedServer, raw: BlockingClient) -> None:
    cache = make_cache(memcached.location)
    cache.set("k", "genuine")
    wire = cache.wire_key("k")
    item = run_blocking(raw.get(wire))
    assert item is not None
    plant(raw, wire, item.value[:-1] + b"!", item.flags)
    assert cache.get("k") is None
    plant(raw, wire, item.value[:5], item.flags)  # shorter than a tag
    assert cache.get("k") is None


def test_integers_stay_unsealed_so_incr_works(
    memcached: MemcachedServer, raw: BlockingClient
) -> None:
    cache = make_cache(memcached.location)
    cache.set("counter", 41)
    item = run_blocking(raw.get(cache.wire_key("counter")))
    assert item is not None
    assert (item.value, item.flags) == (b"41", FLAG_INTEGER)
    assert cache.incr("counter") == 42
    assert cache.get("counter") == 42
    # An integer flag on bytes that are not a number is refused, not a ValueError.
    plant(raw, cache.wire_key("counter"), b"4x2", FLAG_INTEGER)
    assert cache.get("counter") is None


def test_every_type_round_trips_sealed(memcached: MemcachedServer) -> None:
    cache = make_cache(memcached.location, compress_min_length=10)
    values = {"b": b"\x00bytes", "s": "text " * 20, "o": {"a": [1, (2, 3)]}, "n": None}
    cache.set_many(values)
    assert cache.get_many(values) == values
    for key, value in values.items():
        assert cache.get(key, "missing") == value


def test_with_sealing_off_unsealed_values_are_read(
    memcached: MemcachedServer, raw: BlockingClient
) -> None:
    cache = make_cache(memcached.location, sign_values=False)
    plant(raw, cache.wire_key("k"), b"plain", FLAG_TEXT)
    assert cache.get("k") == "plain"


def test_with_sealing_off_a_sealed_value_is_a_miss_not_an_error(
    memcached: MemcachedServer,
) -> None:
    make_cache(memcached.location).set("k", {"sealed": True})
    assert make_cache(memcached.location, sign_values=False).get("k", "missing") == "missing"


def test_a_pickle_planted_on_disk_is_refused(
    memcached: MemcachedServer, disk_directory: str
) -> None:
    # No copies of disk entries in memory: the read after the plant goes to the disk.
    options = {"disk_directory": disk_directory, "disk_read_copies": 0}
    cache = FastCache(memcached.location, {"OPTIONS": options})
    cache.set("k", "genuine")
    tiered = cache._shared().tiered
    assert tiered is not None
    assert tiered.flush(LANDING_WAIT)  # its disk copy is written behind
    memcached.flush()  # memcached misses: the disk tier answers (and refills)
    assert cache.get("k") == "genuine"
    memcached.flush()
    # Planted under the key's current write stamp, so that only the seal can refuse it.
    wire = cache.wire_key("k")
    stamp = tiered.stamps.current(wire)
    tiered.disk.set(wire, pickle.dumps(Payload()), FLAG_PICKLE, None, stamp=stamp)
    refused = cache.refused_values
    assert cache.get("k") is None
    assert cache.refused_values == refused + 1  # read from disk, and refused by the seal


def test_a_decompression_bomb_is_refused_within_the_value_limit(
    memcached: MemcachedServer, raw: BlockingClient
) -> None:
    # Sealing off, so the bomb reaches the serializer: its bound must hold on its own.
    cache = make_cache(memcached.location, sign_values=False, max_value_size=64 * 1024)
    bomb = zlib.compress(b"\0" * (256 * 1024 * 1024), 9)  # 256 MiB from about 250 KB
    assert len(bomb) < 512 * 1024
    plant(raw, cache.wire_key("bomb"), bomb, FLAG_TEXT | FLAG_ZLIB)
    tracemalloc.start()
    try:
        assert cache.get("bomb") is None
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024
    assert cache.refused_values == 1


def test_values_too_large_to_read_back_are_not_written(memcached: MemcachedServer) -> None:
    from django_fastcache.errors import ValueTooLargeError

    cache = make_cache(memcached.location, compress_min_length=100, max_value_size=1000)
    with pytest.raises(ValueTooLargeError):
        cache.set("k", "x" * 5000)  # compresses small, but could not be read back


def test_an_empty_secret_key_is_refused_with_the_fix_named(memcached: MemcachedServer) -> None:
    with override_settings(SECRET_KEY=""):
        cache = make_cache(memcached.location)
    with pytest.raises(ImproperlyConfigured, match="signing_key"):
        cache.get("k")


def _key_whose_hash_tag_reads_as_a_number(cache: FastCache, value: str) -> str:
    """A key under which ``value``'s tag, as the hash makes it, starts with a digit and then a
    blank: bytes memcached's incr/decr would take for a number."""
    from django.conf import settings

    from django_fastcache.sealing import Sealer, derive_key

    mac = Sealer(derive_key(settings.SECRET_KEY))._mac
    for n in range(200_000):
        key = f"n{n}"
        tag = Sealer._tag(mac, cache.wire_key(key), FLAG_TEXT, value.encode())
        if tag[:1].isdigit() and tag[1:2] in (b" ", b"\t", b"\n", b"\v", b"\f", b"\r"):
            return key
    raise AssertionError("no such key found")


@pytest.mark.parametrize("tier", [False, True], ids=["memcached", "tiered"])
def test_decr_of_a_sealed_text_refuses_it_whatever_its_tag_starts_with(
    memcached: MemcachedServer, raw: BlockingClient, tier: bool, tmp_path: Any
) -> None:
    """memcached counts on any value that starts with digits followed by a blank. A sealed
    value's stored tag starts with a byte of 0x80 or more, so that no tag reads as a number:
    before, one in about a thousand text values was decremented, and lost, by a decr."""
    options: dict[str, Any] = {"disk_tier": True, "disk_directory": str(tmp_path)} if tier else {}
    cache = make_cache(memcached.location, **options)
    key = _key_whose_hash_tag_reads_as_a_number(cache, "text")
    cache.set(key, "text")
    stored = run_blocking(raw.get(cache.wire_key(key)))
    assert stored is not None
    assert stored.value[0] >= 0x80
    with pytest.raises(TypeError):  # not an integer (NonIntegerValueError)
        cache.decr(key)
    assert cache.get(key) == "text"


def test_a_value_sealed_before_the_tag_s_high_bit_was_set_still_opens(
    memcached: MemcachedServer, raw: BlockingClient
) -> None:
    """Values stored by an earlier release (the tag's first byte as the hash made it) read
    as before after an upgrade; a tag wrong in any other bit is still refused."""
    from django.conf import settings

    from django_fastcache.sealing import Sealer, derive_key

    cache = make_cache(memcached.location)
    mac = Sealer(derive_key(settings.SECRET_KEY))._mac
    for n in range(64):
        wire = cache.wire_key(f"old{n}")
        tag = Sealer._tag(mac, wire, FLAG_TEXT, b"kept")
        plant(raw, wire, tag + b"kept", FLAG_TEXT | FLAG_SEALED)
        assert cache.get(f"old{n}") == "kept"
        bent = bytes([tag[0] ^ 0x01]) + tag[1:]
        plant(raw, wire, bent + b"kept", FLAG_TEXT | FLAG_SEALED)
        assert cache.get(f"old{n}") is None
