"""memcached's meta protocol (``mg``, ``ms``, ``md``, ``ma``, ``mn``) without any I/O.

The encoders validate their arguments and return the whole request as ``bytes``, or raise
InvalidKeyError / InvalidArgumentError and send nothing, like the classic encoders.

Replies are read by :func:`read_meta_replies`: every meta reply up to the ``MN`` that
answers a trailing ``mn``. A request made of meta commands therefore always ends with
``mn`` (:func:`meta_noop_command`), quiet or not: with ``q`` a miss sends nothing at all,
so only the ``MN`` tells where the answer ends. Values are read by their declared length,
never by looking for a marker.

An ``ERROR`` line inside a meta reply means the server does not know the command: a
server without meta support answers every line of the request that way (an ``ms`` data
block included), so there is no telling where its answer ends. That breaks the stream
(:class:`MetaUnsupportedError`) instead of coming back as a reply.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections.abc import Sequence
from typing import NamedTuple

from django_fastcache.errors import (
    ClientError,
    CommandError,
    InvalidArgumentError,
    InvalidKeyError,
    ProtocolError,
    ReplyTooLargeError,
    ServerError,
    ValueTooLargeError,
)
from django_fastcache.protocol.commands import _checked_int, _value_bytes
from django_fastcache.protocol.keys import MAX_KEY_LENGTH, key_problem, show_bytes, validate_key

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
# TTL tokens are parsed by memcached into a signed 32-bit int.
_TTL_MIN = -(2**31)
_TTL_MAX = 2**31 - 1
#: memcached refuses longer opaque tokens (``CLIENT_ERROR opaque token too long``).
MAX_OPAQUE_LENGTH = 32
#: The raw key of a ``b`` (base64) request whose encoding still fits memcached's key limit.
MAX_BINARY_KEY_LENGTH = MAX_KEY_LENGTH // 4 * 3

_CRLF = b"\r\n"
_NOOP = b"mn\r\n"
_SHOWN_BYTES = 60

_SET_MODES = {"set": b"S", "add": b"E", "replace": b"R", "append": b"A", "prepend": b"P"}
_ARITHMETIC_MODES = {"incr": b"I", "decr": b"D"}


class MetaStatus(enum.Enum):
    """The two-letter code a meta reply starts with; each value is the code itself."""

    VA = b"VA"  # a value follows (mg with v, ma with v)
    HD = b"HD"  # success without a value (hit, stored, deleted, counted)
    EN = b"EN"  # mg: miss
    NS = b"NS"  # not stored (ms add/replace/append refused, ma vivify failed)
    EX = b"EX"  # the CAS given (C) does not match the item's
    NF = b"NF"  # not found (ms with C, md, ma without N)
    MN = b"MN"  # the answer to mn: everything before it is answered


class MetaReply(NamedTuple):
    """One meta reply with its return flags decoded; a field is None when not asked for.

    ``win`` (``W``): this caller won the right to recompute the item (``N`` on a miss,
    ``R`` near expiry, or a stale item). ``stale`` (``X``): the item was invalidated
    (``md … I``) and its value is old. ``won_elsewhere`` (``Z``): another caller already
    holds the win. ``other`` keeps return flags this module does not know, verbatim.
    """

    status: MetaStatus
    value: bytes | None = None
    cas: int | None = None
    client_flags: int | None = None
    ttl: int | None = None  # seconds left, -1 for none
    size: int | None = None
    key: bytes | None = None  # decoded when the server marked it base64 (``b``)
    opaque: bytes | None = None
    hit: bool | None = None  # whether the item had been read before this request
    last_access: int | None = None  # seconds since it was last read
    win: bool = False
    stale: bool = False
    won_elsewhere: bool = False
    other: tuple[bytes, ...] = ()


#: One reply of a meta request: a MetaReply, or the error line that answered its command.
MetaResult = MetaReply | CommandError


class MetaUnsupportedError(ProtocolError):
    """The server answered a meta command with ``ERROR``: it does not speak meta."""


# -- encoders ------------------------------------------------------------------------------


def meta_get_command(
    key: bytes,
    *,
    value: bool = True,
    cas: bool = False,
    client_flags: bool = False,
    ttl: bool = False,
    size: bool = False,
    return_key: bool = False,
    hit: bool = False,
    last_access: bool = False,
    no_bump: bool = False,
    touch: int | None = None,
    vivify: int | None = None,
    recache: int | None = None,
    opaque: bytes | None = None,
    quiet: bool = False,
    base64_key: bool = False,
) -> bytes:
    """``mg <key> <flags>*``.

    ``value`` (``v``), ``cas`` (``c``), ``client_flags`` (``f``), ``ttl`` (``t``),
    ``size`` (``s``), ``return_key`` (``k``), ``hit`` (``h``), ``last_access`` (``l``) ask
    for those in the reply; ``no_bump`` (``u``) leaves the LRU and access data alone.
    ``touch`` (``T``) sets a new TTL on a hit. ``vivify`` (``N``): on a miss create an
    empty item with this TTL and hand this caller the win (``W``); later callers see
    ``Z``. ``recache`` (``R``): win when the item's TTL left is below this. ``quiet``
    (``q``): a miss sends nothing. ``base64_key`` (``b``): ``key`` is raw binary (any
    bytes) and travels base64-encoded.
    """
    parts = [b"mg", _key_token(key, base64_key)]
    if base64_key:
        parts.append(b"b")
    _add_flags(
        parts,
        ("value", value, b"v"),
        ("cas", cas, b"c"),
        ("client_flags", client_flags, b"f"),
        ("ttl", ttl, b"t"),
        ("size", size, b"s"),
        ("return_key", return_key, b"k"),
        ("hit", hit, b"h"),
        ("last_access", last_access, b"l"),
        ("no_bump", no_bump, b"u"),
        ("quiet", quiet, b"q"),
    )
    _add_int(parts, b"T", "touch", touch, _TTL_MIN, _TTL_MAX)
    _add_int(parts, b"N", "vivify", vivify, _TTL_MIN, _TTL_MAX)
    _add_int(parts, b"R", "recache", recache, _TTL_MIN, _TTL_MAX)
    _add_opaque(parts, opaque)
    return b" ".join(parts) + _CRLF


def meta_get_many_command(
    keys: Sequence[bytes], *, cas: bool = False, base64_key: bool = False
) -> bytes:
    """Quiet ``mg <key> v f k q`` (``c`` too with ``cas``) for each key, then ``mn``: hits
    come back with their key, misses send nothing, and ``MN`` ends the answer."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise InvalidArgumentError(
            f"expected a sequence of keys, got a single {type(keys).__name__}"
        )
    suffix = b" v f k c q\r\n" if _flag("cas", cas) else b" v f k q\r\n"
    if _flag("base64_key", base64_key):
        suffix = b" b" + suffix
        tokens = [_key_token(key, True) for key in keys]
    else:
        tokens = [validate_key(key) for key in keys]
    return b"".join([b"mg " + token + suffix for token in tokens]) + _NOOP


def meta_set_command(
    key: bytes,
    value: bytes | bytearray | memoryview,
    *,
    client_flags: int = 0,
    ttl: int | None = None,
    mode: str = "set",
    compare_cas: int | None = None,
    invalidate: bool = False,
    vivify: int | None = None,
    return_cas: bool = False,
    return_key: bool = False,
    opaque: bytes | None = None,
    quiet: bool = False,
    base64_key: bool = False,
) -> bytes:
    """``ms <key> <datalen> <flags>*`` and the data block.

    ``client_flags`` (``F``) and ``ttl`` (``T``, None for no expiry) are stored with the
    value. ``mode`` (``M``): set, add, replace, append or prepend. ``compare_cas``
    (``C``): store only if the item's CAS is this one; with ``invalidate`` (``I``) an
    older CAS is accepted too and the item is stored stale. ``vivify`` (``N``), append
    and prepend modes only: on a miss create the item with this TTL (memcached 1.6.20+).
    ``return_cas`` (``c``) and ``return_key`` (``k``) ask for those; ``quiet`` (``q``)
    suppresses ``HD``.
    """
    data = _value_bytes(value)
    parts = [b"ms", _key_token(key, base64_key), b"%d" % len(data)]
    if base64_key:
        parts.append(b"b")
    mode_token = _SET_MODES.get(mode) if type(mode) is str else None
    if mode_token is None:
        raise InvalidArgumentError(f"mode must be one of {sorted(_SET_MODES)}, got {mode!r}")
    if mode_token != b"S":
        parts.append(b"M" + mode_token)
    if _checked_int("client_flags", client_flags, 0, _UINT32_MAX):
        parts.append(b"F%d" % client_flags)
    _add_int(parts, b"T", "ttl", ttl, _TTL_MIN, _TTL_MAX)
    _add_int(parts, b"C", "compare_cas", compare_cas, 0, _UINT64_MAX)
    if _flag("invalidate", invalidate):
        if compare_cas is None:
            raise InvalidArgumentError("invalidate needs compare_cas: it acts on an old CAS")
        parts.append(b"I")
    if vivify is not None and mode not in ("append", "prepend"):
        raise InvalidArgumentError(f"vivify applies to append and prepend modes, not {mode!r}")
    _add_int(parts, b"N", "vivify", vivify, _TTL_MIN, _TTL_MAX)
    _add_flags(
        parts,
        ("return_cas", return_cas, b"c"),
        ("return_key", return_key, b"k"),
        ("quiet", quiet, b"q"),
    )
    _add_opaque(parts, opaque)
    return b"".join((b" ".join(parts), _CRLF, data, _CRLF))


def meta_delete_command(
    key: bytes,
    *,
    compare_cas: int | None = None,
    invalidate: bool = False,
    ttl: int | None = None,
    return_key: bool = False,
    opaque: bytes | None = None,
    quiet: bool = False,
    base64_key: bool = False,
) -> bytes:
    """``md <key> <flags>*``.

    ``compare_cas`` (``C``): delete only if the item's CAS is this one. ``invalidate``
    (``I``): keep the item but mark it stale and give it a new CAS, so readers see ``X``
    and one of them wins the recompute; ``ttl`` (``T``, with ``invalidate`` only) bounds
    how long the stale item lives. ``quiet`` (``q``) suppresses ``HD``.
    """
    parts = [b"md", _key_token(key, base64_key)]
    if base64_key:
        parts.append(b"b")
    _add_int(parts, b"C", "compare_cas", compare_cas, 0, _UINT64_MAX)
    if _flag("invalidate", invalidate):
        parts.append(b"I")
    if ttl is not None and not invalidate:
        raise InvalidArgumentError("ttl applies to an invalidating delete only")
    _add_int(parts, b"T", "ttl", ttl, _TTL_MIN, _TTL_MAX)
    _add_flags(parts, ("return_key", return_key, b"k"), ("quiet", quiet, b"q"))
    _add_opaque(parts, opaque)
    return b" ".join(parts) + _CRLF


def meta_arithmetic_command(
    key: bytes,
    *,
    mode: str = "incr",
    delta: int = 1,
    initial: int | None = None,
    vivify: int | None = None,
    ttl: int | None = None,
    compare_cas: int | None = None,
    value: bool = True,
    cas: bool = False,
    return_ttl: bool = False,
    return_key: bool = False,
    opaque: bytes | None = None,
    quiet: bool = False,
    base64_key: bool = False,
) -> bytes:
    """``ma <key> <flags>*``: add or subtract ``delta`` (``D``) atomically.

    ``mode`` (``M``): incr or decr (memcached stops a decrement at 0 and wraps an
    increment at 2**64). ``vivify`` (``N``): on a miss create the counter with this TTL,
    starting at ``initial`` (``J``, default 0). ``ttl`` (``T``) sets a new TTL on success;
    without it the item keeps its own. ``compare_cas`` (``C``): count only if the CAS
    matches. ``value`` (``v``), ``cas`` (``c``), ``return_ttl`` (``t``) ask for those.
    """
    parts = [b"ma", _key_token(key, base64_key)]
    if base64_key:
        parts.append(b"b")
    mode_token = _ARITHMETIC_MODES.get(mode) if type(mode) is str else None
    if mode_token is None:
        raise InvalidArgumentError(f"mode must be one of {sorted(_ARITHMETIC_MODES)}, got {mode!r}")
    if mode_token != b"I":
        parts.append(b"M" + mode_token)
    if _checked_int("delta", delta, 0, _UINT64_MAX) != 1:
        parts.append(b"D%d" % delta)
    if initial is not None and vivify is None:
        raise InvalidArgumentError("initial needs vivify: it seeds a counter created on a miss")
    _add_int(parts, b"N", "vivify", vivify, _TTL_MIN, _TTL_MAX)
    _add_int(parts, b"J", "initial", initial, 0, _UINT64_MAX)
    _add_int(parts, b"T", "ttl", ttl, _TTL_MIN, _TTL_MAX)
    _add_int(parts, b"C", "compare_cas", compare_cas, 0, _UINT64_MAX)
    _add_flags(
        parts,
        ("value", value, b"v"),
        ("cas", cas, b"c"),
        ("return_ttl", return_ttl, b"t"),
        ("return_key", return_key, b"k"),
        ("quiet", quiet, b"q"),
    )
    _add_opaque(parts, opaque)
    return b" ".join(parts) + _CRLF


def meta_noop_command() -> bytes:
    """``mn``: answered ``MN`` once every command before it is answered."""
    return _NOOP


def _key_token(key: object, base64_key: object) -> bytes:
    if _flag("base64_key", base64_key):
        if not isinstance(key, bytes) or not key:
            raise InvalidKeyError(
                f"base64 keys must be non-empty bytes, got {type(key).__name__}"
                if not isinstance(key, bytes)
                else "base64 keys must not be empty"
            )
        if len(key) > MAX_BINARY_KEY_LENGTH:
            raise InvalidKeyError(
                f"binary key {show_bytes(key)} is {len(key)} bytes long, over the limit of"
                f" {MAX_BINARY_KEY_LENGTH} (its base64 form must fit in {MAX_KEY_LENGTH})"
            )
        return binascii.b2a_base64(key, newline=False)
    return validate_key(key)  # type: ignore[arg-type]


def _flag(name: str, wanted: object) -> bool:
    if type(wanted) is not bool:
        raise InvalidArgumentError(f"{name} must be a bool, got {type(wanted).__name__}")
    return wanted


def _add_flags(parts: list[bytes], *options: tuple[str, object, bytes]) -> None:
    for name, wanted, flag in options:
        if wanted is True:
            parts.append(flag)
        elif wanted is not False:
            _flag(name, wanted)  # raises


def _add_int(
    parts: list[bytes], flag: bytes, name: str, value: object, low: int, high: int
) -> None:
    if value is not None:
        parts.append(flag + b"%d" % _checked_int(name, value, low, high))


def _add_opaque(parts: list[bytes], opaque: object) -> None:
    if opaque is None:
        return
    problem = key_problem(opaque, MAX_OPAQUE_LENGTH)
    if problem is not None:
        raise InvalidArgumentError(f"opaque token {problem}")
    assert isinstance(opaque, bytes)
    parts.append(b"O" + opaque)


# -- replies -------------------------------------------------------------------------------

_STATUSES = {status.value: status for status in MetaStatus}
# Replies memcached often sends bare, built once.
_BARE = {status.value: MetaReply(status) for status in MetaStatus if status is not MetaStatus.VA}
_MN = _BARE[b"MN"]
# The commonest value replies, read in one step: to mg's default flags, to
# meta_get_many's and to get_or_set's (a CAS before the flags, and a lease's W, Z or X
# after them); and to ma's (a counter: CAS and TTL). Anything else (or anything wrong
# with it) takes the general path.
_SIMPLE_VALUE = re.compile(
    rb"VA ([0-9]{1,20}) (?:c([0-9]{1,20}) )?f([0-9]{1,10})"
    rb"(?: k([\x21-\x7e\x80-\xff]{1,250}))?((?: [WXZ])*)\r\n"
)
_COUNT_VALUE = re.compile(rb"VA ([0-9]{1,20}) c([0-9]{1,20}) t(-1|[0-9]{1,20})\r\n")
# Values at least this long are copied out through a memoryview: one copy instead of two.
_VIEW_COPY_THRESHOLD = 4096


def read_meta_replies(
    buffer: bytes | bytearray,
    pos: int,
    scan: int,
    max_value_size: int,
    max_line_length: int,
) -> tuple[list[MetaResult] | None, int, int]:
    """The meta replies at ``pos`` up to the ``MN`` that ends them (MN itself left out).

    Returns ``(replies, pos, scan)``: ``replies`` is None until the ``MN`` has arrived.
    ``scan`` carries the work done between calls: the replies from ``pos`` to ``scan`` are
    complete and well-formed, so a call resumes at ``scan`` (pass ``pos`` for it the first
    time, and the returned values afterwards). Complete replies are parsed at most twice,
    so a long reply arriving in many pieces costs linear time.

    Error lines come back as CommandError values in the list; bytes that break the
    protocol raise ProtocolError (MetaUnsupportedError for ``ERROR``).
    """
    start = scan if scan > pos else pos
    replies: list[MetaResult] = []
    at = start
    while True:
        step = read_meta_reply(buffer, at, max_value_size, max_line_length)
        if step is None:
            return None, pos, at
        reply, at = step
        if reply is _MN:
            break
        replies.append(reply)
    if start > pos:
        # The replies checked by earlier calls, read again now that all of them are needed.
        earlier: list[MetaResult] = []
        at_earlier = pos
        while at_earlier < start:
            step = read_meta_reply(buffer, at_earlier, max_value_size, max_line_length)
            assert step is not None
            reply, at_earlier = step
            earlier.append(reply)
        replies = earlier + replies
    return replies, at, at


def read_meta_reply(
    buffer: bytes | bytearray, pos: int, max_value_size: int, max_line_length: int
) -> tuple[MetaResult, int] | None:
    """The one meta reply (``MN`` included) at ``pos`` and where the next one starts, or
    None while it is incomplete. Raises ProtocolError for bytes that break the protocol."""
    if buffer.startswith(b"MN\r\n", pos):  # the end of every batch
        return _MN, pos + 4
    simple = _SIMPLE_VALUE.match(buffer, pos)
    if simple is not None:
        length = int(simple[1])
        start = simple.end()
        data_end = start + length
        client_flags = int(simple[3])
        cas = None if simple[2] is None else int(simple[2])
        if (
            length <= max_value_size
            and client_flags <= _UINT32_MAX
            and (cas is None or cas <= _UINT64_MAX)
            and start - pos - 2 <= max_line_length
            and buffer.startswith(b"\r\n", data_end)
        ):
            marks = simple[5]
            return MetaReply(
                MetaStatus.VA,
                _copy(buffer, start, data_end),
                cas,
                client_flags,
                key=simple[4],
                win=b"W" in marks,
                stale=b"X" in marks,
                won_elsewhere=b"Z" in marks,
            ), data_end + 2
    else:
        count = _COUNT_VALUE.match(buffer, pos)
        if count is not None:
            length = int(count[1])
            start = count.end()
            data_end = start + length
            cas = int(count[2])
            ttl = int(count[3])
            if (
                length <= max_value_size
                and cas <= _UINT64_MAX
                and ttl <= _UINT64_MAX
                and start - pos - 2 <= max_line_length
                and buffer.startswith(b"\r\n", data_end)
            ):
                return MetaReply(
                    MetaStatus.VA, _copy(buffer, start, data_end), cas, ttl=ttl
                ), data_end + 2
    limit = pos + max_line_length + 2
    newline = buffer.find(b"\n", pos, limit)
    if newline < 0:
        if len(buffer) >= limit:
            raise ProtocolError(
                f"no line ending within {max_line_length} bytes: {_show(buffer[pos:limit])}"
            )
        return None
    if newline == pos or buffer[newline - 1] != 13:
        raise ProtocolError(
            f"line ends with a bare b'\\n' instead of b'\\r\\n': {_show(buffer[pos : newline + 1])}"
        )
    line = bytes(buffer[pos : newline - 1])
    after = newline + 1
    bare = _BARE.get(line)
    if bare is not None:
        return bare, after
    tokens = line.split(b" ")
    status = _STATUSES.get(tokens[0])
    if status is None:
        return _error_line(line), after
    if status is MetaStatus.MN:
        raise ProtocolError(f"MN with arguments: {_show(line)}")
    value: bytes | None = None
    flags = tokens[1:]
    if status is MetaStatus.VA:
        if not flags or not flags[0].isdigit() or len(flags[0]) > 20:
            raise ProtocolError(f"VA line without a valid size: {_show(line)}")
        length = int(flags[0])
        if length > max_value_size:
            raise ReplyTooLargeError(
                f"VA line declares {length} bytes, over the limit of {max_value_size}"
                f" (max_value_size: raise it to match memcached's -I if another process"
                f" stores larger values): {_show(line)}"
            )
        flags = flags[1:]
        data_end = after + length
        available = len(buffer)
        if available < data_end + 2:
            # Wait for the rest, unless the byte after the data already shows it is wrong.
            if available > data_end and buffer[data_end] != 13:
                raise _bad_data_end(buffer, data_end, line)
            return None
        if buffer[data_end] != 13 or buffer[data_end + 1] != 10:
            raise _bad_data_end(buffer, data_end, line)
        value = _copy(buffer, after, data_end)
        after = data_end + 2
    return _with_flags(status, value, flags, line), after


def meta_key_problem(replies: list[MetaResult], expected: set[bytes]) -> str | None:
    """What is wrong with the keys of a quiet multi-get's replies, or None.

    Each reply must carry a key (``k``) that was asked for, and no key may come twice;
    ``expected`` is emptied on the way. Error lines carry no key and are left to the
    caller."""
    for reply in replies:
        if isinstance(reply, CommandError):
            continue
        key = reply.key
        if key is None:
            return f"a quiet mg answered without its key: {reply.status.name}"
        if key not in expected:
            return (
                f"a quiet mg answered for {show_bytes(key)}, which was not asked for"
                " (or was already answered)"
            )
        expected.discard(key)
    return None


def _with_flags(
    status: MetaStatus, value: bytes | None, tokens: list[bytes], line: bytes
) -> MetaReply:
    cas = client_flags = ttl = size = last_access = None
    key = opaque = None
    hit: bool | None = None
    win = stale = won_elsewhere = base64_key = False
    other: list[bytes] = []
    for token in tokens:
        if not token:
            raise ProtocolError(f"empty flag (two spaces) in a meta reply: {_show(line)}")
        flag = token[0]
        argument = token[1:]
        if flag == 99:  # c
            cas = _number(argument, 0, _UINT64_MAX, "c", line)
        elif flag == 102:  # f
            client_flags = _number(argument, 0, _UINT32_MAX, "f", line)
        elif flag == 116:  # t
            ttl = _number(argument, -1, _UINT64_MAX, "t", line)
        elif flag == 115:  # s
            size = _number(argument, 0, _UINT64_MAX, "s", line)
        elif flag == 107:  # k
            if not argument:
                raise ProtocolError(f"k flag without a key: {_show(line)}")
            key = argument
        elif flag == 79:  # O
            opaque = argument
        elif flag == 104:  # h
            if argument not in (b"0", b"1"):
                raise ProtocolError(f"h flag is not 0 or 1: {_show(line)}")
            hit = argument == b"1"
        elif flag == 108:  # l
            last_access = _number(argument, 0, _UINT64_MAX, "l", line)
        elif flag in (87, 88, 90, 98) and argument:  # W X Z b take no argument
            raise ProtocolError(f"flag {token[:1]!r} with an argument: {_show(line)}")
        elif flag == 87:  # W
            win = True
        elif flag == 88:  # X
            stale = True
        elif flag == 90:  # Z
            won_elsewhere = True
        elif flag == 98:  # b: the key returned is base64
            base64_key = True
        else:
            other.append(token)
    if base64_key and key is not None:
        try:
            key = base64.b64decode(key, validate=True)
        except binascii.Error:
            raise ProtocolError(f"k flag is not valid base64: {_show(line)}") from None
    return MetaReply(
        status,
        value,
        cas,
        client_flags,
        ttl,
        size,
        key,
        opaque,
        hit,
        last_access,
        win,
        stale,
        won_elsewhere,
        tuple(other),
    )


def _copy(buffer: bytes | bytearray, start: int, end: int) -> bytes:
    if end - start < _VIEW_COPY_THRESHOLD:
        return bytes(buffer[start:end])
    with memoryview(buffer) as view:
        return bytes(view[start:end])


def _number(argument: bytes, low: int, high: int, flag: str, line: bytes) -> int:
    digits = argument[1:] if low < 0 and argument.startswith(b"-") else argument
    if not digits.isdigit() or len(digits) > 20:
        raise ProtocolError(f"{flag} flag is not a number: {_show(line)}")
    number = int(argument)
    if not low <= number <= high:
        raise ProtocolError(f"{flag} flag out of range: {_show(line)}")
    return number


def _error_line(line: bytes) -> CommandError:
    word, _, message = line.partition(b" ")
    text = message.decode("utf-8", "replace")
    if word == b"CLIENT_ERROR":
        return ClientError(text)
    if word == b"SERVER_ERROR":
        if text.startswith("object too large"):
            return ValueTooLargeError(text)
        return ServerError(text)
    if word == b"ERROR":
        raise MetaUnsupportedError(
            "the server answered a meta command with ERROR: it does not speak the meta"
            " protocol (memcached 1.6+ does)"
        )
    raise ProtocolError(f"unexpected reply to a meta command: {_show(line)}")


def _bad_data_end(buffer: bytes | bytearray, data_end: int, line: bytes) -> ProtocolError:
    after = bytes(buffer[data_end : data_end + 2])
    return ProtocolError(
        f"the value announced by {_show(line)} is followed by {_show(after)} instead of b'\\r\\n'"
    )


def _show(data: bytes | bytearray) -> str:
    return show_bytes(data, _SHOWN_BYTES)


__all__ = [
    "MAX_BINARY_KEY_LENGTH",
    "MAX_OPAQUE_LENGTH",
    "MetaReply",
    "MetaResult",
    "MetaStatus",
    "MetaUnsupportedError",
    "meta_arithmetic_command",
    "meta_delete_command",
    "meta_get_command",
    "meta_get_many_command",
    "meta_key_problem",
    "meta_noop_command",
    "meta_set_command",
    "read_meta_replies",
    "read_meta_reply",
]
