"""ReplyParser: every reply kind, in every chunking, pipelined, and every way to break it."""

from __future__ import annotations

import itertools
import re
import tracemalloc
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_fastcache.errors import (
    ClientError,
    CommandError,
    ProtocolError,
    ServerError,
    UnknownCommandError,
    ValueTooLargeError,
)
from django_fastcache.protocol.parser import Item, ReplyKind, ReplyParser, Status

K = ReplyKind
FORBIDDEN = [*range(0x00, 0x21), 0x7F]
ALLOWED = [b for b in range(256) if b not in FORBIDDEN]


# -- helpers ----------------------------------------------------------------------------------


def comparable(reply: Any) -> Any:
    """Exceptions compare by identity; compare them by type and message instead."""
    if isinstance(reply, BaseException):
        return (type(reply), str(reply))
    return reply


def parse(
    chunks: Sequence[bytes], kinds: Sequence[ReplyKind], parser: ReplyParser | None = None
) -> list[Any]:
    """Feed chunks one by one, asking for replies the way a connection does."""
    parser = parser or ReplyParser()
    replies: list[Any] = []
    for chunk in chunks:
        parser.feed(chunk)
        while len(replies) < len(kinds):
            reply = parser.next_reply(kinds[len(replies)])
            if reply is None:
                break
            replies.append(comparable(reply))
    return replies


def drain(parser: ReplyParser, chunks: Sequence[bytes], kind: ReplyKind) -> None:
    """Feed every chunk, reading replies of one kind as they complete."""
    for chunk in chunks:
        parser.feed(chunk)
        while parser.next_reply(kind) is not None:
            pass


def chunkings(data: bytes) -> Iterator[list[bytes]]:
    """The whole buffer, every two-chunk split, and one byte at a time."""
    yield [data]
    for cut in range(1, len(data)):
        yield [data[:cut], data[cut:]]
    yield [data[i : i + 1] for i in range(len(data))]


def encode_retrieval(items: Sequence[tuple[bytes, int, bytes, int | None]]) -> bytes:
    """A retrieval reply as memcached writes it (written here, independently of the parser)."""
    out = b""
    for key, flags, value, cas in items:
        out += b"VALUE " + key + b" " + str(flags).encode() + b" " + str(len(value)).encode()
        if cas is not None:
            out += b" " + str(cas).encode()
        out += b"\r\n" + value + b"\r\n"
    return out + b"END\r\n"


def expected_items(items: Sequence[tuple[bytes, int, bytes, int | None]]) -> list[Item]:
    return [Item(key=key, value=value, flags=flags, cas=cas) for key, flags, value, cas in items]


# -- what each kind accepts -------------------------------------------------------------------

# (kind, wire bytes, expected reply); expectations are written by hand from protocol.txt.
VALID_REPLIES: list[tuple[ReplyKind, bytes, Any]] = [
    (K.RETRIEVAL, b"END\r\n", []),
    (K.RETRIEVAL, b"VALUE k 0 5\r\nhello\r\nEND\r\n", [Item(b"k", b"hello", 0, None)]),
    (K.RETRIEVAL, b"VALUE k 7 5 42\r\nhello\r\nEND\r\n", [Item(b"k", b"hello", 7, 42)]),
    (K.RETRIEVAL, b"VALUE empty 0 0\r\n\r\nEND\r\n", [Item(b"empty", b"", 0, None)]),
    (
        K.RETRIEVAL,
        b"VALUE a 1 1\r\nx\r\nVALUE b 4294967295 2 18446744073709551615\r\nyz\r\nEND\r\n",
        [Item(b"a", b"x", 1, None), Item(b"b", b"yz", 2**32 - 1, 2**64 - 1)],
    ),
    (
        K.RETRIEVAL,
        b"VALUE tricky 0 20\r\n\r\nEND\r\nVALUE x 0 1\r\n\r\nEND\r\n",
        [Item(b"tricky", b"\r\nEND\r\nVALUE x 0 1\r\n", 0, None)],
    ),
    (K.RETRIEVAL, b"VALUE nul 0 3\r\n\x00\n\r\r\nEND\r\n", [Item(b"nul", b"\x00\n\r", 0, None)]),
    (K.RETRIEVAL, b"VALUE caf\xc3\xa9 0 1\r\n!\r\nEND\r\n", [Item(b"caf\xc3\xa9", b"!", 0, None)]),
    (K.STORAGE, b"STORED\r\n", Status.STORED),
    (K.STORAGE, b"NOT_STORED\r\n", Status.NOT_STORED),
    (K.STORAGE, b"EXISTS\r\n", Status.EXISTS),
    (K.STORAGE, b"NOT_FOUND\r\n", Status.NOT_FOUND),
    (K.DELETE, b"DELETED\r\n", Status.DELETED),
    (K.DELETE, b"NOT_FOUND\r\n", Status.NOT_FOUND),
    (K.TOUCH, b"TOUCHED\r\n", Status.TOUCHED),
    (K.TOUCH, b"NOT_FOUND\r\n", Status.NOT_FOUND),
    (K.ARITHMETIC, b"0\r\n", 0),
    (K.ARITHMETIC, b"42\r\n", 42),
    (K.ARITHMETIC, b"18446744073709551615\r\n", 2**64 - 1),
    (K.ARITHMETIC, b"NOT_FOUND\r\n", Status.NOT_FOUND),
    (K.OK, b"OK\r\n", Status.OK),
    (K.VERSION, b"VERSION 1.6.18\r\n", "1.6.18"),
    (K.VERSION, b"VERSION 1.4.5-custom build\r\n", "1.4.5-custom build"),
    (K.STATS, b"END\r\n", {}),
    (
        K.STATS,
        b"STAT pid 1234\r\nSTAT version 1.6.18\r\nSTAT rusage_user 0.1 0.2\r\nEND\r\n",
        {"pid": "1234", "version": "1.6.18", "rusage_user": "0.1 0.2"},
    ),
    (K.STATS, b"STAT items:1:number 3\r\nEND\r\n", {"items:1:number": "3"}),
]

ERROR_LINES: list[tuple[bytes, type[CommandError], str]] = [
    (b"ERROR\r\n", UnknownCommandError, ""),
    (b"CLIENT_ERROR bad data chunk\r\n", ClientError, "bad data chunk"),
    (b"CLIENT_ERROR\r\n", ClientError, ""),
    (b"SERVER_ERROR out of memory storing object\r\n", ServerError, "out of memory storing object"),
    (
        b"SERVER_ERROR object too large for cache\r\n",
        ValueTooLargeError,
        "object too large for cache",
    ),
]


def case_id(case: tuple[ReplyKind, bytes, Any]) -> str:
    return f"{case[0].name}-{case[1][:30]!r}"


@pytest.mark.parametrize("case", VALID_REPLIES, ids=case_id)
def test_valid_reply_in_every_chunking(case: tuple[ReplyKind, bytes, Any]) -> None:
    kind, wire, expected = case
    for chunks in chunkings(wire):
        assert parse(chunks, [kind]) == [expected], chunks


@pytest.mark.parametrize("case", VALID_REPLIES, ids=case_id)
def test_no_reply_until_the_last_byte(case: tuple[ReplyKind, bytes, Any]) -> None:
    kind, wire, _ = case
    for cut in range(len(wire)):
        parser = ReplyParser()
        parser.feed(wire[:cut])
        assert parser.next_reply(kind) is None, wire[:cut]
        # Asking again without new bytes changes nothing.
        assert parser.next_reply(kind) is None


@pytest.mark.parametrize("case", VALID_REPLIES, ids=case_id)
def test_reply_followed_by_the_start_of_the_next(case: tuple[ReplyKind, bytes, Any]) -> None:
    kind, wire, expected = case
    follower = b"VALUE next 3 4\r\nnext\r\nEND\r\n"
    for cut in range(len(follower)):
        parser = ReplyParser()
        parser.feed(wire + follower[:cut])
        assert comparable(parser.next_reply(kind)) == expected
        assert parser.next_reply(K.RETRIEVAL) is None
        parser.feed(follower[cut:])
        assert parser.next_reply(K.RETRIEVAL) == [Item(b"next", b"next", 3, None)]


def test_all_valid_replies_pipelined() -> None:
    wire = b"".join(case[1] for case in VALID_REPLIES)
    kinds = [case[0] for case in VALID_REPLIES]
    expected = [case[2] for case in VALID_REPLIES]
    assert parse([wire], kinds) == expected
    assert parse([wire[i : i + 1] for i in range(len(wire))], kinds) == expected
    for size in (2, 3, 7, 64):
        assert parse([wire[i : i + size] for i in range(0, len(wire), size)], kinds) == expected


def test_pipelined_in_every_two_chunk_split() -> None:
    cases = VALID_REPLIES[:3] + VALID_REPLIES[8:10] + VALID_REPLIES[-2:]
    wire = b"".join(case[1] for case in cases)
    kinds = [case[0] for case in cases]
    expected = [case[2] for case in cases]
    for chunks in chunkings(wire):
        assert parse(chunks, kinds) == expected


def test_items_are_immutable_tuples_with_named_fields() -> None:
    item = parse([b"VALUE k 3 1 9\r\nv\r\nEND\r\n"], [K.RETRIEVAL])[0][0]
    assert (item.key, item.value, item.flags, item.cas) == (b"k", b"v", 3, 9)
    assert type(item.key) is bytes
    assert type(item.value) is bytes
    with pytest.raises(AttributeError):
        item.value = b"other"


def test_large_value_comes_back_as_exact_bytes() -> None:
    value = bytes(range(256)) * 4096  # 1 MiB, every byte value, \r\n included
    wire = encode_retrieval([(b"big", 0, value, None)])
    parser = ReplyParser()
    chunks = [wire[i : i + 65536] for i in range(0, len(wire), 65536)]
    [items] = parse(chunks, [K.RETRIEVAL], parser)
    assert items == [Item(b"big", value, 0, None)]
    assert type(items[0].value) is bytes
    # The buffer the value was copied out of is still free to be reused and resized.
    assert parse(
        [b"STO", b"RED\r\n" + wire[:100], wire[100:]], [K.STORAGE, K.RETRIEVAL], parser
    ) == [
        Status.STORED,
        [Item(b"big", value, 0, None)],
    ]


def test_status_values_are_the_wire_words() -> None:
    for member in Status:
        assert parse([member.value + b"\r\n"], [_kind_accepting(member)]) == [member]


def _kind_accepting(status: Status) -> ReplyKind:
    return {
        Status.STORED: K.STORAGE,
        Status.NOT_STORED: K.STORAGE,
        Status.EXISTS: K.STORAGE,
        Status.NOT_FOUND: K.DELETE,
        Status.DELETED: K.DELETE,
        Status.TOUCHED: K.TOUCH,
        Status.OK: K.OK,
    }[status]


# -- error lines ------------------------------------------------------------------------------


# META replies hold their error lines and end at MN: see test_protocol_meta.py.
@pytest.mark.parametrize(
    "kind", [kind for kind in ReplyKind if kind is not K.META], ids=lambda kind: kind.name
)
@pytest.mark.parametrize("error", ERROR_LINES, ids=lambda error: repr(error[0]))
def test_error_line_in_place_of_any_reply(
    kind: ReplyKind, error: tuple[bytes, type[CommandError], str]
) -> None:
    wire, error_type, message = error
    for chunks in chunkings(wire + b"STORED\r\n"):
        parser = ReplyParser()
        replies = parse(chunks, [kind, K.STORAGE], parser)
        assert replies == [(error_type, message), Status.STORED]


@pytest.mark.parametrize("error", ERROR_LINES, ids=lambda error: repr(error[0]))
def test_returned_errors_carry_their_message(error: tuple[bytes, type[CommandError], str]) -> None:
    wire, error_type, message = error
    parser = ReplyParser()
    parser.feed(wire)
    reply = parser.next_reply(K.STORAGE)
    assert type(reply) is error_type
    assert isinstance(reply, CommandError)
    assert reply.message == message


def test_object_too_large_is_also_a_server_error() -> None:
    parser = ReplyParser()
    parser.feed(b"SERVER_ERROR object too large for cache\r\n")
    reply = parser.next_reply(K.STORAGE)
    assert isinstance(reply, ServerError)
    assert isinstance(reply, ValueTooLargeError)


def test_other_server_errors_are_not_value_too_large() -> None:
    parser = ReplyParser()
    parser.feed(b"SERVER_ERROR out of memory storing object\r\n")
    reply = parser.next_reply(K.STORAGE)
    assert isinstance(reply, ServerError)
    assert not isinstance(reply, ValueTooLargeError)


def test_error_line_with_an_explanation_is_still_unknown_command() -> None:
    assert parse([b"ERROR unknown command\r\n"], [K.OK]) == [
        (UnknownCommandError, "unknown command")
    ]


@pytest.mark.parametrize("error", ERROR_LINES, ids=lambda error: repr(error[0]))
def test_error_after_some_items_drops_them(error: tuple[bytes, type[CommandError], str]) -> None:
    wire, error_type, message = error
    stream = b"VALUE a 0 1\r\nx\r\nVALUE b 0 2\r\nyz\r\n" + wire + b"END\r\n"
    for chunks in chunkings(stream):
        # The items read before the error must not leak into the following reply.
        assert parse(chunks, [K.RETRIEVAL, K.RETRIEVAL]) == [(error_type, message), []]


def test_error_after_some_stats_drops_them() -> None:
    stream = b"STAT a 1\r\nSERVER_ERROR busy\r\nSTAT b 2\r\nEND\r\n"
    for chunks in chunkings(stream):
        assert parse(chunks, [K.STATS, K.STATS]) == [(ServerError, "busy"), {"b": "2"}]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n", "MEMLIMIT_TOO_SMALL"),
        (b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n", "MEMLIMIT_ADJUST"),
    ],
)
def test_cache_memlimit_refusals_are_server_errors(wire: bytes, message: str) -> None:
    [reply] = parse([wire], [K.OK])
    assert reply[0] is ServerError
    assert message in reply[1]


# -- protocol errors --------------------------------------------------------------------------

# (kind, wire bytes, text the error message must show)
BROKEN: list[tuple[ReplyKind, bytes, str]] = [
    (K.RETRIEVAL, b"STORED\r\n", "STORED"),
    (K.RETRIEVAL, b"VALUE k 0\r\n", "VALUE k 0"),
    (K.RETRIEVAL, b"VALUE k\r\n", "VALUE k"),
    (K.RETRIEVAL, b"VALUE k 0 5 6 7\r\nhello\r\nEND\r\n", "VALUE k 0 5 6 7"),
    (K.RETRIEVAL, b"VALUE k x 5\r\nhello\r\nEND\r\n", "VALUE k x 5"),
    (K.RETRIEVAL, b"VALUE k 0 five\r\nhello\r\nEND\r\n", "five"),
    (K.RETRIEVAL, b"VALUE k 0 5 abc\r\nhello\r\nEND\r\n", "abc"),
    (K.RETRIEVAL, b"VALUE k 0 -5\r\n", "-5"),
    (K.RETRIEVAL, b"VALUE k -1 5\r\nhello\r\nEND\r\n", "-1"),
    (K.RETRIEVAL, b"VALUE k +1 5\r\nhello\r\nEND\r\n", "+1"),
    (K.RETRIEVAL, b"VALUE k 1_0 5\r\nhello\r\nEND\r\n", "1_0"),
    (K.RETRIEVAL, b"VALUE k 4294967296 5\r\nhello\r\nEND\r\n", "4294967296"),
    (K.RETRIEVAL, b"VALUE k 0 5 18446744073709551616\r\nhello\r\nEND\r\n", "18446744073709551616"),
    (K.RETRIEVAL, b"VALUE k 0 5 \r\nhello\r\nEND\r\n", "VALUE k 0 5 "),
    (K.RETRIEVAL, b"VALUE  k 0 5\r\nhello\r\nEND\r\n", "VALUE  k"),
    (K.RETRIEVAL, b"VALUE k 0 5\r\nhelloXX\r\nEND\r\n", "b'X"),
    (K.RETRIEVAL, b"VALUE k 0 5\r\nhello\nEND\r\n", "b'\\n"),
    (K.RETRIEVAL, b"VALUE k 0 5\r\nhelloo\r\nEND\r\n", "b'o"),
    (K.RETRIEVAL, b"VALUE k 0 5\r\nhell\r\nEND\r\n", "b'\\n"),
    (K.RETRIEVAL, b"END \r\n", "END "),
    (K.RETRIEVAL, b"end\r\n", "end"),
    (K.RETRIEVAL, b"END\n", "END\\n"),
    (K.RETRIEVAL, b"VALUE k 0 5\n", "VALUE k 0 5\\n"),
    (K.RETRIEVAL, b"\r\n", "''"),
    (K.STORAGE, b"END\r\n", "END"),
    (K.STORAGE, b"DELETED\r\n", "DELETED"),
    (K.STORAGE, b"STORED \r\n", "STORED "),
    (K.STORAGE, b"stored\r\n", "stored"),
    (K.STORAGE, b"STORED\n", "STORED\\n"),
    (K.STORAGE, b"\n", "\\n"),
    (K.STORAGE, b"STORED\r\r\n", "STORED\\r"),
    (K.DELETE, b"STORED\r\n", "STORED"),
    (K.DELETE, b"TOUCHED\r\n", "TOUCHED"),
    (K.TOUCH, b"DELETED\r\n", "DELETED"),
    (K.TOUCH, b"OK\r\n", "OK"),
    (K.ARITHMETIC, b"-5\r\n", "-5"),
    (K.ARITHMETIC, b"12a\r\n", "12a"),
    (K.ARITHMETIC, b"1 2\r\n", "1 2"),
    (K.ARITHMETIC, b"\r\n", "''"),
    (K.ARITHMETIC, b"18446744073709551616\r\n", "18446744073709551616"),
    (K.ARITHMETIC, b"1" * 30 + b"\r\n", "111111"),
    (K.ARITHMETIC, b"STORED\r\n", "STORED"),
    (K.ARITHMETIC, b"\xd9\xa3\r\n", "\\xd9\\xa3"),  # an Arabic-Indic digit is not a digit here
    (K.OK, b"STORED\r\n", "STORED"),
    (K.OK, b"OK OK\r\n", "OK OK"),
    (K.VERSION, b"VERSION\r\n", "VERSION"),
    (K.VERSION, b"1.6.18\r\n", "1.6.18"),
    (K.STATS, b"STAT\r\n", "STAT"),
    (K.STATS, b"STAT \r\n", "STAT "),
    (K.STATS, b"STAT pid 1\r\nSTORED\r\n", "STORED"),
    (K.STATS, b"STAT pid 1\r\nITEM k [1 b; 0 s]\r\nEND\r\n", "ITEM k"),
    (K.STATS, b"VALUE k 0 1\r\nx\r\nEND\r\n", "VALUE k"),
]


@pytest.mark.parametrize("case", BROKEN, ids=case_id)
def test_broken_reply_raises_in_every_chunking(case: tuple[ReplyKind, bytes, str]) -> None:
    kind, wire, shown = case
    for chunks in chunkings(wire):
        parser = ReplyParser()
        with pytest.raises(ProtocolError) as caught:
            drain(parser, chunks, kind)
        assert shown in str(caught.value), (chunks, str(caught.value))


@pytest.mark.parametrize("case", BROKEN, ids=case_id)
def test_parser_stays_dead_after_a_protocol_error(case: tuple[ReplyKind, bytes, str]) -> None:
    kind, wire, _ = case
    parser = ReplyParser()
    with pytest.raises(ProtocolError):
        drain(parser, [wire], kind)
    for other in ReplyKind:
        with pytest.raises(ProtocolError):
            parser.next_reply(other)
    with pytest.raises(ProtocolError):
        parser.feed(b"STORED\r\n")
    with pytest.raises(ProtocolError):
        parser.next_reply(K.STORAGE)


def test_error_message_shows_only_a_short_repr() -> None:
    parser = ReplyParser()
    parser.feed(b"GARBAGE" * 1000 + b"\r\n")
    with pytest.raises(ProtocolError) as caught:
        parser.next_reply(K.STORAGE)
    assert "GARBAGE" in str(caught.value)
    assert len(str(caught.value)) < 300


def test_huge_declared_length_fails_at_the_header_without_allocating() -> None:
    parser = ReplyParser()
    tracemalloc.start()
    try:
        parser.feed(b"VALUE k 0 1000000000000\r\n")
        with pytest.raises(ProtocolError, match="1000000000000"):
            parser.next_reply(K.RETRIEVAL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_declared_length_checked_before_any_data_arrives() -> None:
    parser = ReplyParser(max_value_size=100)
    parser.feed(b"VALUE k 0 101\r\n")
    with pytest.raises(ProtocolError, match="101"):
        parser.next_reply(K.RETRIEVAL)


def test_max_value_size_is_inclusive() -> None:
    value = b"v" * 100
    wire = encode_retrieval([(b"k", 0, value, None)])
    assert parse([wire], [K.RETRIEVAL], ReplyParser(max_value_size=100)) == [
        [Item(b"k", value, 0, None)]
    ]
    with pytest.raises(ProtocolError):
        parse([wire], [K.RETRIEVAL], ReplyParser(max_value_size=99))


def test_bad_data_terminator_is_noticed_from_its_first_byte() -> None:
    parser = ReplyParser()
    parser.feed(b"VALUE k 0 5\r\nhello")
    assert parser.next_reply(K.RETRIEVAL) is None
    parser.feed(b"X")
    with pytest.raises(ProtocolError, match=re.escape("b'X'")):
        parser.next_reply(K.RETRIEVAL)


def test_line_of_exactly_max_line_length_is_accepted() -> None:
    stats_line = b"STAT name " + b"v" * 10  # 20 bytes
    parser = ReplyParser(max_line_length=20)
    assert parse([stats_line + b"\r\nEND\r\n"], [K.STATS], parser) == [{"name": "v" * 10}]
    parser = ReplyParser(max_line_length=20)
    trickled = [bytes([byte]) for byte in stats_line + b"\r\nEND\r\n"]
    assert parse(trickled, [K.STATS], parser) == [{"name": "v" * 10}]


def test_longer_line_fails_as_soon_as_the_limit_is_passed() -> None:
    parser = ReplyParser(max_line_length=20)
    parser.feed(b"STAT name " + b"v" * 11)  # 21 bytes, no line end
    assert parser.next_reply(K.STATS) is None  # the CRLF could still be next
    parser.feed(b"\r")  # 21 bytes and a CR: the line is already too long
    with pytest.raises(ProtocolError, match="20 bytes"):
        parser.next_reply(K.STATS)


def test_endless_line_fails_without_waiting_for_more() -> None:
    parser = ReplyParser(max_line_length=100)
    for _ in range(101):
        parser.feed(b"x")
        assert parser.next_reply(K.STORAGE) is None
    parser.feed(b"x")
    with pytest.raises(ProtocolError, match="no line ending"):
        parser.next_reply(K.STORAGE)


def test_switching_kind_in_the_middle_of_a_reply_is_a_caller_bug() -> None:
    parser = ReplyParser()
    parser.feed(b"VALUE k 0 5\r\nhel")
    assert parser.next_reply(K.RETRIEVAL) is None
    with pytest.raises(RuntimeError):
        parser.next_reply(K.STORAGE)
    parser.feed(b"lo\r\nEND\r\n")
    assert parser.next_reply(K.RETRIEVAL) == [Item(b"k", b"hello", 0, None)]


@pytest.mark.parametrize(
    "options",
    [
        {"max_value_size": -1},
        {"max_line_length": 0},
        {"max_value_size": 1.5},
        {"max_line_length": True},
    ],
)
def test_bad_limits_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ReplyParser(**options)


# -- scale ------------------------------------------------------------------------------------


def test_long_pipelined_stream_in_uneven_chunks() -> None:
    # Far more than the compaction threshold, so the buffer is compacted mid-stream.
    items = [(b"key%d" % i, i, bytes([i % 256]) * (i % 300), i) for i in range(3000)]
    wire = b"".join(encode_retrieval([item]) + b"STORED\r\n" for item in items)
    kinds = [K.RETRIEVAL, K.STORAGE] * len(items)
    expected: list[Any] = []
    for item in items:
        expected += [expected_items([item]), Status.STORED]
    assert parse([wire[i : i + 7001] for i in range(0, len(wire), 7001)], kinds) == expected


@pytest.mark.parametrize("chunk_size", [1, 4096])
def test_one_mib_value_in_small_chunks(chunk_size: int) -> None:
    value = bytes(range(256)) * 4096
    wire = encode_retrieval([(b"big", 0, value, 1)])
    parser = ReplyParser(max_value_size=len(value))
    replies = []
    for start in range(0, len(wire), chunk_size):
        parser.feed(wire[start : start + chunk_size])
        reply = parser.next_reply(K.RETRIEVAL)
        if reply is not None:
            replies.append(reply)
    assert replies == [[Item(b"big", value, 0, 1)]]


class CountingBuffer(bytearray):
    """A receive buffer that adds up how many bytes its find() calls were asked to search."""

    searched = 0

    def find(self, sub: Any, start: Any = None, end: Any = None) -> int:
        low = 0 if start is None else start
        high = len(self) if end is None else min(end, len(self))
        self.searched += max(0, high - low)
        return super().find(sub, start, end)


def test_line_search_resumes_where_it_stopped() -> None:
    # White-box: swaps in a buffer that measures the searching. memchr is too fast for a
    # timing test to tell one pass from a pass per byte at any test-friendly size.
    length = 20_000
    line = b"VERSION " + b"9" * length + b"\r\n"
    parser = ReplyParser(max_line_length=len(line))
    buffer = CountingBuffer()
    parser._buffer = buffer
    replies = []
    for byte in line:
        parser.feed(bytes((byte,)))
        reply = parser.next_reply(K.VERSION)
        if reply is not None:
            replies.append(reply)
    assert replies == ["9" * length]
    assert parser._buffer is buffer  # the measurement covered the whole line
    assert 0 < buffer.searched <= 2 * len(line)


# -- properties -------------------------------------------------------------------------------

keys = st.lists(st.sampled_from(ALLOWED), min_size=1, max_size=250).map(bytes)
values = st.lists(
    st.one_of(
        st.sampled_from(
            [b"\r\nEND\r\n", b"VALUE ", b"VALUE k 0 1\r\n", b"\r\n", b"\x00", b"\n", b"\r", b"END"]
        ),
        st.binary(max_size=64),
    ),
    max_size=10,
).map(b"".join)
item_lists = st.booleans().flatmap(
    lambda with_cas: st.lists(
        st.tuples(
            keys,
            st.integers(0, 2**32 - 1),
            values,
            st.integers(0, 2**64 - 1) if with_cas else st.none(),
        ),
        max_size=6,
    )
)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(point % (len(data) + 1) for point in points)})
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


@settings(deadline=None)
@given(items=item_lists, points=st.lists(st.integers(min_value=0), max_size=30))
def test_retrieval_round_trip_in_arbitrary_chunks(
    items: list[tuple[bytes, int, bytes, int | None]], points: list[int]
) -> None:
    wire = encode_retrieval(items)
    assert parse(cut(wire, points), [K.RETRIEVAL]) == [expected_items(items)]


@settings(deadline=None)
@given(
    replies=st.lists(item_lists, min_size=1, max_size=5),
    points=st.lists(st.integers(min_value=0), max_size=30),
)
def test_pipelined_retrievals_round_trip_in_arbitrary_chunks(
    replies: list[list[tuple[bytes, int, bytes, int | None]]], points: list[int]
) -> None:
    wire = b"".join(encode_retrieval(items) + b"DELETED\r\n" for items in replies)
    kinds = [K.RETRIEVAL, K.DELETE] * len(replies)
    expected: list[Any] = []
    for items in replies:
        expected += [expected_items(items), Status.DELETED]
    assert parse(cut(wire, points), kinds) == expected


@settings(deadline=None)
@given(
    stats=st.dictionaries(
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=30),
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
        max_size=20,
    ),
    points=st.lists(st.integers(min_value=0), max_size=20),
)
def test_stats_round_trip_in_arbitrary_chunks(stats: dict[str, str], points: list[int]) -> None:
    wire = b"".join(f"STAT {name} {value}\r\n".encode() for name, value in stats.items())
    wire += b"END\r\n"
    assert parse(cut(wire, points), [K.STATS]) == [stats]


@given(number=st.integers(0, 2**64 - 1), points=st.lists(st.integers(min_value=0), max_size=5))
def test_arithmetic_round_trip(number: int, points: list[int]) -> None:
    assert parse(cut(b"%d\r\n" % number, points), [K.ARITHMETIC]) == [number]


@given(garbage=st.binary(min_size=1, max_size=40))
def test_arbitrary_bytes_never_escape_as_other_exceptions(garbage: bytes) -> None:
    for kind in ReplyKind:
        try:
            drain(ReplyParser(), [garbage], kind)
        except ProtocolError:
            pass


def test_unread_counts_bytes_no_reply_has_used() -> None:
    parser = ReplyParser()
    assert parser.unread == 0
    parser.feed(b"STORED\r\nEND\r\nJUNK")
    assert parser.next_reply(K.STORAGE) is Status.STORED
    assert parser.unread == len(b"END\r\nJUNK")
    assert parser.next_reply(K.RETRIEVAL) == []
    assert parser.unread == len(b"JUNK")
    parser.feed(b"\r\n")
    assert parser.unread == len(b"JUNK\r\n")


# -- multi-key gets read with their keys (an autobatched get's reply) -----------------------


def ask(parser: ReplyParser, chunks: Sequence[bytes], keys: Sequence[bytes]) -> Any:
    """Feed chunks one by one, asking for one retrieval of ``keys`` the way a batch does."""
    reply = None
    for chunk in chunks:
        parser.feed(chunk)
        reply = parser.next_reply(K.RETRIEVAL, keys)
        if reply is not None:
            break
    return comparable(reply)


@settings(deadline=None)
@given(
    items=item_lists,
    misses=st.lists(keys, max_size=4),
    memcached_order=st.booleans(),
    points=st.lists(st.integers(min_value=0), max_size=10),
)
def test_multi_key_retrieval_round_trip_with_its_keys(
    items: list[tuple[bytes, int, bytes, int | None]],
    misses: list[bytes],
    memcached_order: bool,
    points: list[int],
) -> None:
    # Each key answered once (as memcached does for keys asked once); the keys asked are
    # the answered ones in the reply's order (memcached's) or reversed, and some misses.
    seen: set[bytes] = set()
    items = [item for item in items if not (item[0] in seen or seen.add(item[0]))]
    answered = [key for key, *_ in items]
    asked = list(dict.fromkeys(answered + [k for k in misses if k not in seen]))
    if not memcached_order:
        asked.reverse()
    if len(asked) < 2:
        asked.append(b"another-key-" * 3)  # a multi-key get: a one-key get reads otherwise
    wire = encode_retrieval(items)
    for chunks in ([wire], cut(wire, points)):
        parser = ReplyParser()
        assert ask(parser, chunks, asked) == expected_items(items)
        assert parser.idle


@pytest.mark.parametrize(
    "wire",
    [
        b"VALUE a 0 1\r\nx\r\nVALUE c 0 1\r\ny\r\nEND\r\n",  # c was not asked for
        b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n",  # a answered twice
    ],
)
def test_multi_key_retrieval_with_an_item_not_asked_for_is_a_protocol_error(wire: bytes) -> None:
    parser = ReplyParser()
    parser.feed(wire)
    with pytest.raises(ProtocolError):
        parser.next_reply(K.RETRIEVAL, [b"a", b"b"])


@pytest.mark.parametrize(
    ("wire", "item"),
    [
        # Shapes the one-split reader leaves to the item by item one, read the same.
        (b"VALUE a 4294967295 1\r\nx\r\nEND\r\n", Item(b"a", b"x", 2**32 - 1, None)),
        (b"VALUE a 0 03\r\nabc\r\nEND\r\n", Item(b"a", b"abc", 0, None)),
        (b"VALUE a 01 1\r\nx\r\nEND\r\n", Item(b"a", b"x", 1, None)),
        (b"VALUE a 0 4\r\na\r\nb\r\nEND\r\n", Item(b"a", b"a\r\nb", 0, None)),
        (b"VALUE a 0 3\r\nEND\r\nEND\r\n", Item(b"a", b"END", 0, None)),
        (b"VALUE a 7 5000\r\n" + b"z" * 5000 + b"\r\nEND\r\n", Item(b"a", b"z" * 5000, 7, None)),
        (b"VALUE a 0 1 99\r\nx\r\nEND\r\n", Item(b"a", b"x", 0, 99)),
    ],
)
def test_multi_key_retrieval_of_unusual_items(wire: bytes, item: Item) -> None:
    parser = ReplyParser()
    parser.feed(wire)
    assert parser.next_reply(K.RETRIEVAL, [b"a", b"b"]) == [item]
    assert parser.idle


def test_multi_key_retrieval_followed_by_the_next_reply() -> None:
    parser = ReplyParser()
    parser.feed(b"VALUE a 0 1\r\nx\r\nEND\r\nVALUE b 0 1\r\ny\r\nEND\r\n")
    assert parser.next_reply(K.RETRIEVAL, [b"a", b"b"]) == [Item(b"a", b"x", 0, None)]
    assert parser.next_reply(K.RETRIEVAL, [b"b", b"c"]) == [Item(b"b", b"y", 0, None)]
    assert parser.idle
