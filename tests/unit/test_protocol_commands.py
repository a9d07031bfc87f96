"""Request encoders: exact bytes for valid requests, typed errors for everything else."""

from __future__ import annotations

import array
import enum
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_fastcache.errors import InvalidArgumentError, InvalidKeyError
from django_fastcache.protocol.commands import (
    cache_memlimit_command,
    cas_command,
    decr_command,
    delete_command,
    flush_all_command,
    gat_command,
    get_command,
    incr_command,
    stats_command,
    storage_command,
    touch_command,
    verbosity_command,
    version_command,
)

FORBIDDEN = [*range(0x00, 0x21), 0x7F]
ALLOWED = [b for b in range(256) if b not in FORBIDDEN]
STORAGE_VERBS = [b"set", b"add", b"replace", b"append", b"prepend"]

BAD_KEYS: list[Any] = [
    b"a b",
    b"a\rb",
    b"a\nb",
    b"a\x00b",
    b"a\x7fb",
    b"\tkey",
    b"k" * 251,
    b"",
    "key",
    bytearray(b"key"),
    None,
]

valid_keys = st.lists(st.sampled_from(ALLOWED), min_size=1, max_size=250).map(bytes)
tricky_values = st.lists(
    st.one_of(
        st.sampled_from([b"\r\n", b"\r\nEND\r\n", b"VALUE ", b"\x00", b"\n", b"\r", b" noreply"]),
        st.binary(max_size=40),
    ),
    max_size=8,
).map(b"".join)


# -- retrieval --------------------------------------------------------------------------------


def test_get_one_key() -> None:
    assert get_command([b"foo"]) == b"get foo\r\n"
    assert get_command([b"foo"], cas=True) == b"gets foo\r\n"


def test_get_many_keys() -> None:
    assert get_command([b"a", b"bb", b"ccc"]) == b"get a bb ccc\r\n"
    assert get_command([b"a", b"bb"], cas=True) == b"gets a bb\r\n"


def test_get_accepts_any_sequence() -> None:
    assert get_command((b"k",)) == b"get k\r\n"
    assert get_command((b"k", b"j")) == b"get k j\r\n"


def test_get_needs_at_least_one_key() -> None:
    with pytest.raises(InvalidArgumentError, match="at least one key"):
        get_command([])


@pytest.mark.parametrize("single", [b"key", "key", bytearray(b"key")])
def test_get_refuses_a_single_key_in_place_of_a_sequence(single: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="sequence of keys"):
        get_command(single)


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_get_validates_every_key(bad: Any) -> None:
    with pytest.raises(InvalidKeyError):
        get_command([bad])
    with pytest.raises(InvalidKeyError):
        get_command([b"good", bad, b"fine"])
    with pytest.raises(InvalidKeyError):
        get_command((bad,), cas=True)


def test_gat() -> None:
    assert gat_command([b"k"], 300) == b"gat 300 k\r\n"
    assert gat_command([b"k", b"j"], 0, cas=True) == b"gats 0 k j\r\n"
    assert gat_command([b"k"], -1) == b"gat -1 k\r\n"


def test_gat_validates() -> None:
    with pytest.raises(InvalidArgumentError):
        gat_command([], 10)
    with pytest.raises(InvalidKeyError):
        gat_command([b"a b"], 10)
    with pytest.raises(InvalidArgumentError):
        gat_command([b"k"], 1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        gat_command([b"k"], 2**31)


# -- storage ----------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", STORAGE_VERBS)
def test_storage_defaults(verb: bytes) -> None:
    assert storage_command(verb, b"k", b"hello") == verb + b" k 0 0 5\r\nhello\r\n"


def test_storage_with_every_option() -> None:
    command = storage_command(b"set", b"key", b"abc", flags=17, exptime=3600, noreply=True)
    assert command == b"set key 17 3600 3 noreply\r\nabc\r\n"


def test_storage_empty_value() -> None:
    assert storage_command(b"add", b"k", b"") == b"add k 0 0 0\r\n\r\n"


def test_storage_value_with_protocol_bytes_inside_is_sent_verbatim() -> None:
    value = b"a\r\nEND\r\nVALUE x 0 1\r\n\x00"
    assert storage_command(b"set", b"k", value) == b"set k 0 0 22\r\n" + value + b"\r\n"


def test_storage_bytes_like_values() -> None:
    assert storage_command(b"set", b"k", bytearray(b"abc")) == b"set k 0 0 3\r\nabc\r\n"
    assert storage_command(b"set", b"k", memoryview(b"xabcx")[1:4]) == b"set k 0 0 3\r\nabc\r\n"


def test_storage_length_of_a_wide_memoryview_is_counted_in_bytes() -> None:
    numbers = array.array("i", [1, 2, 3])
    raw = numbers.tobytes()
    expected = b"set k 0 0 %d\r\n" % len(raw) + raw + b"\r\n"
    assert len(raw) == 3 * numbers.itemsize
    assert storage_command(b"set", b"k", memoryview(numbers)) == expected


@pytest.mark.parametrize("value", ["text", 5, None, [b"a"], array.array("b", [1])])
def test_storage_refuses_non_bytes_values(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="values must be bytes"):
        storage_command(b"set", b"k", value)


@pytest.mark.parametrize("verb", [b"cas", b"get", b"SET", b"", "set", bytearray(b"set"), None])
def test_storage_refuses_other_verbs(verb: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="storage verb"):
        storage_command(verb, b"k", b"v")


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_storage_validates_the_key(bad: Any) -> None:
    with pytest.raises(InvalidKeyError):
        storage_command(b"set", bad, b"v")


@pytest.mark.parametrize("flags", [0, 1, 2**32 - 1])
def test_flags_in_range(flags: int) -> None:
    assert storage_command(b"set", b"k", b"v", flags=flags) == b"set k %d 0 1\r\nv\r\n" % flags


@pytest.mark.parametrize("flags", [-1, 2**32, 2**40, True, False, 1.0, "1", None])
def test_flags_out_of_range_or_wrong_type(flags: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="flags"):
        storage_command(b"set", b"k", b"v", flags=flags)
    with pytest.raises(InvalidArgumentError, match="flags"):
        cas_command(b"k", b"v", 1, flags=flags)


@pytest.mark.parametrize("exptime", [0, 1, -1, 2**31 - 1, -(2**31), 30 * 24 * 3600 + 1])
def test_exptime_in_range(exptime: int) -> None:
    assert storage_command(b"set", b"k", b"v", exptime=exptime) == (
        b"set k 0 " + str(exptime).encode() + b" 1\r\nv\r\n"
    )
    assert touch_command(b"k", exptime) == b"touch k " + str(exptime).encode() + b"\r\n"


@pytest.mark.parametrize("exptime", [2**31, -(2**31) - 1, 2**63, 1.0, 0.5, True, False, "10", None])
def test_exptime_out_of_range_or_wrong_type(exptime: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="exptime"):
        storage_command(b"set", b"k", b"v", exptime=exptime)
    with pytest.raises(InvalidArgumentError, match="exptime"):
        cas_command(b"k", b"v", 1, exptime=exptime)
    with pytest.raises(InvalidArgumentError, match="exptime"):
        touch_command(b"k", exptime)
    with pytest.raises(InvalidArgumentError, match="exptime"):
        gat_command([b"k"], exptime)


def test_int_subclasses_are_sent_as_their_number() -> None:
    class Flag(enum.IntEnum):
        PICKLED = 4

    assert storage_command(b"set", b"k", b"v", flags=Flag.PICKLED) == b"set k 4 0 1\r\nv\r\n"
    assert incr_command(b"k", Flag.PICKLED) == b"incr k 4\r\n"


# -- cas --------------------------------------------------------------------------------------


def test_cas() -> None:
    assert cas_command(b"k", b"hello", 99) == b"cas k 0 0 5 99\r\nhello\r\n"
    assert cas_command(b"k", b"hi", 2**64 - 1, flags=3, exptime=-1, noreply=True) == (
        b"cas k 3 -1 2 18446744073709551615 noreply\r\nhi\r\n"
    )
    assert cas_command(b"k", bytearray(b"x"), 0) == b"cas k 0 0 1 0\r\nx\r\n"


@pytest.mark.parametrize("cas_unique", [-1, 2**64, 1.0, True, None, "5"])
def test_cas_unique_out_of_range_or_wrong_type(cas_unique: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="cas_unique"):
        cas_command(b"k", b"v", cas_unique)


def test_cas_validates_key_and_value() -> None:
    with pytest.raises(InvalidKeyError):
        cas_command(b"a b", b"v", 1)
    with pytest.raises(InvalidArgumentError):
        cas_command(b"k", "v", 1)  # type: ignore[arg-type]


# -- single-line commands ---------------------------------------------------------------------


def test_delete() -> None:
    assert delete_command(b"k") == b"delete k\r\n"
    assert delete_command(b"k", noreply=True) == b"delete k noreply\r\n"


def test_touch() -> None:
    assert touch_command(b"k", 10) == b"touch k 10\r\n"
    assert touch_command(b"k", 10, noreply=True) == b"touch k 10 noreply\r\n"


@pytest.mark.parametrize(("encode", "verb"), [(incr_command, b"incr"), (decr_command, b"decr")])
def test_arithmetic(encode: Callable[..., bytes], verb: bytes) -> None:
    assert encode(b"n", 1) == verb + b" n 1\r\n"
    assert encode(b"n", 0) == verb + b" n 0\r\n"
    assert encode(b"n", 2**64 - 1) == verb + b" n 18446744073709551615\r\n"
    assert encode(b"n", 5, noreply=True) == verb + b" n 5 noreply\r\n"


@pytest.mark.parametrize("encode", [incr_command, decr_command])
@pytest.mark.parametrize("delta", [-1, 2**64, 1.0, True, False, "1", None])
def test_arithmetic_refuses_bad_delta(encode: Callable[..., bytes], delta: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="delta"):
        encode(b"n", delta)


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_single_key_commands_validate_the_key(bad: Any) -> None:
    with pytest.raises(InvalidKeyError):
        delete_command(bad)
    with pytest.raises(InvalidKeyError):
        touch_command(bad, 1)
    with pytest.raises(InvalidKeyError):
        incr_command(bad, 1)
    with pytest.raises(InvalidKeyError):
        decr_command(bad, 1)
    with pytest.raises(InvalidKeyError):
        cas_command(bad, b"v", 1)


def test_flush_all() -> None:
    assert flush_all_command() == b"flush_all\r\n"
    assert flush_all_command(0) == b"flush_all\r\n"
    assert flush_all_command(30) == b"flush_all 30\r\n"
    assert flush_all_command(noreply=True) == b"flush_all noreply\r\n"
    assert flush_all_command(30, noreply=True) == b"flush_all 30 noreply\r\n"


@pytest.mark.parametrize("delay", [-1, 2**31, 1.5, True, "0", None])
def test_flush_all_refuses_bad_delay(delay: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="delay"):
        flush_all_command(delay)


def test_version() -> None:
    assert version_command() == b"version\r\n"


def test_stats() -> None:
    assert stats_command() == b"stats\r\n"
    assert stats_command("items") == b"stats items\r\n"
    assert stats_command("cachedump", "1", "10") == b"stats cachedump 1 10\r\n"


@pytest.mark.parametrize("arg", ["", "two words", "line\r\n", "nul\x00", "del\x7f", "x" * 251])
def test_stats_refuses_arguments_that_would_break_the_line(arg: str) -> None:
    with pytest.raises(InvalidArgumentError, match="stats argument"):
        stats_command(arg)
    with pytest.raises(InvalidArgumentError, match="stats argument"):
        stats_command("items", arg)


@pytest.mark.parametrize("arg", [b"items", 1, None])
def test_stats_arguments_must_be_str(arg: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="must be str"):
        stats_command(arg)


def test_verbosity() -> None:
    assert verbosity_command(1) == b"verbosity 1\r\n"
    assert verbosity_command(0, noreply=True) == b"verbosity 0 noreply\r\n"


def test_cache_memlimit() -> None:
    assert cache_memlimit_command(64) == b"cache_memlimit 64\r\n"
    assert cache_memlimit_command(1024, noreply=True) == b"cache_memlimit 1024 noreply\r\n"


@pytest.mark.parametrize("bad", [-1, 2**32, 1.0, True, "1", None])
def test_level_and_megabytes_must_be_non_negative_ints(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="level"):
        verbosity_command(bad)
    with pytest.raises(InvalidArgumentError, match="megabytes"):
        cache_memlimit_command(bad)


# -- properties -------------------------------------------------------------------------------


@given(
    verb=st.sampled_from(STORAGE_VERBS),
    key=valid_keys,
    value=tricky_values,
    flags=st.integers(0, 2**32 - 1),
    exptime=st.integers(-(2**31), 2**31 - 1),
    noreply=st.booleans(),
)
def test_storage_command_layout(
    verb: bytes, key: bytes, value: bytes, flags: int, exptime: int, noreply: bool
) -> None:
    command = storage_command(verb, key, value, flags=flags, exptime=exptime, noreply=noreply)
    header_fields = [
        verb,
        key,
        str(flags).encode(),
        str(exptime).encode(),
        str(len(value)).encode(),
    ]
    if noreply:
        header_fields.append(b"noreply")
    assert command == b" ".join(header_fields) + b"\r\n" + value + b"\r\n"
    # A server reads the header up to the first CRLF, then exactly <bytes> bytes.
    header, _, rest = command.partition(b"\r\n")
    assert int(header.split(b" ")[4]) == len(value)
    assert rest[: len(value)] == value
    assert rest[len(value) :] == b"\r\n"


@given(key=valid_keys, value=tricky_values, cas_unique=st.integers(0, 2**64 - 1))
def test_cas_command_layout(key: bytes, value: bytes, cas_unique: int) -> None:
    command = cas_command(key, value, cas_unique)
    header = b"cas %s 0 0 %d %d\r\n" % (key, len(value), cas_unique)
    assert command == header + value + b"\r\n"


@given(keys=st.lists(valid_keys, min_size=1, max_size=20), cas=st.booleans())
def test_get_command_layout(keys: list[bytes], cas: bool) -> None:
    expected = (b"gets" if cas else b"get") + b"".join(b" " + key for key in keys) + b"\r\n"
    assert get_command(keys, cas=cas) == expected
    assert get_command(tuple(keys), cas=cas) == expected


@given(
    key=valid_keys,
    forbidden=st.sampled_from(FORBIDDEN),
    data=st.data(),
)
def test_any_forbidden_byte_in_a_key_is_refused_by_every_encoder(
    key: bytes, forbidden: int, data: st.DataObject
) -> None:
    position = data.draw(st.integers(0, len(key)))
    bad = key[:position] + bytes([forbidden]) + key[position:]
    encoders: list[Callable[[], bytes]] = [
        lambda: get_command([bad]),
        lambda: get_command([b"ok", bad]),
        lambda: gat_command([bad], 1),
        lambda: storage_command(b"set", bad, b"v"),
        lambda: cas_command(bad, b"v", 1),
        lambda: delete_command(bad),
        lambda: touch_command(bad, 1),
        lambda: incr_command(bad, 1),
        lambda: decr_command(bad, 1),
    ]
    for encode in encoders:
        with pytest.raises(InvalidKeyError):
            encode()


@given(flags=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)))
def test_any_flags_outside_32_bits_are_refused(flags: int) -> None:
    with pytest.raises(InvalidArgumentError):
        storage_command(b"set", b"k", b"v", flags=flags)


@given(delta=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64)))
def test_any_delta_outside_64_bits_is_refused(delta: int) -> None:
    with pytest.raises(InvalidArgumentError):
        incr_command(b"k", delta)


@given(exptime=st.floats(allow_nan=True, allow_infinity=True))
def test_float_exptime_is_always_refused(exptime: float) -> None:
    with pytest.raises(InvalidArgumentError):
        storage_command(b"set", b"k", b"v", exptime=exptime)  # type: ignore[arg-type]
