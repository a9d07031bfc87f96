"""Incremental parser for memcached text-protocol replies.

The parser owns a receive buffer. The connection feeds it whatever bytes arrive and asks
for the reply to its oldest pending request with ``next_reply(kind)``; the parser answers
with the whole reply or with None when more bytes are needed. Replies carry no request
identifiers, so only the caller knows which kind of reply comes next.

Value blocks are read by their declared length, never by looking for ``END``: a value may
hold any bytes, ``\\r\\nEND\\r\\n`` included. Work done on an incomplete reply is kept
(items parsed, where the line scan stopped, the header of the awaited value), so a large
value arriving in many small pieces costs linear time.

Error lines (``ERROR``, ``CLIENT_ERROR``, ``SERVER_ERROR``) are returned as exception
instances rather than raised: the stream stays in step after them and the connection
remains usable. Bytes that break the protocol raise ProtocolError, after which the parser
refuses all further calls, since there is no telling where the next reply starts.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Final, NamedTuple, cast

from django_fastcache._mypyc import i64
from django_fastcache.errors import (
    ClientError,
    CommandError,
    ConfigurationError,
    ProtocolError,
    ReplyTooLargeError,
    ServerError,
    UnknownCommandError,
    ValueTooLargeError,
)
from django_fastcache.protocol.keys import show_bytes
from django_fastcache.protocol.meta import (
    MetaReply,
    MetaResult,
    MetaStatus,
    meta_key_problem,
    read_meta_replies,
)


class ReplyKind(enum.IntEnum):
    """The shape of reply a request gets, which tells the parser how to read it."""

    RETRIEVAL = 0  # get/gets/gat/gats: VALUE blocks, then END
    STORAGE = 1  # set/add/replace/append/prepend/cas: STORED, NOT_STORED, EXISTS, NOT_FOUND
    DELETE = 2  # delete: DELETED or NOT_FOUND
    TOUCH = 3  # touch: TOUCHED or NOT_FOUND
    ARITHMETIC = 4  # incr/decr: the new value, or NOT_FOUND
    OK = 5  # flush_all, verbosity, cache_memlimit: OK
    VERSION = 6  # version: VERSION <text>
    STATS = 7  # stats: STAT <name> <value> lines, then END
    META = 8  # mg/ms/md/ma ending in mn: meta replies up to MN (protocol/meta.py)


class Status(enum.Enum):
    """A one-word reply. Each member's value is the exact line the server sends for it."""

    STORED = b"STORED"
    NOT_STORED = b"NOT_STORED"
    EXISTS = b"EXISTS"
    NOT_FOUND = b"NOT_FOUND"
    DELETED = b"DELETED"
    TOUCHED = b"TOUCHED"
    OK = b"OK"


class Item(NamedTuple):
    """One VALUE block of a retrieval reply.

    A NamedTuple rather than a frozen dataclass: it is just as immutable and about twice as
    cheap to build, which matters because one is built per item of every get.
    """

    key: bytes
    value: bytes
    flags: int
    cas: int | None  # set for gets/gats, None for get/gat


_RETRIEVAL: Final = ReplyKind.RETRIEVAL
# Builds an Item without the Python-level __new__ of a NamedTuple: one call fewer per item.
_new_item: Final = tuple.__new__

Reply = list[Item] | list[MetaResult] | Status | int | str | dict[str, str] | CommandError
"""What next_reply returns for a complete reply; see ReplyParser.next_reply."""

_UINT32_MAX: Final = 2**32 - 1
_UINT64_MAX: Final = 2**64 - 1

_VALUE_HEADER: Final = re.compile(
    rb"VALUE ([\x21-\x7e\x80-\xff]+) ([0-9]{1,10}) ([0-9]{1,20})(?: ([0-9]{1,20}))?"
)

# A whole one-item reply read in one step: the header (a key no longer than memcached
# allows), and where it ends. Anything else takes the general, incremental path.
_ONE_VALUE_HEADER: Final = re.compile(
    rb"VALUE ([\x21-\x7e\x80-\xff]{1,250}) ([0-9]{1,10}) ([0-9]{1,20})\r\n"
)

_STORAGE_REPLIES = {
    status.value: status
    for status in (Status.STORED, Status.NOT_STORED, Status.EXISTS, Status.NOT_FOUND)
}
_DELETE_REPLIES = {status.value: status for status in (Status.DELETED, Status.NOT_FOUND)}
_TOUCH_REPLIES = {status.value: status for status in (Status.TOUCHED, Status.NOT_FOUND)}
_OK_REPLIES = {Status.OK.value: Status.OK}

# A multi-key reply up to this long, whole, is read in one split (see _whole_values).
_WHOLE_SPLIT_LIMIT = 64 * 1024
# _whole_values takes values shorter than this, and flags below _FLAGS_KNOWN (else the
# item by item reader does): their decimal digits, as memcached writes them.
_SHORT = 4096
_DIGITS: tuple[bytes, ...] = tuple(b"%d" % n for n in range(_SHORT))
_FLAGS_KNOWN = 1024
_SMALL_FLAGS: dict[bytes, int] = {_DIGITS[n]: n for n in range(_FLAGS_KNOWN)}
# Values at least this long are copied out through a memoryview: one copy instead of two.
_VIEW_COPY_THRESHOLD: Final = 4096
# Consumed bytes are dropped from the buffer's front once there are this many and they
# outnumber the unread ones, so compaction stays amortised linear.
_COMPACT_THRESHOLD: Final = 64 * 1024

_SHOWN_BYTES: Final = 60


#: What :func:`whole_one_value` and :meth:`ReplyParser.next_value` give for a miss.
MISS: Final[tuple[()]] = ()


def whole_one_value(
    reply: bytes, key: bytes, max_value_size: int
) -> tuple[bytes, int] | tuple[()] | None:
    """``reply`` read as exactly one whole reply to ``get <key>``: ``(value, flags)``, or
    :data:`MISS`; None when it is anything else (incomplete, an error line, a reply
    followed by more bytes, anything unusual), for the general parser to read (and to say
    what is wrong, if anything is).

    The sync client's commonest reply, read from the bytes of one receive. Byte by byte,
    because compiled that is a few instructions a byte where a regex match and two ``int()``
    calls cost thousands; it never accepts what the general parser would refuse. ``bytes``,
    not the connection's bytearray: mypyc reads a bytes index in place, where a bytearray
    index is a generic ``__getitem__`` call and a boxed int."""
    buffer = reply
    # Native 64-bit integers, compiled (i64): every number here stays far inside that range.
    end: i64 = len(reply)
    if end == 5:
        if (
            buffer[0] == 69  # E
            and buffer[1] == 78  # N
            and buffer[2] == 68  # D
            and buffer[3] == 13
            and buffer[4] == 10
        ):
            return MISS
        return None
    # "VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n": the shortest has 1-digit numbers.
    size: i64 = len(key)
    pos: i64 = 6 + size
    if (
        end < pos + 13
        or buffer[pos] != 32
        or buffer[0] != 86  # V
        or buffer[1] != 65  # A
        or buffer[2] != 76  # L
        or buffer[3] != 85  # U
        or buffer[4] != 69  # E
        or buffer[5] != 32
    ):
        return None
    # The key, compared byte by byte: no b"VALUE " + key built, no startswith() call.
    index: i64 = 0
    while index < size:
        if buffer[6 + index] != key[index]:
            return None
        index += 1
    # The flags: 1 to 10 digits (32-bit), then a space. No digit is ever read past
    # end - 11: the shortest rest is " <length>\r\n\r\nEND\r\n".
    pos += 1
    first: i64 = pos
    flags: i64 = 0
    byte: i64 = buffer[pos]
    while 48 <= byte <= 57:
        if pos - first == 10 or pos >= end - 11:
            return None
        flags = flags * 10 + byte - 48
        pos += 1
        byte = buffer[pos]
    if pos == first or byte != 32 or flags > _UINT32_MAX:
        return None
    # The length: 1 to 18 digits here (longer ones, far past any value size, are left to
    # the general parser), then the line ending.
    pos += 1
    first = pos
    length: i64 = 0
    byte = buffer[pos]
    while 48 <= byte <= 57:
        if pos - first == 18 or pos >= end - 9:
            return None
        length = length * 10 + byte - 48
        pos += 1
        byte = buffer[pos]
    if pos == first:
        return None
    start = pos + 2
    data_end = start + length
    if (
        buffer[pos] != 13
        or buffer[pos + 1] != 10
        or length > max_value_size
        or data_end + 7 != end
        or buffer[data_end] != 13
        or buffer[data_end + 1] != 10
        or buffer[data_end + 2] != 69  # E
        or buffer[data_end + 3] != 78  # N
        or buffer[data_end + 4] != 68  # D
        or buffer[data_end + 5] != 13
        or buffer[data_end + 6] != 10
    ):
        return None
    return buffer[start:data_end], flags


# The one-line replies read whole by whole_status, line ending included.
_STORAGE_LINES: Final = {status.value + b"\r\n": status for status in _STORAGE_REPLIES.values()}
_DELETE_LINES: Final = {status.value + b"\r\n": status for status in _DELETE_REPLIES.values()}
_TOUCH_LINES: Final = {status.value + b"\r\n": status for status in _TOUCH_REPLIES.values()}
_STORAGE_KIND: Final = ReplyKind.STORAGE
_DELETE_KIND: Final = ReplyKind.DELETE
_TOUCH_KIND: Final = ReplyKind.TOUCH
_ARITHMETIC_KIND: Final = ReplyKind.ARITHMETIC


# The meta statuses :func:`whole_meta_reply` reads, by their two bytes (VA apart).
_META_FLAT_STATUSES: Final = {
    (status.value[0] << 8) | status.value[1]: status
    for status in (MetaStatus.HD, MetaStatus.NF, MetaStatus.NS, MetaStatus.EX, MetaStatus.EN)
}


def whole_meta_reply(
    received: bytes, max_value_size: int, max_line_length: int
) -> MetaReply | None:
    """``received`` read as exactly one whole meta reply and the ``MN`` that ends its
    request, as the general parser (:func:`~.meta.read_meta_reply`) would read it; None
    when it is anything else (incomplete, more replies, an error line, a return flag other
    than ``c``, ``f``, ``t``, ``W``, ``X`` and ``Z``, anything unusual), for the general
    parser to read (and to say what is wrong, if anything is).

    The sync client's one meta command of the flat path (the disk tier's ``ma … v c t``
    and ``mg … v c f``), whose first read brings it whole. Byte by byte, as
    :func:`whole_one_value` is and for the same reason: compiled, a few instructions a
    byte where the general parser's regex and buffer cost a microsecond. It never accepts
    what the general parser would refuse."""
    size = len(received)
    if size < 8 or not received.endswith(b"MN\r\n"):
        return None
    line_end = received.find(b"\r\n")
    if line_end < 2 or line_end > max_line_length:
        return None
    pair = (received[0] << 8) | received[1]
    status = _META_FLAT_STATUSES.get(pair)
    pos = 2
    length = -1
    if status is None:
        if pair != 0x5641:  # VA
            return None
        status = MetaStatus.VA
        pos = 3
        length = 0
        while pos < line_end:
            byte = received[pos]
            if byte < 48 or byte > 57:
                break
            if pos == 23:
                return None  # over 20 digits (the digits are not summed on without bound)
            length = length * 10 + byte - 48
            pos += 1
        if pos == 3 or length > max_value_size or received[2] != 32:
            return None
    cas: int | None = None
    client_flags: int | None = None
    ttl: int | None = None
    win = stale = won_elsewhere = False
    while pos < line_end:
        if received[pos] != 32 or pos + 1 == line_end:
            return None
        flag = received[pos + 1]
        pos += 2
        if flag == 87 or flag == 88 or flag == 90:  # W X Z: no argument
            if pos < line_end and received[pos] != 32:
                return None
            if flag == 87:
                win = True
            elif flag == 88:
                stale = True
            else:
                won_elsewhere = True
            continue
        if flag != 99 and flag != 102 and flag != 116:  # c f t: a number
            return None
        if flag == 116 and received.startswith(b"-1", pos):
            number = -1
            pos += 2
            if pos < line_end and received[pos] != 32:
                return None
        else:
            start = pos
            number = 0
            while pos < line_end:
                byte = received[pos]
                if byte == 32:
                    break
                if byte < 48 or byte > 57 or pos - start == 20:
                    return None  # not a digit, or over 20 digits
                number = number * 10 + byte - 48
                pos += 1
            if pos == start or number > _UINT64_MAX:
                return None
        if flag == 99:
            cas = number
        elif flag == 102:
            if number > _UINT32_MAX:
                return None
            client_flags = number
        else:
            ttl = number
    after = line_end + 2
    value: bytes | None = None
    if length >= 0:
        data_end = after + length
        if data_end + 6 != size or received[data_end] != 13 or received[data_end + 1] != 10:
            return None
        value = received[after:data_end]
    elif after + 4 != size:
        return None
    return MetaReply(
        status,
        value,
        cas,
        client_flags,
        ttl,
        None,
        None,
        None,
        None,
        None,
        win,
        stale,
        won_elsewhere,
        (),
    )


def whole_status(reply: bytes, kind: ReplyKind) -> Status | int | None:
    """``reply`` read as exactly one whole reply of ``kind``, a one-line reply: the
    :class:`Status` of a storage command, delete or touch, or an incr/decr's new value
    (or NOT_FOUND); None when it is anything else (incomplete, an error line, more than
    one line, another kind), for the general parser to read (and to say what is wrong, if
    anything is). :func:`whole_one_value` for the other commands of the flat path: a dict
    look-up, or a loop over a few digits, where the general parser costs thousands of
    instructions. It never accepts what the general parser would refuse."""
    if kind is _STORAGE_KIND:
        return _STORAGE_LINES.get(reply)
    if kind is _DELETE_KIND:
        return _DELETE_LINES.get(reply)
    if kind is _ARITHMETIC_KIND:
        end = len(reply) - 2
        # 1 to 20 digits (the general parser's bounds), then the line ending.
        if end < 1 or end > 20 or reply[end] != 13 or reply[end + 1] != 10:
            return None
        value = 0
        for index in range(end):
            byte = reply[index]
            if byte < 48 or byte > 57:
                return Status.NOT_FOUND if reply == b"NOT_FOUND\r\n" else None
            value = value * 10 + byte - 48
        return value if value <= _UINT64_MAX else None
    if kind is _TOUCH_KIND:
        return _TOUCH_LINES.get(reply)
    return None


class ReplyParser:
    """Turns the bytes of a memcached connection into replies, one request kind at a time."""

    __slots__ = (
        "_buffer",
        "_expected",
        "_failure",
        "_header",
        "_items",
        "_max_line_length",
        "_max_value_size",
        "_pos",
        "_scan",
        "_stats",
        "_waiting_kind",
    )

    # The limits are typed ``object``: the checks below give a ConfigurationError for a
    # wrong type, where a compiled build would raise a bare TypeError at the call.
    def __init__(
        self, max_value_size: object = 1024 * 1024, max_line_length: object = 8192
    ) -> None:
        if isinstance(max_value_size, bool) or not isinstance(max_value_size, int):
            raise ConfigurationError("max_value_size must be an int")
        if isinstance(max_line_length, bool) or not isinstance(max_line_length, int):
            raise ConfigurationError("max_line_length must be an int")
        if max_value_size < 0 or max_line_length < 1:
            raise ConfigurationError(
                "max_value_size must be >= 0 and max_line_length >= 1,"
                f" got {max_value_size} and {max_line_length}"
            )
        self._max_value_size = max_value_size
        self._max_line_length = max_line_length
        self._buffer = bytearray()
        # Start of the next unread line or data block.
        self._pos = 0
        # Where the search for the end of the current line resumes; never below _pos.
        self._scan = 0
        # A retrieval in progress: the items read so far and the header of the value
        # whose data block has not fully arrived yet.
        self._items: list[Item] = []
        self._header: tuple[bytes, int, int, int | None] | None = None
        # The keys a retrieval in progress asked for and has not received yet.
        self._expected: set[bytes] | None = None
        # A stats reply in progress.
        self._stats: dict[str, str] = {}
        # The kind whose reply was incomplete at the last call.
        self._waiting_kind: ReplyKind | None = None
        self._failure: ProtocolError | None = None

    @property
    def idle(self) -> bool:
        """No reply under way and no byte unread: the next bytes start a new reply."""
        return (
            self._pos == len(self._buffer) and self._waiting_kind is None and self._failure is None
        )

    @property
    def max_value_size(self) -> int:
        """The longest value a reply may carry (longer is a protocol error)."""
        return self._max_value_size

    @property
    def max_line_length(self) -> int:
        """The longest line a reply may have, without its CRLF (longer is a protocol
        error)."""
        return self._max_line_length

    @property
    def unread(self) -> int:
        """Bytes received that no reply has used yet.

        Between requests this must be 0: anything else was sent without being asked for,
        and the stream can no longer be trusted to be in step."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the server."""
        if self._failure is not None:
            raise self._dead()
        buffer = self._buffer
        pos = self._pos
        if pos:
            if pos == len(buffer):
                buffer.clear()
                self._pos = self._scan = 0
            elif pos >= _COMPACT_THRESHOLD and pos >= len(buffer) - pos:
                del buffer[:pos]
                self._scan -= pos
                self._pos = 0
        buffer += data

    def next_reply(self, kind: ReplyKind, keys: Sequence[bytes] | None = None) -> Reply | None:
        """Return the next complete reply, read as a reply of ``kind``, or None for "not yet".

        ``keys``, for a RETRIEVAL, are the keys the request asked for: an item for any
        other key, or for one of them twice, breaks the protocol (it would be another
        request's answer, or an endless stream), so the reply holds at most one item per
        key asked for.

        RETRIEVAL gives a list of Item (empty when nothing was found); STORAGE, DELETE,
        TOUCH and OK give a Status; ARITHMETIC gives the new value as an int, or
        Status.NOT_FOUND; VERSION gives the version text; STATS gives a dict of name to
        value; META gives the list of meta replies up to ``MN`` (see
        :mod:`django_fastcache.protocol.meta`). In place of any of these an error line gives
        an UnknownCommandError, ClientError, ServerError or ValueTooLargeError instance.

        After None, call again with the same kind once more bytes have been fed.
        Raises ProtocolError when the bytes do not follow the protocol; the parser is
        unusable from then on.
        """
        if self._failure is not None:
            raise self._dead()
        waiting = self._waiting_kind
        if waiting is None:
            if kind is _RETRIEVAL and keys is not None and len(keys) == 1:
                # The commonest reply of all, a one-key get, whole in the buffer.
                found = self._one_value(keys[0])
                if found is not None:
                    return found
            elif kind is _RETRIEVAL:
                if keys is None:
                    self._expected = None
                else:
                    # A multi-key get (an autobatched one, say): the whole reply at once
                    # when it is all here, else its usual items in one loop; on anything
                    # else the general reader goes on from there.
                    many = self._whole_values(keys)
                    if many is None:
                        many = self._many_values(keys)
                    if many is not None:
                        return many
            elif keys is not None:  # META: a quiet multi-get's keys, checked by _read_meta
                self._expected = set(keys)
        elif kind != waiting:
            raise RuntimeError(f"next_reply({kind!r}) called with a {waiting!r} reply unfinished")
        reply = _READERS[kind](self)
        self._waiting_kind = kind if reply is None else None
        return reply

    def next_value(self, key: bytes) -> tuple[bytes, int] | tuple[()] | CommandError | None:
        """:meth:`next_reply` for ``get <key>``, as ``(value, flags)`` or :data:`MISS`
        rather than a list of Item; an error reply, or None for "not yet", as there."""
        reply = self.next_reply(_RETRIEVAL, (key,))
        if reply.__class__ is not list:
            return reply  # type: ignore[return-value]  # None or a CommandError
        items = cast("list[Item]", reply)
        if not items:
            return MISS
        item = items[0]
        return item.value, item.flags

    def _one_value(self, key: bytes) -> list[Item] | None:
        """A whole reply to a one-key get, read in one step, or None to read on the general
        way (incomplete, or anything unusual: that path tells what is wrong)."""
        buffer = self._buffer
        pos = self._pos
        if buffer.startswith(b"END\r\n", pos):
            self._pos = self._scan = pos + 5
            return []
        item = self._whole_simple_item(pos, key)
        if item is None:
            self._expected = {key}
            return None
        pos = self._pos
        if buffer.startswith(b"END\r\n", pos):
            self._pos = self._scan = pos + 5
            return [item]
        self._items = [item]
        self._expected = set()  # the key is answered: any further item breaks the protocol
        return None

    def _whole_values(self, keys: Sequence[bytes]) -> list[Item] | None:
        """A multi-key get's reply that is everything unread, whole, read by splitting it
        at its line ends; None (nothing consumed) for anything else, which the item by
        item readers then take.

        One split makes every value's bytes, where the item by item reader matches a
        header, slices and copies each value on its own: about half the CPU per item of a
        32-key reply. It takes only the usual shape: ``VALUE <key> <flags> <bytes>``
        headers (no cas unique) for keys asked for, in the order they were asked (as
        memcached answers), each value exactly as long as its header says (a value
        holding a line end is not), and ``END`` as the last line."""
        buffer = self._buffer
        pos = self._pos
        size = len(buffer) - pos
        if size > _WHOLE_SPLIT_LIMIT or not buffer.endswith(b"END\r\n"):
            return None
        parts = bytes(buffer[pos:] if pos else buffer).split(b"\r\n")
        count = len(parts) - 2  # the header and value lines; then "END" and "" after it
        if count & 1 or count > 2 * len(keys) or parts[count] != b"END":
            return None
        limit = self._max_value_size
        items: list[Item] = []
        asked = iter(keys)
        for index in range(0, count, 2):
            fields = parts[index].split(b" ")
            if len(fields) != 4 or fields[0] != b"VALUE":
                return None
            _, key, flags_digits, length_digits = fields
            # In the order asked: skip the keys that missed; a key not asked for, or
            # answered twice, runs out of keys.
            for wanted in asked:
                if wanted == key:
                    break
            else:
                return None
            value = parts[index + 1]
            length = len(value)
            # Compared as digits, not parsed: that checks them too, for a fraction of int().
            if length >= _SHORT or _DIGITS[length] != length_digits or length > limit:
                return None
            flags = _SMALL_FLAGS.get(flags_digits)
            if flags is None:
                return None
            items.append(_new_item(Item, (key, value, flags, None)))
        self._pos = self._scan = len(buffer)
        return items

    def _many_values(self, keys: Sequence[bytes]) -> list[Item] | None:
        """A whole reply to a multi-key get, read in one loop while its items are the usual
        kind (as for :meth:`_whole_simple_item`, values under the copy threshold), or None
        with the items read so far and the keys still expected kept for
        :meth:`_read_retrieval`, which reads the rest (and tells what is wrong, if
        anything is)."""
        buffer = self._buffer
        pos = self._pos
        expected = set(keys)
        items: list[Item] = []
        match_header = _ONE_VALUE_HEADER.match
        limit = min(self._max_value_size, _VIEW_COPY_THRESHOLD - 1)
        available = len(buffer)
        while True:
            match = match_header(buffer, pos)
            if match is None:
                if buffer.startswith(b"END\r\n", pos):
                    self._pos = self._scan = pos + 5
                    return items
                break
            key, flags_digits, length_digits = match.groups()
            start = match.end()
            length = int(length_digits)
            data_end = start + length
            if (
                length > limit
                or data_end + 2 > available
                or buffer[data_end] != 13
                or buffer[data_end + 1] != 10
                or key not in expected
            ):
                break
            flags = int(flags_digits)
            if flags > _UINT32_MAX:
                break
            expected.remove(key)
            items.append(_new_item(Item, (key, bytes(buffer[start:data_end]), flags, None)))
            pos = data_end + 2
        self._pos = self._scan = pos
        self._items = items
        self._expected = expected
        return None

    # -- readers, one per reply kind -------------------------------------------------------

    def _read_retrieval(self) -> list[Item] | CommandError | None:
        buffer = self._buffer
        items = self._items
        header = self._header
        while True:
            if header is None:
                pos = self._pos
                # END closes every retrieval, hit or miss: match it without a line search.
                if buffer.startswith(b"END\r\n", pos):
                    self._pos = self._scan = pos + 5
                    self._items = []
                    self._expected = None
                    return items
                item = self._whole_simple_item(pos, None)
                if item is not None:
                    items.append(item)
                    continue
                end = self._line_end()
                if end < 0:
                    return None
                match = _VALUE_HEADER.fullmatch(buffer, pos, end)
                if match is None:
                    # Partial items are dropped: the error answers the whole request.
                    self._items = []
                    self._expected = None
                    return self._error_line(pos, end, "get/gets/gat/gats")
                key, flags_digits, length_digits, cas_digits = match.groups()
                expected = self._expected
                if expected is not None:
                    if key not in expected:
                        raise self._fail(
                            f"a value for {show_bytes(key)}, which was not asked for"
                            " (or was already answered)"
                        )
                    expected.discard(key)
                flags = int(flags_digits)
                length = int(length_digits)
                cas = None if cas_digits is None else int(cas_digits)
                if (
                    flags > _UINT32_MAX
                    or length > self._max_value_size
                    or (cas is not None and cas > _UINT64_MAX)
                ):
                    raise self._bad_value_header(pos, end, flags, length, cas)
                header = (key, flags, length, cas)
                self._pos = self._scan = end + 2
            key, flags, length, cas = header
            start = self._pos
            data_end = start + length
            available = len(buffer)
            if available < data_end + 2:
                # Wait for the rest, unless the byte after the data already shows it is wrong.
                if available > data_end and buffer[data_end] != 13:
                    raise self._bad_data_end(key, data_end)
                self._header = header
                return None
            if buffer[data_end] != 13 or buffer[data_end + 1] != 10:
                raise self._bad_data_end(key, data_end)
            if length < _VIEW_COPY_THRESHOLD:
                value = bytes(buffer[start:data_end])
            else:
                with memoryview(buffer) as view:
                    value = bytes(view[start:data_end])
            items.append(Item(key, value, flags, cas))
            header = self._header = None
            self._pos = self._scan = data_end + 2

    def _whole_simple_item(self, pos: int, only_key: bytes | None) -> Item | None:
        """The item at ``pos`` when it is the usual kind, whole in the buffer (a header
        without a cas unique, for a key expected, then all its data), consumed; else None,
        and the general path reads it (and tells what is wrong, if anything is).
        ``only_key``: the one key expected (else the expected set, if any, is used)."""
        buffer = self._buffer
        match = _ONE_VALUE_HEADER.match(buffer, pos)
        if match is None:
            return None
        key, flags_digits, length_digits = match.groups()
        length = int(length_digits)
        start = match.end()
        data_end = start + length
        if length > self._max_value_size or not buffer.startswith(b"\r\n", data_end):
            return None
        flags = int(flags_digits)
        if flags > _UINT32_MAX:
            return None
        if only_key is not None:
            if key != only_key:
                return None
        else:
            expected = self._expected
            if expected is not None:
                if key not in expected:
                    return None
                expected.discard(key)
        self._pos = self._scan = data_end + 2
        if length < _VIEW_COPY_THRESHOLD:
            value = bytes(buffer[start:data_end])
        else:
            with memoryview(buffer) as view:
                value = bytes(view[start:data_end])
        return Item(key, value, flags, None)

    def _read_storage(self) -> Status | CommandError | None:
        return self._read_status(_STORAGE_REPLIES, "a storage command")

    def _read_delete(self) -> Status | CommandError | None:
        return self._read_status(_DELETE_REPLIES, "delete")

    def _read_touch(self) -> Status | CommandError | None:
        return self._read_status(_TOUCH_REPLIES, "touch")

    def _read_ok(self) -> Status | CommandError | None:
        end = self._line_end()
        if end < 0:
            return None
        pos = self._pos
        line = bytes(self._buffer[pos:end])
        if line == b"OK":
            self._pos = self._scan = end + 2
            return Status.OK
        if line.startswith(b"MEMLIMIT_"):
            # cache_memlimit's refusals (MEMLIMIT_TOO_SMALL ...) use their own words but,
            # like SERVER_ERROR, leave the stream in step.
            self._pos = self._scan = end + 2
            return ServerError(_text(line))
        return self._error_line(pos, end, "flush_all/verbosity/cache_memlimit")

    def _read_arithmetic(self) -> int | Status | CommandError | None:
        end = self._line_end()
        if end < 0:
            return None
        pos = self._pos
        line = bytes(self._buffer[pos:end])
        # bytes.isdigit accepts ASCII digits only, and is False for an empty line.
        if line.isdigit():
            if len(line) > 20 or int(line) > _UINT64_MAX:
                raise self._fail(f"incr/decr result out of 64-bit range: {_show(line)}")
            self._pos = self._scan = end + 2
            return int(line)
        if line == b"NOT_FOUND":
            self._pos = self._scan = end + 2
            return Status.NOT_FOUND
        return self._error_line(pos, end, "incr/decr")

    def _read_version(self) -> str | CommandError | None:
        end = self._line_end()
        if end < 0:
            return None
        pos = self._pos
        if self._buffer.startswith(b"VERSION ", pos):
            version = _text(bytes(self._buffer[pos + 8 : end]))
            self._pos = self._scan = end + 2
            return version
        return self._error_line(pos, end, "version")

    def _read_stats(self) -> dict[str, str] | CommandError | None:
        buffer = self._buffer
        stats = self._stats
        while True:
            end = self._line_end()
            if end < 0:
                return None
            pos = self._pos
            if buffer.startswith(b"STAT ", pos):
                name, _, value = bytes(buffer[pos + 5 : end]).partition(b" ")
                if not name:
                    raise self._fail(f"STAT line without a name: {_show(buffer[pos:end])}")
                stats[_text(name)] = _text(value)
                self._pos = self._scan = end + 2
                continue
            self._stats = {}
            if end - pos == 3 and buffer.startswith(b"END", pos):
                self._pos = self._scan = end + 2
                return stats
            return self._error_line(pos, end, "stats")

    def _read_meta(self) -> list[MetaResult] | None:
        # A list of MetaReply or CommandError, read by meta.py; _scan keeps its progress
        # between calls.
        try:
            replies, self._pos, self._scan = read_meta_replies(
                self._buffer, self._pos, self._scan, self._max_value_size, self._max_line_length
            )
        except ProtocolError as exc:
            self._fail(str(exc))
            raise
        expected = self._expected
        if replies is not None and expected is not None:
            # A reply for a key not asked (or twice) answers another request: the stream
            # is out of step, and the connection must go.
            self._expected = None
            problem = meta_key_problem(replies, expected)
            if problem is not None:
                raise self._fail(problem)
        return replies

    # -- shared steps ----------------------------------------------------------------------

    def _read_status(
        self, replies: dict[bytes, Status], request: str
    ) -> Status | CommandError | None:
        end = self._line_end()
        if end < 0:
            return None
        pos = self._pos
        status = replies.get(bytes(self._buffer[pos:end]))
        if status is None:
            return self._error_line(pos, end, request)
        self._pos = self._scan = end + 2
        return status

    def _line_end(self) -> int:
        """Index of the ``\\r`` ending the line at _pos, or -1 if the line is incomplete."""
        buffer = self._buffer
        pos = self._pos
        limit = pos + self._max_line_length + 2
        newline = buffer.find(b"\n", self._scan, limit)
        if newline < 0:
            if len(buffer) >= limit:
                raise self._fail(
                    f"no line ending within {self._max_line_length} bytes:"
                    f" {_show(buffer[pos:limit])}"
                )
            # Searching for the single byte \n, so nothing before here needs a second look.
            self._scan = len(buffer)
            return -1
        if newline == pos or buffer[newline - 1] != 13:
            raise self._fail(
                f"line ends with a bare b'\\n' instead of b'\\r\\n':"
                f" {_show(buffer[pos : newline + 1])}"
            )
        return newline - 1

    def _error_line(self, pos: int, end: int, request: str) -> CommandError:
        """Consume and return the error line at pos, or fail if it is not one."""
        line = bytes(self._buffer[pos:end])
        error = _command_error(line)
        if error is None:
            if line.startswith(b"VALUE "):
                raise self._fail(f"malformed VALUE line: {_show(line)}")
            raise self._fail(f"unexpected reply to {request}: {_show(line)}")
        self._pos = self._scan = end + 2
        return error

    def _bad_value_header(
        self, pos: int, end: int, flags: int, length: int, cas: int | None
    ) -> ProtocolError:
        line = _show(self._buffer[pos:end])
        if length > self._max_value_size:
            return self._fail(
                f"VALUE line declares {length} bytes, over the limit of"
                f" {self._max_value_size} (max_value_size: raise it to match memcached's -I"
                f" if another process stores larger values): {line}",
                ReplyTooLargeError,
            )
        if flags > _UINT32_MAX:
            return self._fail(f"VALUE line flags do not fit in 32 bits: {line}")
        return self._fail(f"VALUE line cas unique does not fit in 64 bits: {line}")

    def _bad_data_end(self, key: bytes, data_end: int) -> ProtocolError:
        after = self._buffer[data_end : data_end + 2]
        return self._fail(
            f"the value of {show_bytes(key)} is followed by {_show(after)} instead of b'\\r\\n'"
        )

    def _fail(self, message: str, kind: type[ProtocolError] = ProtocolError) -> ProtocolError:
        """Record the parser as dead and return the error for the caller to raise."""
        self._failure = kind(message)
        # Nothing buffered will ever be read now; let the memory go.
        self._buffer = bytearray()
        self._pos = self._scan = 0
        self._items = []
        self._header = None
        self._expected = None
        self._stats = {}
        return self._failure

    def _dead(self) -> ProtocolError:
        return ProtocolError(f"the reply stream broke earlier and cannot be read: {self._failure}")


# Indexed by ReplyKind.
_READERS = (
    ReplyParser._read_retrieval,
    ReplyParser._read_storage,
    ReplyParser._read_delete,
    ReplyParser._read_touch,
    ReplyParser._read_arithmetic,
    ReplyParser._read_ok,
    ReplyParser._read_version,
    ReplyParser._read_stats,
    ReplyParser._read_meta,
)


def _command_error(line: bytes) -> CommandError | None:
    """The error an ERROR/CLIENT_ERROR/SERVER_ERROR line reports, or None for other lines."""
    word, _, message = line.partition(b" ")
    if word == b"ERROR":
        # memcached sends a bare ERROR; some proxies add an explanation.
        return UnknownCommandError(_text(message))
    if word == b"CLIENT_ERROR":
        return ClientError(_text(message))
    if word == b"SERVER_ERROR":
        text = _text(message)
        if text.startswith("object too large"):
            return ValueTooLargeError(text)
        return ServerError(text)
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _show(data: bytes | bytearray) -> str:
    return show_bytes(data, _SHOWN_BYTES)


__all__ = [
    "MISS",
    "Item",
    "Reply",
    "ReplyKind",
    "ReplyParser",
    "Status",
    "whole_one_value",
    "whole_status",
]
