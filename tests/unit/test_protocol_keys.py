"""validate_key: what memcached's text protocol can carry as a key, and what it cannot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_fastcache.errors import InvalidKeyError
from django_fastcache.protocol.keys import MAX_KEY_LENGTH, key_problem, validate_key

# Bytes the protocol forbids in keys: all control bytes, space, and DEL.
FORBIDDEN = [*range(0x00, 0x21), 0x7F]
ALLOWED = [b for b in range(256) if b not in FORBIDDEN]


def is_valid_reference(key: bytes, max_length: int = 250) -> bool:
    """A deliberately naive statement of the rule, to check the fast version against."""
    if len(key) == 0 or len(key) > max_length:
        return False
    return all(0x20 < byte != 0x7F for byte in key)


def test_max_key_length_is_memcacheds_limit() -> None:
    assert MAX_KEY_LENGTH == 250


@pytest.mark.parametrize(
    "key",
    [b"a", b"user:42", b"x" * 250, b"caf\xc3\xa9", b"\x80\xff", b"!~", bytes(ALLOWED[:250])],
)
def test_valid_keys_come_back_unchanged(key: bytes) -> None:
    assert validate_key(key) is key
    assert key_problem(key) is None


def test_every_allowed_byte_is_accepted() -> None:
    for start in range(0, len(ALLOWED), 250):
        chunk = bytes(ALLOWED[start : start + 250])
        assert validate_key(chunk) == chunk


@pytest.mark.parametrize("byte", FORBIDDEN)
@pytest.mark.parametrize("where", ["start", "middle", "end", "alone"])
def test_every_forbidden_byte_is_refused_anywhere(byte: int, where: str) -> None:
    bad = bytes([byte])
    key = {"start": bad + b"key", "middle": b"ke" + bad + b"y", "end": b"key" + bad, "alone": bad}[
        where
    ]
    with pytest.raises(InvalidKeyError, match="spaces and control bytes"):
        validate_key(key)


def test_message_points_at_the_offending_byte() -> None:
    with pytest.raises(InvalidKeyError) as caught:
        validate_key(b"abc def")
    assert "offset 3" in str(caught.value)
    assert "b' '" in str(caught.value)
    assert "b'abc def'" in str(caught.value)


def test_empty_key_is_refused() -> None:
    with pytest.raises(InvalidKeyError, match="empty"):
        validate_key(b"")


def test_length_limit_counts_bytes() -> None:
    assert validate_key(b"k" * 250) == b"k" * 250
    with pytest.raises(InvalidKeyError, match="251 bytes"):
        validate_key(b"k" * 251)
    # 125 two-byte UTF-8 characters are 250 bytes: fine. One more is not.
    assert validate_key("é".encode() * 125) == "é".encode() * 125
    with pytest.raises(InvalidKeyError, match="252 bytes"):
        validate_key("é".encode() * 126)


def test_long_key_message_is_shortened() -> None:
    with pytest.raises(InvalidKeyError) as caught:
        validate_key(b"z" * 10_000)
    assert len(str(caught.value)) < 200


def test_custom_max_length() -> None:
    assert validate_key(b"abcd", max_length=4) == b"abcd"
    with pytest.raises(InvalidKeyError):
        validate_key(b"abcde", max_length=4)
    assert validate_key(b"k" * 300, max_length=300) == b"k" * 300


def test_str_is_refused() -> None:
    with pytest.raises(InvalidKeyError, match="keys must be bytes, got str"):
        validate_key("key")  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [bytearray(b"key"), memoryview(b"key"), 42, None, [b"key"]])
def test_other_types_are_refused(key: object) -> None:
    with pytest.raises(InvalidKeyError, match="keys must be bytes"):
        validate_key(key)  # type: ignore[arg-type]


def test_bytes_subclass_is_accepted() -> None:
    class Key(bytes):
        pass

    key = Key(b"sub")
    assert validate_key(key) is key


def test_invalid_key_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_key(b"a b")


@given(st.binary(max_size=300))
def test_matches_the_reference_rule_on_arbitrary_bytes(key: bytes) -> None:
    if is_valid_reference(key):
        assert validate_key(key) is key
        assert key_problem(key) is None
    else:
        with pytest.raises(InvalidKeyError):
            validate_key(key)
        assert key_problem(key) is not None


@given(
    st.lists(st.sampled_from(ALLOWED), min_size=1, max_size=249).map(bytes),
    st.sampled_from(FORBIDDEN),
    st.data(),
)
def test_one_forbidden_byte_spoils_any_valid_key(
    key: bytes, byte: int, data: st.DataObject
) -> None:
    position = data.draw(st.integers(0, len(key)))
    spoiled = key[:position] + bytes([byte]) + key[position:]
    with pytest.raises(InvalidKeyError, match=f"offset {position}"):
        validate_key(spoiled)
