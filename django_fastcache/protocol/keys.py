"""Key validation for memcached's text protocol.

A key travels inside a space-separated command line, so it cannot hold a space, a line
break or any other control byte, and memcached refuses keys longer than 250 bytes.
"""

from __future__ import annotations

import re

from django_fastcache.errors import InvalidKeyError

MAX_KEY_LENGTH = 250

# Everything up to and including space, plus DEL. Bytes >= 0x80 are legal on the wire.
_FORBIDDEN_BYTE = re.compile(rb"[\x00-\x20\x7f]")

_SHOWN_BYTES = 40


def key_problem(key: object, max_length: int = MAX_KEY_LENGTH) -> str | None:
    """Say what makes ``key`` unsendable as a protocol token, or return None if nothing does.

    The message describes the problem without naming the token, so callers can reuse it for
    other space-separated arguments.
    """
    if not isinstance(key, bytes):
        return f"must be bytes, got {type(key).__name__}"
    if not key:
        return "must not be empty"
    if len(key) > max_length:
        return f"is {len(key)} bytes long, over the limit of {max_length}"
    forbidden = _FORBIDDEN_BYTE.search(key)
    if forbidden is not None:
        return (
            f"contains {forbidden.group()!r} at offset {forbidden.start()}"
            " (spaces and control bytes are not allowed)"
        )
    return None


def validate_key(key: bytes, max_length: int = MAX_KEY_LENGTH) -> bytes:
    """Return ``key`` unchanged, or raise InvalidKeyError if memcached cannot carry it."""
    # Every request passes through here: one type check, one length check, one C-level scan.
    if type(key) is bytes and 0 < len(key) <= max_length and _FORBIDDEN_BYTE.search(key) is None:
        return key
    problem = key_problem(key, max_length)
    if problem is None:
        # A bytes subclass that passes every check is still a valid key.
        return key
    if not isinstance(key, bytes):
        raise InvalidKeyError(f"keys {problem}")
    raise InvalidKeyError(f"invalid key {show_bytes(key)}: it {problem}")


def show_bytes(data: bytes | bytearray | memoryview, limit: int = _SHOWN_BYTES) -> str:
    """A short repr of ``data`` for error messages, cut after ``limit`` bytes."""
    shown = bytes(data[:limit])
    if len(data) <= limit:
        return repr(shown)
    return f"{shown!r}... ({len(data)} bytes)"


__all__ = ["MAX_KEY_LENGTH", "key_problem", "show_bytes", "validate_key"]
