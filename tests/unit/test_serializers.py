"""Values to (bytes, flags) and back: the pickle and JSON serializers."""

from __future__ import annotations

import datetime
import decimal
import json
import pickle
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_fastcache.serializers import (
    FLAG_BYTES,
    FLAG_INTEGER,
    FLAG_JSON,
    FLAG_PICKLE,
    FLAG_TEXT,
    FLAG_ZLIB,
    SERIALIZERS,
    JSONSerializer,
    PickleSerializer,
)

BOTH = [PickleSerializer, JSONSerializer]
MAX_U64 = 2**64 - 1


def test_flags_are_the_shared_convention() -> None:
    assert (FLAG_BYTES, FLAG_PICKLE, FLAG_INTEGER, FLAG_ZLIB, FLAG_TEXT, FLAG_JSON) == (
        0,
        1,
        2,
        8,
        16,
        32,
    )
    assert {"pickle": PickleSerializer, "json": JSONSerializer} == SERIALIZERS


# -- integers -------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("value", [0, 1, 42, 2**32, 2**63, MAX_U64 - 1, MAX_U64])
def test_unsigned_64_bit_ints_are_stored_as_decimal_digits(cls: type, value: int) -> None:
    data, flags = cls().dumps(value)
    assert (data, flags) == (str(value).encode(), FLAG_INTEGER)
    loaded = cls().loads(data, flags)
    assert loaded == value
    assert type(loaded) is int


@pytest.mark.parametrize("value", [-1, -(2**70), MAX_U64 + 1, 2**100, True, False])
def test_other_ints_and_bools_are_pickled(value: int) -> None:
    serializer = PickleSerializer()
    data, flags = serializer.dumps(value)
    assert flags == FLAG_PICKLE
    assert pickle.loads(data) == value
    loaded = serializer.loads(data, flags)
    assert loaded == value
    assert type(loaded) is type(value)


@pytest.mark.parametrize("value", [-1, MAX_U64 + 1, True, False])
def test_other_ints_and_bools_are_json_for_the_json_serializer(value: int) -> None:
    serializer = JSONSerializer()
    data, flags = serializer.dumps(value)
    assert flags == FLAG_JSON
    loaded = serializer.loads(data, flags)
    assert loaded == value
    assert type(loaded) is type(value)


class Counter(int):
    pass


def test_int_subclasses_are_not_stored_raw() -> None:
    serializer = PickleSerializer()
    data, flags = serializer.dumps(Counter(3))
    assert flags == FLAG_PICKLE
    loaded = serializer.loads(data, flags)
    assert loaded == 3
    assert type(loaded) is Counter


@pytest.mark.parametrize("cls", BOTH)
def test_integer_digits_padded_by_memcached_decr_still_load(cls: type) -> None:
    # memcached rewrites a shrinking counter in place, padding it with spaces.
    assert cls().loads(b"9 ", FLAG_INTEGER) == 9


@pytest.mark.parametrize("cls", BOTH)
def test_ints_are_never_compressed(cls: type) -> None:
    data, flags = cls(compress_min_length=1).dumps(10**19)
    assert (data, flags) == (b"10000000000000000000", FLAG_INTEGER)


# -- bytes and text -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("value", [b"abc", bytes(range(256))])
def test_bytes_are_stored_raw(cls: type, value: bytes) -> None:
    data, flags = cls().dumps(value)
    assert (data, flags) == (value, FLAG_BYTES)
    assert cls().loads(data, flags) == value


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("value", ["", "plain", "ünïcödé ✓", "x" * 1000])
def test_str_is_stored_as_utf8(cls: type, value: str) -> None:
    data, flags = cls().dumps(value)
    assert (data, flags) == (value.encode(), FLAG_TEXT)
    assert cls().loads(data, flags) == value


@pytest.mark.parametrize("cls", BOTH)
def test_str_that_is_not_valid_utf8_still_round_trips(cls: type) -> None:
    value = "lone \ud800 surrogate"
    data, flags = cls().dumps(value)
    assert flags in (FLAG_PICKLE, FLAG_JSON)
    assert cls().loads(data, flags) == value


def test_bytearray_is_pickled_and_keeps_its_type() -> None:
    serializer = PickleSerializer()
    data, flags = serializer.dumps(bytearray(b"ab"))
    assert flags == FLAG_PICKLE
    loaded = serializer.loads(data, flags)
    assert loaded == bytearray(b"ab")
    assert type(loaded) is bytearray


# -- objects ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        1.5,
        [1, "a", None],
        (1, 2),
        {"a": [1, {"b": None}]},
        {1, 2},
        datetime.datetime(2024, 1, 2, 3, 4, 5),
        decimal.Decimal("1.10"),
    ],
)
def test_pickle_round_trips_objects(value: Any) -> None:
    serializer = PickleSerializer()
    data, flags = serializer.dumps(value)
    assert flags == FLAG_PICKLE
    loaded = serializer.loads(data, flags)
    assert loaded == value
    assert type(loaded) is type(value)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_protocol_is_used(protocol: int) -> None:
    serializer = PickleSerializer(protocol=protocol)
    data, _flags = serializer.dumps({"a": 1})
    assert data == pickle.dumps({"a": 1}, protocol)
    assert serializer.loads(data, FLAG_PICKLE) == {"a": 1}


def test_pickle_errors_propagate() -> None:
    class Unpicklable:
        def __reduce__(self) -> Any:
            raise pickle.PicklingError("no")

    with pytest.raises(pickle.PickleError):
        PickleSerializer().dumps(Unpicklable())


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (1.5, 1.5), ([1, "a"], [1, "a"]), ((1, 2), [1, 2]), ({"a": {}}, {"a": {}})],
)
def test_json_round_trips_json_types(value: Any, expected: Any) -> None:
    serializer = JSONSerializer()
    data, flags = serializer.dumps(value)
    assert flags == FLAG_JSON
    assert json.loads(data) == expected
    assert serializer.loads(data, flags) == expected


def test_json_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(TypeError):
        JSONSerializer().dumps({1, 2})


def test_pickle_serializer_reads_json_values() -> None:
    data, flags = JSONSerializer().dumps({"k": [1, 2]})
    assert PickleSerializer().loads(data, flags) == {"k": [1, 2]}


@pytest.mark.parametrize("flags", [FLAG_PICKLE, FLAG_PICKLE | FLAG_ZLIB])
def test_json_refuses_pickled_values(flags: int) -> None:
    data = pickle.dumps(["x"])
    if flags & FLAG_ZLIB:
        data = zlib.compress(data)
    with pytest.raises(ValueError, match="refusing"):
        JSONSerializer().loads(data, flags)


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("flags", [3, 5, 17, 64, 1 << 20])
def test_unknown_flags_raise_value_error(cls: type, flags: int) -> None:
    with pytest.raises(ValueError, match=str(flags)):
        cls().loads(b"whatever", flags)


# -- compression ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize(
    ("value", "base_flags"),
    [(b"a" * 500, FLAG_BYTES), ("b" * 500, FLAG_TEXT), ({"k": "c" * 500}, None)],
)
def test_values_at_the_threshold_are_compressed(cls: type, value: Any, base_flags: Any) -> None:
    plain_data, plain_flags = cls().dumps(value)
    if base_flags is not None:
        assert plain_flags == base_flags
    serializer = cls(compress_min_length=len(plain_data), compress_level=9)
    data, flags = serializer.dumps(value)
    assert flags == plain_flags | FLAG_ZLIB
    assert zlib.decompress(data) == plain_data
    assert len(data) < len(plain_data)
    assert serializer.loads(data, flags) == cls().loads(plain_data, plain_flags)


@pytest.mark.parametrize("cls", BOTH)
def test_values_below_the_threshold_are_not_compressed(cls: type) -> None:
    value = b"a" * 499
    assert cls(compress_min_length=500).dumps(value) == (value, FLAG_BYTES)
    assert cls(compress_min_length=None).dumps(b"a" * 5000) == (b"a" * 5000, FLAG_BYTES)


def test_compression_that_does_not_shrink_is_skipped() -> None:
    incompressible = zlib.compress(bytes(range(256)) * 4, 9)  # already compressed
    data, flags = PickleSerializer(compress_min_length=1).dumps(incompressible)
    assert (data, flags) == (incompressible, FLAG_BYTES)


def test_compress_level_is_used() -> None:
    value = b"".join(b"%d," % i for i in range(5000))
    fast, _ = PickleSerializer(compress_min_length=1, compress_level=1).dumps(value)
    small, _ = PickleSerializer(compress_min_length=1, compress_level=9).dumps(value)
    assert fast == zlib.compress(value, 1)
    assert small == zlib.compress(value, 9)


@pytest.mark.parametrize("cls", BOTH)
def test_compressed_values_from_other_clients_load(cls: type) -> None:
    serializer = cls()  # compression off for writing; reading always understands it
    assert serializer.loads(zlib.compress(b"123"), FLAG_INTEGER | FLAG_ZLIB) == 123
    assert serializer.loads(zlib.compress("é".encode()), FLAG_TEXT | FLAG_ZLIB) == "é"


# -- round trips ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)

compression = st.sampled_from([None, 1, 16, 200])


@given(
    value=json_values | st.tuples(st.integers(), st.text()) | st.frozensets(st.integers()),
    threshold=compression,
    level=st.integers(1, 9),
)
def test_pickle_round_trip(value: Any, threshold: int | None, level: int) -> None:
    serializer = PickleSerializer(threshold, level)
    data, flags = serializer.dumps(value)
    assert isinstance(data, bytes)
    loaded = serializer.loads(data, flags)
    assert loaded == value
    assert type(loaded) is type(value)


def _json_scalar_or_structure(value: Any) -> bool:
    """JSON keeps bytes only at the top (raw); nested bytes are not JSON."""

    def has_nested_bytes(item: Any) -> bool:
        if isinstance(item, bytes):
            return True
        if isinstance(item, list):
            return any(has_nested_bytes(x) for x in item)
        if isinstance(item, dict):
            return any(has_nested_bytes(x) for x in item.values())
        return False

    return isinstance(value, bytes) or not has_nested_bytes(value)


@given(value=json_values.filter(_json_scalar_or_structure), threshold=compression)
def test_json_round_trip(value: Any, threshold: int | None) -> None:
    serializer = JSONSerializer(threshold)
    data, flags = serializer.dumps(value)
    assert not flags & FLAG_PICKLE
    assert serializer.loads(data, flags) == value


@given(value=st.integers(0, MAX_U64))
def test_every_unsigned_64_bit_int_is_raw(value: int) -> None:
    for cls in BOTH:
        assert cls().dumps(value) == (b"%d" % value, FLAG_INTEGER)


@given(value=st.text(st.characters(codec="utf-8")) | st.text())
def test_text_round_trips_as_text(value: str) -> None:
    for cls in BOTH:
        assert cls().dumps(value) == (value.encode(), FLAG_TEXT)


@given(value=st.text(st.characters(categories=["Cs"]) | st.characters(), min_size=1))
def test_any_str_round_trips_surrogates_included(value: str) -> None:
    for cls in BOTH:
        loaded = cls().loads(*cls().dumps(value))
        assert loaded == value
        assert type(loaded) is str


@pytest.mark.parametrize("serializer", [PickleSerializer(), JSONSerializer()])
def test_integers_pylibmc_stored_with_its_long_flag_are_read(serializer: Any) -> None:
    # pylibmc writes Python ints as decimal digits with flags 4.
    assert serializer.loads(b"12345678901234567890", 4) == 12345678901234567890
