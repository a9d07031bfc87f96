"""A sealed value opens only with its own tag: every bit of the tag counts but the first
byte's high bit (set when stored, so that no tag reads as a number to incr/decr)."""

from __future__ import annotations

import pytest

from django_fastcache.sealing import FLAG_SEALED, TAG_SIZE, Sealer, derive_key

KEY = b":1:greeting"
PAYLOAD = b"\x80\x05\x95hello, sealed world"


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(derive_key("a secret of the site"))


def test_a_sealed_value_opens_as_it_was(sealer: Sealer) -> None:
    stored, flags = sealer.seal(KEY, PAYLOAD, 1)
    assert flags == 1 | FLAG_SEALED
    assert stored[0] & 0x80
    assert sealer.open(KEY, stored, flags) == (PAYLOAD, 1)


@pytest.mark.parametrize("position", range(TAG_SIZE))
def test_a_tag_with_any_bit_flipped_is_refused_but_the_first_byte_s_high_bit(
    sealer: Sealer, position: int
) -> None:
    stored, flags = sealer.seal(KEY, PAYLOAD, 1)
    refused_before = sealer.refusals.count
    for bit in range(8):
        tampered = bytearray(stored)
        tampered[position] ^= 1 << bit
        opened = sealer.open(KEY, bytes(tampered), flags)
        if position == 0 and bit == 7:
            assert opened == (PAYLOAD, 1)  # a tag stored as the hash made it
        else:
            assert opened is None, f"byte {position}, bit {bit} flipped, and it opened"
    flipped_and_refused = 7 if position == 0 else 8
    assert sealer.refusals.count - refused_before == flipped_and_refused


def test_a_value_shorter_than_a_tag_is_refused(sealer: Sealer) -> None:
    stored, flags = sealer.seal(KEY, PAYLOAD, 1)
    for length in (0, 1, TAG_SIZE - 1):
        assert sealer.open(KEY, stored[:length], flags) is None


def test_a_rotated_out_secret_s_tag_opens_with_any_bit_flipped_refused() -> None:
    old = Sealer(derive_key("the secret before"))
    new = Sealer(derive_key("the secret now"), fallbacks=(derive_key("the secret before"),))
    stored, flags = old.seal(KEY, PAYLOAD, 1)
    assert new.open(KEY, stored, flags) == (PAYLOAD, 1)
    tampered = bytearray(stored)
    tampered[TAG_SIZE - 1] ^= 1
    assert new.open(KEY, bytes(tampered), flags) is None
