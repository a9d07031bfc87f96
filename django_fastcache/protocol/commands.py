"""Request encoders for memcached's text protocol.

Each function validates its arguments and returns the complete request as ``bytes``, ready
to be written to the connection. Nothing is sent when an argument is refused: the caller
gets InvalidKeyError or InvalidArgumentError instead.

The range checks are not only tidiness: memcached truncates an out-of-range flags or expiry
field to 32 bits instead of refusing it, and when it does refuse a storage header it reads
the data block that follows as a new command, putting the connection out of step.
"""

from __future__ import annotations

from collections.abc import Sequence

from django_fastcache.errors import InvalidArgumentError
from django_fastcache.protocol.keys import MAX_KEY_LENGTH, key_problem, validate_key

Value = bytes | bytearray | memoryview

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
# memcached parses expiry times into a signed 32-bit int; larger ones wrap around silently.
EXPTIME_MIN = -(2**31)
EXPTIME_MAX = 2**31 - 1

STORAGE_VERBS = frozenset((b"set", b"add", b"replace", b"append", b"prepend"))

_CRLF = b"\r\n"
_NOREPLY_CRLF = b" noreply\r\n"


def get_command(keys: Sequence[bytes], *, cas: bool = False, checked: bool = False) -> bytes:
    """``get <key>*`` (or ``gets`` with ``cas=True``, to learn each item's cas unique).

    ``checked=True`` says every key was validated already (by :func:`validate_key`)."""
    verb = b"gets " if cas else b"get "
    # Fast path for the commonest call, one key; everything else is checked in full.
    if len(keys) == 1 and type(keys) in (list, tuple):
        return verb + validate_key(keys[0]) + _CRLF
    return verb + (b" ".join(keys) if checked else _joined_keys(keys)) + _CRLF


def gat_command(
    keys: Sequence[bytes], exptime: int, *, cas: bool = False, checked: bool = False
) -> bytes:
    """``gat <exptime> <key>*``: fetch and touch (``gats`` with ``cas=True``).

    ``checked=True`` says every key was validated already (by :func:`validate_key`)."""
    exptime = _checked_int("exptime", exptime, EXPTIME_MIN, EXPTIME_MAX)
    verb = b"gats %d " if cas else b"gat %d "
    return verb % exptime + (b" ".join(keys) if checked else _joined_keys(keys)) + _CRLF


def storage_command(
    verb: bytes,
    key: bytes,
    value: Value,
    *,
    flags: int = 0,
    exptime: int = 0,
    noreply: bool = False,
) -> bytes:
    """``<verb> <key> <flags> <exptime> <bytes> [noreply]`` and the data block.

    ``verb`` is one of set, add, replace, append, prepend (use cas_command for cas).
    """
    if type(verb) is not bytes or verb not in STORAGE_VERBS:
        raise InvalidArgumentError(
            f"storage verb must be one of {sorted(STORAGE_VERBS)}, got {verb!r}"
        )
    validate_key(key)
    # Cheap inline checks for the common case; the helpers produce the error messages.
    if type(flags) is not int or not 0 <= flags <= UINT32_MAX:
        flags = _checked_int("flags", flags, 0, UINT32_MAX)
    if type(exptime) is not int or not EXPTIME_MIN <= exptime <= EXPTIME_MAX:
        exptime = _checked_int("exptime", exptime, EXPTIME_MIN, EXPTIME_MAX)
    if type(value) is not bytes:
        value = _value_bytes(value)
    header = b"%s %s %d %d %d" % (verb, key, flags, exptime, len(value))
    return b"".join((header, _NOREPLY_CRLF if noreply else _CRLF, value, _CRLF))


def cas_command(
    key: bytes,
    value: Value,
    cas_unique: int,
    *,
    flags: int = 0,
    exptime: int = 0,
    noreply: bool = False,
) -> bytes:
    """``cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`` and the data block."""
    validate_key(key)
    flags = _checked_int("flags", flags, 0, UINT32_MAX)
    exptime = _checked_int("exptime", exptime, EXPTIME_MIN, EXPTIME_MAX)
    cas_unique = _checked_int("cas_unique", cas_unique, 0, UINT64_MAX)
    data = _value_bytes(value)
    header = b"cas %s %d %d %d %d" % (key, flags, exptime, len(data), cas_unique)
    return b"".join((header, _NOREPLY_CRLF if noreply else _CRLF, data, _CRLF))


def delete_command(key: bytes, *, noreply: bool = False) -> bytes:
    """``delete <key> [noreply]``."""
    return b"delete " + validate_key(key) + (_NOREPLY_CRLF if noreply else _CRLF)


def touch_command(key: bytes, exptime: int, *, noreply: bool = False) -> bytes:
    """``touch <key> <exptime> [noreply]``."""
    validate_key(key)
    exptime = _checked_int("exptime", exptime, EXPTIME_MIN, EXPTIME_MAX)
    return b"touch %s %d%s" % (key, exptime, _NOREPLY_CRLF if noreply else _CRLF)


def incr_command(key: bytes, delta: int, *, noreply: bool = False) -> bytes:
    """``incr <key> <delta> [noreply]``; memcached wraps the counter at 2**64."""
    return _arithmetic_command(b"incr", key, delta, noreply)


def decr_command(key: bytes, delta: int, *, noreply: bool = False) -> bytes:
    """``decr <key> <delta> [noreply]``; memcached stops the counter at 0."""
    return _arithmetic_command(b"decr", key, delta, noreply)


def flush_all_command(delay: int = 0, *, noreply: bool = False) -> bytes:
    """``flush_all [delay] [noreply]``: invalidate every item, now or in ``delay`` seconds."""
    delay = _checked_int("delay", delay, 0, EXPTIME_MAX)
    ending = _NOREPLY_CRLF if noreply else _CRLF
    if delay == 0:
        return b"flush_all" + ending
    return b"flush_all %d%s" % (delay, ending)


def version_command() -> bytes:
    """``version``."""
    return b"version\r\n"


def stats_command(*args: str) -> bytes:
    """``stats [args]``, e.g. ``stats_command("items")`` for ``stats items``."""
    if not args:
        return b"stats\r\n"
    return b"stats " + b" ".join([_stats_argument(arg) for arg in args]) + _CRLF


def verbosity_command(level: int, *, noreply: bool = False) -> bytes:
    """``verbosity <level> [noreply]``."""
    level = _checked_int("level", level, 0, UINT32_MAX)
    return b"verbosity %d%s" % (level, _NOREPLY_CRLF if noreply else _CRLF)


def cache_memlimit_command(megabytes: int, *, noreply: bool = False) -> bytes:
    """``cache_memlimit <megabytes> [noreply]``: resize the server's item memory."""
    megabytes = _checked_int("megabytes", megabytes, 0, UINT32_MAX)
    return b"cache_memlimit %d%s" % (megabytes, _NOREPLY_CRLF if noreply else _CRLF)


def _arithmetic_command(verb: bytes, key: bytes, delta: int, noreply: bool) -> bytes:
    validate_key(key)
    delta = _checked_int("delta", delta, 0, UINT64_MAX)
    return b"%s %s %d%s" % (verb, key, delta, _NOREPLY_CRLF if noreply else _CRLF)


def _joined_keys(keys: Sequence[bytes]) -> bytes:
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise InvalidArgumentError(
            f"expected a sequence of keys, got a single {type(keys).__name__}"
        )
    if not keys:
        raise InvalidArgumentError("at least one key is required")
    for key in keys:
        validate_key(key)
    return b" ".join(keys)


def _checked_int(name: str, value: object, low: int, high: int) -> int:
    # bool is an int subclass, but True as an expiry time is a caller's mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _value_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        # The header announces a length in bytes, whatever the memoryview's item format.
        return bytes(value)
    raise InvalidArgumentError(
        f"values must be bytes, bytearray or memoryview, got {type(value).__name__}"
    )


def _stats_argument(arg: object) -> bytes:
    if not isinstance(arg, str):
        raise InvalidArgumentError(f"stats arguments must be str, got {type(arg).__name__}")
    problem = key_problem(arg.encode("utf-8"), MAX_KEY_LENGTH)
    if problem is not None:
        raise InvalidArgumentError(f"invalid stats argument {arg!r}: it {problem}")
    return arg.encode("utf-8")


__all__ = [
    "EXPTIME_MAX",
    "EXPTIME_MIN",
    "STORAGE_VERBS",
    "UINT32_MAX",
    "UINT64_MAX",
    "Value",
    "cache_memlimit_command",
    "cas_command",
    "decr_command",
    "delete_command",
    "flush_all_command",
    "gat_command",
    "get_command",
    "incr_command",
    "stats_command",
    "storage_command",
    "touch_command",
    "verbosity_command",
]
