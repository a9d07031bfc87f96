"""What a get_or_set lease's stub (an empty value with flags 0) is, and that the backend's
encoding never produces one: so every read path may take it for a miss."""

from __future__ import annotations

from typing import Any

import pytest

from django_fastcache.sealing import Sealer, derive_key
from django_fastcache.serializers import FLAG_BYTES, FLAG_ZLIB, JSONSerializer, PickleSerializer
from django_fastcache.stampede import is_stub

SERIALIZERS = [PickleSerializer, JSONSerializer]
# Values whose encoding is the shortest each type has.
SMALL_VALUES: list[Any] = [b"", "", 0, None, False, [], {}, (), 0.0]


def test_a_stub_is_empty_with_flags_zero() -> None:
    assert is_stub(b"", 0)
    assert not is_stub(b"", FLAG_ZLIB)
    assert not is_stub(b"0", 0)


@pytest.mark.parametrize("cls", SERIALIZERS)
@pytest.mark.parametrize("value", SMALL_VALUES)
@pytest.mark.parametrize("compress", [None, 1])
def test_no_value_is_encoded_as_a_stub(cls: type, value: Any, compress: int | None) -> None:
    serializer = cls(compress_min_length=compress)
    data, flags = serializer.dumps(value)
    assert not is_stub(data, flags)
    sealed = Sealer(derive_key("secret")).seal(b"key", data, flags)
    assert not is_stub(*sealed)


@pytest.mark.parametrize("cls", SERIALIZERS)
def test_empty_bytes_are_stored_compressed_and_read_back(cls: type) -> None:
    data, flags = cls().dumps(b"")
    assert flags == FLAG_BYTES | FLAG_ZLIB
    assert data
    assert cls().loads(data, flags) == b""


def test_the_sealer_reads_a_stub_as_a_miss_without_a_refusal() -> None:
    sealer = Sealer(derive_key("secret"))
    assert sealer.open(b"key", b"", 0) is None
    assert sealer.refusals.count == 0
    # Anything else unsealed is still refused, and counted.
    assert sealer.open(b"key", b"x", 0) is None
    assert sealer.refusals.count == 1


# -- the reply get_or_set reads on every hit -------------------------------------------


@pytest.mark.parametrize(
    "line",
    [b"VA 3 c7 f2\r\nabc\r\n", b"VA 0 c18446744073709551615 f0\r\n\r\n"],
)
def test_a_value_with_its_cas_reads_the_same_on_the_quick_path(line: bytes) -> None:
    from django_fastcache.protocol.meta import _with_flags, read_meta_reply

    reply, end = read_meta_reply(line, 0, 1024, 8192) or (None, 0)
    assert reply is not None
    assert end == len(line)
    header = line.split(b"\r\n")[0].split(b" ")
    assert reply == _with_flags(reply.status, reply.value, header[2:], line)


def test_a_cas_out_of_range_is_still_refused() -> None:
    from django_fastcache.errors import ProtocolError
    from django_fastcache.protocol.meta import read_meta_reply

    with pytest.raises(ProtocolError, match="out of range"):
        read_meta_reply(b"VA 1 c18446744073709551616 f0\r\nx\r\n", 0, 1024, 8192)
