"""The meta protocol's encoders and reply reader: exact bytes, refusals, every split of a
reply stream, bounded memory, and properties over arbitrary replies and chunkings."""

from __future__ import annotations

import base64
import itertools
import tracemalloc
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_fastcache.errors import (
    ClientError,
    InvalidArgumentError,
    InvalidKeyError,
    ProtocolError,
    ServerError,
    ValueTooLargeError,
)
from django_fastcache.protocol import meta
from django_fastcache.protocol.meta import (
    MAX_BINARY_KEY_LENGTH,
    MetaReply,
    MetaStatus,
    MetaUnsupportedError,
    meta_arithmetic_command,
    meta_delete_command,
    meta_get_command,
    meta_get_many_command,
    meta_noop_command,
    meta_set_command,
    read_meta_replies,
    read_meta_reply,
)
from django_fastcache.protocol.parser import Item, ReplyKind, ReplyParser, Status, whole_meta_reply

META = ReplyKind.META
S = MetaStatus
FORBIDDEN = [*range(0x00, 0x21), 0x7F]
ALLOWED = [b for b in range(256) if b not in FORBIDDEN]


# -- helpers ----------------------------------------------------------------------------------


def comparable(reply: Any) -> Any:
    """Exceptions compare by identity; compare them by type and message instead."""
    if isinstance(reply, BaseException):
        return (type(reply), str(reply))
    if isinstance(reply, list):
        return [comparable(each) for each in reply]
    return reply


def parse(chunks: Sequence[bytes], kinds: Sequence[ReplyKind], **limits: int) -> list[Any]:
    """Feed chunks one by one, asking for replies the way a connection does."""
    parser = ReplyParser(**limits)
    replies: list[Any] = []
    for chunk in chunks:
        parser.feed(chunk)
        while len(replies) < len(kinds):
            reply = parser.next_reply(kinds[len(replies)])
            if reply is None:
                break
            replies.append(comparable(reply))
    assert parser.unread == 0
    return replies


def drain(parser: ReplyParser, chunks: Sequence[bytes]) -> None:
    """Feed every chunk, reading META replies as they complete."""
    for chunk in chunks:
        parser.feed(chunk)
        while parser.next_reply(META) is not None:
            pass


def chunkings(data: bytes) -> Iterator[list[bytes]]:
    """The whole buffer, every two-chunk split, and one byte at a time."""
    yield [data]
    for cut_at in range(1, len(data)):
        yield [data[:cut_at], data[cut_at:]]
    yield [data[i : i + 1] for i in range(len(data))]


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(point % (len(data) + 1) for point in points)})
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


# -- encoders ---------------------------------------------------------------------------------

# (request built, exact bytes); expectations written by hand from protocol.txt.
ENCODED: list[tuple[bytes, bytes]] = [
    (meta_get_command(b"k"), b"mg k v\r\n"),
    (meta_get_command(b"k", value=False), b"mg k\r\n"),
    (
        meta_get_command(
            b"k",
            cas=True,
            client_flags=True,
            ttl=True,
            size=True,
            return_key=True,
            hit=True,
            last_access=True,
            no_bump=True,
            quiet=True,
        ),
        b"mg k v c f t s k h l u q\r\n",
    ),
    (meta_get_command(b"k", vivify=30, recache=10, touch=60), b"mg k v T60 N30 R10\r\n"),
    (meta_get_command(b"k", touch=-1, opaque=b"req-7"), b"mg k v T-1 Oreq-7\r\n"),
    (meta_get_command(b"\x00\xff", base64_key=True, value=False), b"mg AP8= b\r\n"),
    (meta_set_command(b"k", b"hello"), b"ms k 5\r\nhello\r\n"),
    (meta_set_command(b"k", bytearray(b"\r\nMN\r\n")), b"ms k 6\r\n\r\nMN\r\n\r\n"),
    (meta_set_command(b"k", memoryview(b"")), b"ms k 0\r\n\r\n"),
    (
        meta_set_command(b"k", b"v", client_flags=7, ttl=30, return_cas=True, return_key=True),
        b"ms k 1 F7 T30 c k\r\nv\r\n",
    ),
    (meta_set_command(b"k", b"v", mode="add", quiet=True), b"ms k 1 ME q\r\nv\r\n"),
    (meta_set_command(b"k", b"v", mode="replace"), b"ms k 1 MR\r\nv\r\n"),
    (meta_set_command(b"k", b"v", mode="append", vivify=60), b"ms k 1 MA N60\r\nv\r\n"),
    (meta_set_command(b"k", b"v", mode="prepend"), b"ms k 1 MP\r\nv\r\n"),
    (
        meta_set_command(b"k", b"v", compare_cas=2**64 - 1, invalidate=True),
        b"ms k 1 C18446744073709551615 I\r\nv\r\n",
    ),
    (meta_set_command(b"\x00", b"v", base64_key=True, opaque=b"1"), b"ms AA== 1 b O1\r\nv\r\n"),
    (meta_delete_command(b"k"), b"md k\r\n"),
    (meta_delete_command(b"k", compare_cas=5, quiet=True), b"md k C5 q\r\n"),
    (meta_delete_command(b"k", invalidate=True, ttl=30), b"md k I T30\r\n"),
    (meta_delete_command(b"k", return_key=True, opaque=b"x"), b"md k k Ox\r\n"),
    (meta_arithmetic_command(b"n"), b"ma n v\r\n"),
    (meta_arithmetic_command(b"n", value=False), b"ma n\r\n"),
    (meta_arithmetic_command(b"n", mode="decr", delta=3), b"ma n MD D3 v\r\n"),
    (meta_arithmetic_command(b"n", delta=0), b"ma n D0 v\r\n"),
    (
        meta_arithmetic_command(b"n", vivify=0, initial=10, ttl=60, cas=True, return_ttl=True),
        b"ma n N0 J10 T60 v c t\r\n",
    ),
    (meta_arithmetic_command(b"n", compare_cas=9, quiet=True), b"ma n C9 v q\r\n"),
    (meta_noop_command(), b"mn\r\n"),
    (meta_get_many_command([b"a", b"b"]), b"mg a v f k q\r\nmg b v f k q\r\nmn\r\n"),
    (meta_get_many_command((b"a",), cas=True), b"mg a v f k c q\r\nmn\r\n"),
    (meta_get_many_command([b"\x00"], base64_key=True), b"mg AA== b v f k q\r\nmn\r\n"),
    (meta_get_many_command([]), b"mn\r\n"),
]


@pytest.mark.parametrize(("built", "wire"), ENCODED, ids=[w.decode("latin-1") for _, w in ENCODED])
def test_encoders_write_exact_requests(built: bytes, wire: bytes) -> None:
    assert built == wire


REFUSED: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
    (meta_get_command, {"key": b"a b"}, InvalidKeyError, "spaces"),
    (meta_get_command, {"key": b""}, InvalidKeyError, "empty"),
    (meta_get_command, {"key": b"k" * 251}, InvalidKeyError, "251"),
    (meta_get_command, {"key": "text"}, InvalidKeyError, "str"),
    (meta_get_command, {"key": b"k\r\nmn"}, InvalidKeyError, "control"),
    (meta_get_command, {"key": b"k", "cas": 1}, InvalidArgumentError, "cas must be a bool"),
    (meta_get_command, {"key": b"k", "vivify": "30"}, InvalidArgumentError, "vivify"),
    (meta_get_command, {"key": b"k", "vivify": True}, InvalidArgumentError, "vivify"),
    (meta_get_command, {"key": b"k", "touch": 2**31}, InvalidArgumentError, "touch"),
    (meta_get_command, {"key": b"k", "recache": -(2**31) - 1}, InvalidArgumentError, "recache"),
    (meta_get_command, {"key": b"k", "opaque": b"o" * 33}, InvalidArgumentError, "opaque"),
    (meta_get_command, {"key": b"k", "opaque": b"a b"}, InvalidArgumentError, "opaque"),
    (meta_get_command, {"key": b"k", "opaque": b""}, InvalidArgumentError, "opaque"),
    (meta_get_command, {"key": b"k", "opaque": 7}, InvalidArgumentError, "opaque"),
    (meta_get_command, {"key": b"", "base64_key": True}, InvalidKeyError, "empty"),
    (meta_get_command, {"key": "k", "base64_key": True}, InvalidKeyError, "str"),
    (
        meta_get_command,
        {"key": b"x" * (MAX_BINARY_KEY_LENGTH + 1), "base64_key": True},
        InvalidKeyError,
        "over the limit",
    ),
    (meta_get_command, {"key": b"k", "base64_key": 1}, InvalidArgumentError, "base64_key"),
    (meta_set_command, {"key": b"k", "value": "v"}, InvalidArgumentError, "values must be"),
    (meta_set_command, {"key": b"k k", "value": b"v"}, InvalidKeyError, "spaces"),
    (meta_set_command, {"key": b"k", "value": b"v", "mode": "cas"}, InvalidArgumentError, "mode"),
    (meta_set_command, {"key": b"k", "value": b"v", "mode": b"set"}, InvalidArgumentError, "mode"),
    (
        meta_set_command,
        {"key": b"k", "value": b"v", "client_flags": 2**32},
        InvalidArgumentError,
        "client_flags",
    ),
    (
        meta_set_command,
        {"key": b"k", "value": b"v", "client_flags": -1},
        InvalidArgumentError,
        "client_flags",
    ),
    (
        meta_set_command,
        {"key": b"k", "value": b"v", "compare_cas": 2**64},
        InvalidArgumentError,
        "compare_cas",
    ),
    (
        meta_set_command,
        {"key": b"k", "value": b"v", "invalidate": True},
        InvalidArgumentError,
        "needs compare_cas",
    ),
    (
        meta_set_command,
        {"key": b"k", "value": b"v", "vivify": 30},
        InvalidArgumentError,
        "append and prepend",
    ),
    (meta_set_command, {"key": b"k", "value": b"v", "ttl": 1.5}, InvalidArgumentError, "ttl"),
    (
        meta_delete_command,
        {"key": b"k", "ttl": 30},
        InvalidArgumentError,
        "invalidating delete only",
    ),
    (meta_delete_command, {"key": b"k", "compare_cas": -1}, InvalidArgumentError, "compare_cas"),
    (meta_delete_command, {"key": b"k", "invalidate": None}, InvalidArgumentError, "invalidate"),
    (meta_arithmetic_command, {"key": b"n", "delta": -1}, InvalidArgumentError, "delta"),
    (meta_arithmetic_command, {"key": b"n", "delta": 2**64}, InvalidArgumentError, "delta"),
    (meta_arithmetic_command, {"key": b"n", "mode": "add"}, InvalidArgumentError, "mode"),
    (meta_arithmetic_command, {"key": b"n", "initial": 5}, InvalidArgumentError, "needs vivify"),
    (
        meta_arithmetic_command,
        {"key": b"n", "vivify": 0, "initial": 2**64},
        InvalidArgumentError,
        "initial",
    ),
]


@pytest.mark.parametrize(
    ("encoder", "arguments", "error", "message"),
    REFUSED,
    ids=[f"{case[0].__name__}-{case[3]}" for case in REFUSED],
)
def test_encoders_refuse_bad_arguments_with_typed_errors(
    encoder: Any, arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    key = arguments.pop("key")
    args = (key, arguments.pop("value")) if "value" in arguments else (key,)
    with pytest.raises(error, match=message):
        encoder(*args, **arguments)


@pytest.mark.parametrize(
    ("keys", "options", "error"),
    [
        (b"ab", {}, InvalidArgumentError),
        ("ab", {}, InvalidArgumentError),
        ([b"ok", b"not ok"], {}, InvalidKeyError),
        ([b"ok", "text"], {}, InvalidKeyError),
        ([b""], {"base64_key": True}, InvalidKeyError),
        ([b"ok"], {"cas": None}, InvalidArgumentError),
    ],
)
def test_multi_get_refuses_bad_keys_and_options(
    keys: Any, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        meta_get_many_command(keys, **options)


def test_refusals_are_value_errors_of_the_project_family() -> None:
    with pytest.raises(ValueError):
        meta_get_command(b"k", opaque=b"o" * 40)


def test_longest_binary_key_fits_memcacheds_key_limit() -> None:
    request = meta_get_command(b"\xff" * MAX_BINARY_KEY_LENGTH, base64_key=True)
    token = request.split(b" ")[1]
    assert len(token) <= 250
    assert base64.b64decode(token) == b"\xff" * MAX_BINARY_KEY_LENGTH


@given(key=st.binary(min_size=1, max_size=MAX_BINARY_KEY_LENGTH), value=st.binary(max_size=64))
def test_binary_keys_travel_as_one_clean_token(key: bytes, value: bytes) -> None:
    request = meta_set_command(key, value, base64_key=True)
    line, _, rest = request.partition(b"\r\n")
    assert rest == value + b"\r\n"
    tokens = line.split(b" ")
    assert tokens[:3] == [b"ms", tokens[1], b"%d" % len(value)]
    assert b"b" in tokens[3:]
    assert base64.b64decode(tokens[1], validate=True) == key
    assert not any(byte in FORBIDDEN for token in tokens for byte in token)


@given(
    key=st.lists(st.sampled_from(ALLOWED), min_size=1, max_size=250).map(bytes),
    vivify=st.none() | st.integers(-(2**31), 2**31 - 1),
    cas=st.none() | st.integers(0, 2**64 - 1),
)
def test_every_request_is_one_line_of_clean_tokens(
    key: bytes, vivify: int | None, cas: int | None
) -> None:
    for request in (
        meta_get_command(key, vivify=vivify, cas=True),
        meta_delete_command(key, compare_cas=cas),
        meta_arithmetic_command(key, vivify=vivify, compare_cas=cas),
    ):
        assert request.endswith(b"\r\n")
        assert request.count(b"\n") == 1
        tokens = request[:-2].split(b" ")
        assert tokens[1] == key
        assert all(tokens)
        assert not any(byte in FORBIDDEN for token in tokens for byte in token)


# -- replies ----------------------------------------------------------------------------------

# (wire bytes of one META reply, the list expected); expectations written by hand.
VALID: list[tuple[bytes, list[Any]]] = [
    (b"MN\r\n", []),
    (b"EN\r\nMN\r\n", [MetaReply(S.EN)]),
    (b"HD\r\nNS\r\nEX\r\nNF\r\nMN\r\n", [MetaReply(s) for s in (S.HD, S.NS, S.EX, S.NF)]),
    (b"VA 5\r\nhello\r\nMN\r\n", [MetaReply(S.VA, b"hello")]),
    # The shapes read in one step: mg's default reply and meta_get_many's.
    (b"VA 5 f0\r\nhello\r\nMN\r\n", [MetaReply(S.VA, b"hello", client_flags=0)]),
    (
        b"VA 2 f4294967295 kkey\r\nhi\r\nVA 0 f1 k\xc3\xa9\r\n\r\nMN\r\n",
        [
            MetaReply(S.VA, b"hi", client_flags=2**32 - 1, key=b"key"),
            MetaReply(S.VA, b"", client_flags=1, key=b"\xc3\xa9"),
        ],
    ),
    (
        b"VA 6 f3 kk\r\n\r\nMN\r\n\r\nMN\r\n",
        [MetaReply(S.VA, b"\r\nMN\r\n", client_flags=3, key=b"k")],
    ),
    (b"VA 1 f3 kk c9\r\nv\r\nMN\r\n", [MetaReply(S.VA, b"v", cas=9, client_flags=3, key=b"k")]),
    (b"VA 1 f3 kAA== b\r\nv\r\nMN\r\n", [MetaReply(S.VA, b"v", client_flags=3, key=b"\x00")]),
    (b"VA 0\r\n\r\nMN\r\n", [MetaReply(S.VA, b"")]),
    (b"VA 6\r\n\r\nMN\r\n\r\nMN\r\n", [MetaReply(S.VA, b"\r\nMN\r\n")]),
    (b"VA 3\r\n\x00\n\r\r\nMN\r\n", [MetaReply(S.VA, b"\x00\n\r")]),
    (
        b"VA 3 f5 c2 t60 kfoo s3 h0 l7 O123\r\nabc\r\nMN\r\n",
        [
            MetaReply(
                S.VA,
                b"abc",
                cas=2,
                client_flags=5,
                ttl=60,
                size=3,
                key=b"foo",
                opaque=b"123",
                hit=False,
                last_access=7,
            )
        ],
    ),
    (
        b"VA 0 c1 t-1 W\r\n\r\nMN\r\n",
        [MetaReply(S.VA, b"", cas=1, ttl=-1, win=True)],
    ),
    (b"HD c1 Z\r\nMN\r\n", [MetaReply(S.HD, cas=1, won_elsewhere=True)]),
    # The shapes read in one step: a counter's (ma), a lease's (mg ... N).
    (b"VA 1 c7 t-1\r\n5\r\nMN\r\n", [MetaReply(S.VA, b"5", cas=7, ttl=-1)]),
    (
        b"VA 20 c18446744073709551615 t18446744073709551615\r\n18446744073709551615\r\nMN\r\n",
        [MetaReply(S.VA, b"18446744073709551615", cas=2**64 - 1, ttl=2**64 - 1)],
    ),
    (b"VA 2 c1 t0060\r\n12\r\nMN\r\n", [MetaReply(S.VA, b"12", cas=1, ttl=60)]),
    (b"VA 0 c3 f0 W\r\n\r\nMN\r\n", [MetaReply(S.VA, b"", cas=3, client_flags=0, win=True)]),
    (
        b"VA 0 c3 f0 Z\r\n\r\nMN\r\n",
        [MetaReply(S.VA, b"", cas=3, client_flags=0, won_elsewhere=True)],
    ),
    (
        b"VA 1 c3 f2 kab X W\r\nv\r\nMN\r\n",
        [MetaReply(S.VA, b"v", cas=3, client_flags=2, key=b"ab", stale=True, win=True)],
    ),
    (b"VA 1 X W\r\nv\r\nMN\r\n", [MetaReply(S.VA, b"v", stale=True, win=True)]),
    (
        b"VA 1 Z X h1\r\nv\r\nMN\r\n",
        [MetaReply(S.VA, b"v", stale=True, won_elsewhere=True, hit=True)],
    ),
    (
        b"VA 20 c18446744073709551615 f4294967295\r\n18446744073709551615\r\nMN\r\n",
        [MetaReply(S.VA, b"18446744073709551615", cas=2**64 - 1, client_flags=2**32 - 1)],
    ),
    (b"HD kAAEC/w== b c8\r\nMN\r\n", [MetaReply(S.HD, cas=8, key=b"\x00\x01\x02\xff")]),
    (b"EN kYQ== b\r\nMN\r\n", [MetaReply(S.EN, key=b"a")]),
    (b"HD kYQ==\r\nMN\r\n", [MetaReply(S.HD, key=b"YQ==")]),  # no b: the key is as sent
    (b"HD Qnew x9\r\nMN\r\n", [MetaReply(S.HD, other=(b"Qnew", b"x9"))]),
    (b"HD O\r\nMN\r\n", [MetaReply(S.HD, opaque=b"")]),
    (
        b"CLIENT_ERROR bad command line format\r\nHD\r\nMN\r\n",
        [(ClientError, "bad command line format"), MetaReply(S.HD)],
    ),
    (
        b"SERVER_ERROR object too large for cache\r\nMN\r\n",
        [(ValueTooLargeError, "object too large for cache")],
    ),
    (b"SERVER_ERROR out of memory\r\nMN\r\n", [(ServerError, "out of memory")]),
    (
        b"VA 1 kx\r\n1\r\nVA 2 ky\r\n22\r\nMN\r\n",
        [MetaReply(S.VA, b"1", key=b"x"), MetaReply(S.VA, b"22", key=b"y")],
    ),
]


def valid_id(case: tuple[bytes, list[Any]]) -> str:
    return repr(case[0][:40])


@pytest.mark.parametrize("case", VALID, ids=valid_id)
def test_meta_reply_in_every_chunking(case: tuple[bytes, list[Any]]) -> None:
    wire, expected = case
    for chunks in chunkings(wire):
        assert parse(chunks, [META]) == [expected], chunks


@pytest.mark.parametrize("case", VALID, ids=valid_id)
def test_no_meta_reply_until_the_last_byte(case: tuple[bytes, list[Any]]) -> None:
    wire, _ = case
    for cut_at in range(len(wire)):
        parser = ReplyParser()
        parser.feed(wire[:cut_at])
        assert parser.next_reply(META) is None, wire[:cut_at]
        assert parser.next_reply(META) is None


@pytest.mark.parametrize("case", VALID, ids=valid_id)
def test_meta_reply_followed_by_the_start_of_the_next(case: tuple[bytes, list[Any]]) -> None:
    wire, expected = case
    follower = b"VA 4 kk\r\nnext\r\nMN\r\n"
    for cut_at in range(len(follower)):
        parser = ReplyParser()
        parser.feed(wire + follower[:cut_at])
        assert comparable(parser.next_reply(META)) == expected
        assert parser.next_reply(META) is None
        parser.feed(follower[cut_at:])
        assert comparable(parser.next_reply(META)) == [MetaReply(S.VA, b"next", key=b"k")]
        assert parser.unread == 0


def test_meta_and_classic_replies_pipelined_in_every_split() -> None:
    wire = (
        b"VALUE a 0 1\r\nx\r\nEND\r\n"
        + b"VA 2 W c3\r\nhi\r\nEN\r\nMN\r\n"
        + b"STORED\r\n"
        + b"MN\r\n"
        + b"HD\r\nMN\r\n"
    )
    kinds = [ReplyKind.RETRIEVAL, META, ReplyKind.STORAGE, META, META]
    expected = [
        [Item(b"a", b"x", 0, None)],
        [MetaReply(S.VA, b"hi", cas=3, win=True), MetaReply(S.EN)],
        Status.STORED,
        [],
        [MetaReply(S.HD)],
    ]
    for chunks in chunkings(wire):
        assert parse(chunks, kinds) == expected


def test_replies_are_typed_tuples_with_named_fields() -> None:
    (reply,) = parse([b"VA 1 c9 t5 W\r\nv\r\nMN\r\n"], [META])[0]
    assert isinstance(reply, MetaReply)
    assert (reply.status, reply.value, reply.cas, reply.ttl, reply.win) == (S.VA, b"v", 9, 5, True)
    assert (reply.stale, reply.won_elsewhere, reply.key) == (False, False, None)


def test_status_values_are_the_wire_codes() -> None:
    assert {status.value for status in MetaStatus} == {
        b"VA",
        b"HD",
        b"EN",
        b"NS",
        b"EX",
        b"NF",
        b"MN",
    }


def test_large_value_in_small_chunks_comes_back_exact() -> None:
    value = bytes(range(256)) * 4096  # 1 MiB, every byte value, \r\nMN\r\n-free or not
    value = value[:-6] + b"\r\nMN\r\n"
    wire = b"VA %d f1\r\n" % len(value) + value + b"\r\nMN\r\n"
    for size in (1000, 65536):
        chunks = [wire[i : i + size] for i in range(0, len(wire), size)]
        [[reply]] = parse(chunks, [META])
        assert (reply.value, reply.client_flags) == (value, 1)


def test_max_value_size_is_inclusive() -> None:
    assert parse([b"VA 4\r\nabcd\r\nMN\r\n"], [META], max_value_size=4) == [
        [MetaReply(S.VA, b"abcd")]
    ]
    parser = ReplyParser(max_value_size=3)
    parser.feed(b"VA 4\r\n")
    with pytest.raises(ProtocolError, match="over the limit of 3"):
        parser.next_reply(META)


def test_limits_hold_for_replies_read_in_one_step() -> None:
    parser = ReplyParser(max_value_size=3)
    parser.feed(b"VA 4 f0 kk\r\nabcd\r\nMN\r\n")
    with pytest.raises(ProtocolError, match="over the limit of 3"):
        parser.next_reply(META)
    parser = ReplyParser(max_line_length=12)
    parser.feed(b"VA 1 f0 kabcdefgh\r\nv\r\nMN\r\n")  # a 17-byte line
    with pytest.raises(ProtocolError, match="no line ending within 12 bytes"):
        parser.next_reply(META)


def test_huge_declared_size_fails_at_the_header_without_allocating() -> None:
    parser = ReplyParser()
    tracemalloc.start()
    try:
        parser.feed(b"VA 1000000000000 c1\r\n")
        with pytest.raises(ProtocolError, match="1000000000000"):
            parser.next_reply(META)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_many_small_pieces_read_each_complete_reply_at_most_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Linear work for a long reply trickling in: complete replies are checked once as they
    # arrive and built once more when MN arrives, never re-read on every feed.
    replies = b"".join(b"VA 3 k%d\r\nabc\r\n" % i for i in range(200)) + b"MN\r\n"
    completed = 0
    real = meta.read_meta_reply

    def counting(*args: Any) -> Any:
        nonlocal completed
        step = real(*args)
        if step is not None:
            completed += 1
        return step

    monkeypatch.setattr(meta, "read_meta_reply", counting)
    [result] = parse([replies[i : i + 5] for i in range(0, len(replies), 5)], [META])
    assert len(result) == 200
    assert completed <= 2 * 201


def test_reader_functions_work_on_plain_bytes() -> None:
    wire = b"HD c1\r\nVA 2\r\nhi\r\nMN\r\ntail"
    assert read_meta_reply(wire, 0, 100, 100) == (MetaReply(S.HD, cas=1), 7)
    replies, pos, scan = read_meta_replies(wire, 0, 0, 100, 100)
    assert replies == [MetaReply(S.HD, cas=1), MetaReply(S.VA, b"hi")]
    assert pos == scan == len(wire) - 4
    # Incomplete: nothing returned, progress kept in scan for the next call.
    replies, pos, scan = read_meta_replies(wire[:12], 0, 0, 100, 100)
    assert (replies, pos, scan) == (None, 0, 7)
    assert read_meta_replies(wire, pos, scan, 100, 100)[0] == [
        MetaReply(S.HD, cas=1),
        MetaReply(S.VA, b"hi"),
    ]


# -- what breaks the stream -------------------------------------------------------------------

BROKEN: list[tuple[bytes, type[ProtocolError], str]] = [
    (b"ERROR\r\nERROR\r\n", MetaUnsupportedError, "does not speak the meta protocol"),
    (b"HD\r\nERROR\r\n", MetaUnsupportedError, "ERROR"),
    (b"STORED\r\n", ProtocolError, "STORED"),
    (b"ZZ 1\r\n", ProtocolError, "ZZ 1"),
    (b"VA\r\n", ProtocolError, "without a valid size"),
    (b"VA x\r\n", ProtocolError, "without a valid size"),
    (b"VA -1\r\n", ProtocolError, "without a valid size"),
    (b"VA 2\r\nabcd\r\n", ProtocolError, "followed by"),
    (b"VA 2\r\nab\nMN\r\n", ProtocolError, "followed by"),
    (b"HD\n", ProtocolError, "bare"),
    (b"\n", ProtocolError, "bare"),
    (b"HD c\r\n", ProtocolError, "c flag is not a number"),
    (b"HD cx1\r\n", ProtocolError, "c flag is not a number"),
    (b"HD c18446744073709551616\r\n", ProtocolError, "c flag out of range"),
    (b"HD f4294967296\r\n", ProtocolError, "f flag out of range"),
    (b"VA 1 f4294967296 kk\r\nv\r\n", ProtocolError, "f flag out of range"),
    (b"VA 2 f1 kk\r\nabc\r\n", ProtocolError, "followed by"),
    (b"VA 2 f1\r\nab\nMN\r\n", ProtocolError, "followed by"),
    (b"HD t-2\r\n", ProtocolError, "t flag out of range"),
    (b"HD s-1\r\n", ProtocolError, "s flag is not a number"),
    (b"HD h2\r\n", ProtocolError, "h flag"),
    (b"HD l\r\n", ProtocolError, "l flag"),
    (b"HD k\r\n", ProtocolError, "k flag without a key"),
    (b"HD k!!! b\r\n", ProtocolError, "not valid base64"),
    (b"HD W1\r\n", ProtocolError, "with an argument"),
    (b"HD  c1\r\n", ProtocolError, "empty flag"),
    (b"MN 1\r\n", ProtocolError, "MN with arguments"),
    # The shapes read in one step, wrong: the general path's errors.
    (b"VA 1 c1 t-1\r\n5\nMN\r\n", ProtocolError, "followed by"),
    (b"VA 1 c18446744073709551616 t-1\r\n5\r\n", ProtocolError, "c flag out of range"),
    (b"VA 1 c1 t18446744073709551616\r\n5\r\n", ProtocolError, "t flag out of range"),
    (b"VA 1 c1 t-2\r\n5\r\n", ProtocolError, "t flag out of range"),
    (b"VA 0 c1 f0 W1\r\n\r\n", ProtocolError, "with an argument"),
    (b"VA 0 c1 f4294967296 W\r\n\r\n", ProtocolError, "f flag out of range"),
    (b"HD " + b"x" * 9000 + b"\r\n", ProtocolError, "no line ending within"),
]


@pytest.mark.parametrize("case", BROKEN, ids=[repr(case[0][:30]) for case in BROKEN])
def test_broken_meta_reply_raises_in_every_chunking(
    case: tuple[bytes, type[ProtocolError], str],
) -> None:
    wire, error, shown = case
    for chunks in chunkings(wire) if len(wire) < 100 else [[wire]]:
        parser = ReplyParser()
        with pytest.raises(error) as caught:
            drain(parser, chunks)
        assert shown in str(caught.value), (chunks, str(caught.value))
        # The stream cannot be trusted any more: every later call fails.
        with pytest.raises(ProtocolError):
            parser.next_reply(META)
        with pytest.raises(ProtocolError):
            parser.feed(b"MN\r\n")


def test_bad_data_end_is_noticed_from_its_first_byte() -> None:
    parser = ReplyParser()
    parser.feed(b"VA 2\r\nabX")
    with pytest.raises(ProtocolError, match="followed by"):
        parser.next_reply(META)


def test_error_lines_keep_the_stream_in_step() -> None:
    parser = ReplyParser()
    parser.feed(b"CLIENT_ERROR invalid flag\r\nMN\r\nHD\r\nMN\r\n")
    replies: Any = parser.next_reply(META)
    [error] = replies
    assert isinstance(error, ClientError)
    assert error.message == "invalid flag"
    assert comparable(parser.next_reply(META)) == [MetaReply(S.HD)]


# -- properties -------------------------------------------------------------------------------

keys = st.lists(st.sampled_from(ALLOWED), min_size=1, max_size=250).map(bytes)
values = st.lists(
    st.one_of(
        st.sampled_from([b"\r\nMN\r\n", b"VA 1\r\n", b"\r\n", b"\n", b"EN"]), st.binary(max_size=40)
    ),
    max_size=6,
).map(b"".join)


@st.composite
def meta_replies(draw: st.DrawFn) -> tuple[bytes, MetaReply]:
    """A reply as memcached writes it (written here, independently of the reader)."""
    status = draw(st.sampled_from([S.VA, S.HD, S.EN, S.NS, S.EX, S.NF]))
    value = draw(values) if status is S.VA else None
    fields: dict[str, Any] = {}
    tokens: list[bytes] = []
    if draw(st.booleans()):
        fields["cas"] = draw(st.integers(0, 2**64 - 1))
        tokens.append(b"c%d" % fields["cas"])
    if draw(st.booleans()):
        fields["client_flags"] = draw(st.integers(0, 2**32 - 1))
        tokens.append(b"f%d" % fields["client_flags"])
    if draw(st.booleans()):
        fields["ttl"] = draw(st.integers(-1, 2**31 - 1))
        tokens.append(b"t%d" % fields["ttl"])
    if draw(st.booleans()):
        binary = draw(st.booleans())
        fields["key"] = draw(st.binary(min_size=1, max_size=100) if binary else keys)
        tokens.append(b"k" + (base64.b64encode(fields["key"]) if binary else fields["key"]))
        if binary:
            tokens.append(b"b")
    if draw(st.booleans()):
        fields["opaque"] = draw(st.lists(st.sampled_from(ALLOWED), max_size=32).map(bytes))
        tokens.append(b"O" + fields["opaque"])
    for name, flag in (("win", b"W"), ("stale", b"X"), ("won_elsewhere", b"Z")):
        if draw(st.booleans()):
            fields[name] = True
            tokens.append(flag)
    order = draw(st.permutations(tokens))
    head = [status.value] + ([b"%d" % len(value)] if value is not None else []) + list(order)
    wire = b" ".join(head) + b"\r\n" + (value + b"\r\n" if value is not None else b"")
    return wire, MetaReply(status, value, **fields)


@settings(deadline=None)
@given(
    batches=st.lists(st.lists(meta_replies(), max_size=6), min_size=1, max_size=4),
    points=st.lists(st.integers(min_value=0), max_size=30),
)
def test_meta_replies_round_trip_in_arbitrary_chunks(
    batches: list[list[tuple[bytes, MetaReply]]], points: list[int]
) -> None:
    wire = b"".join(b"".join(w for w, _ in batch) + b"MN\r\n" for batch in batches)
    expected = [[reply for _, reply in batch] for batch in batches]
    assert parse(cut(wire, points), [META] * len(batches)) == expected


@given(garbage=st.binary(min_size=1, max_size=60))
def test_arbitrary_bytes_give_a_reply_none_or_a_protocol_error(garbage: bytes) -> None:
    parser = ReplyParser()
    parser.feed(garbage)
    try:
        while parser.next_reply(META) is not None:
            pass
    except ProtocolError:
        pass


# -- one meta reply read in one step (the sync client's flat path) ----------------------------


def general_reading(wire: bytes, max_value_size: int, max_line_length: int) -> Any:
    """What the general parser makes of ``wire`` as one request's replies: its one reply
    when that is exactly what ``wire`` holds, else a word for what it found."""
    parser = ReplyParser(max_value_size=max_value_size, max_line_length=max_line_length)
    parser.feed(wire)
    try:
        replies = parser.next_reply(META)
    except ProtocolError:
        return "refused"
    if replies is None:
        return "incomplete"
    if parser.unread or not isinstance(replies, list) or len(replies) != 1:
        return "not one reply"
    return comparable(replies[0])


def assert_one_step_agrees(
    wire: bytes, max_value_size: int = 1024, max_line_length: int = 200
) -> Any:
    """The one-step reading of ``wire``, after checking that it is None or what the
    general parser reads."""
    fast = whole_meta_reply(wire, max_value_size, max_line_length)
    if fast is not None:
        assert general_reading(wire, max_value_size, max_line_length) == fast, wire
    return fast


#: The replies of the flat path's commands, each read in one step.
FLAT_SHAPES: list[tuple[bytes, MetaReply]] = [
    (b"VA 1 c7 t-1\r\n5\r\nMN\r\n", MetaReply(S.VA, b"5", cas=7, ttl=-1)),  # ma … v c t
    (b"VA 2 c7 t300\r\n12\r\nMN\r\n", MetaReply(S.VA, b"12", cas=7, ttl=300)),
    (b"NF\r\nMN\r\n", MetaReply(S.NF)),  # ma of a missing key
    (b"VA 3 c9 f17\r\nabc\r\nMN\r\n", MetaReply(S.VA, b"abc", cas=9, client_flags=17)),
    (b"VA 0 c3 f0 W\r\n\r\nMN\r\n", MetaReply(S.VA, b"", cas=3, client_flags=0, win=True)),
    (
        b"VA 1 c3 f2 X W\r\nv\r\nMN\r\n",
        MetaReply(S.VA, b"v", cas=3, client_flags=2, stale=True, win=True),
    ),
    (
        b"VA 0 c3 f0 Z\r\n\r\nMN\r\n",
        MetaReply(S.VA, b"", cas=3, client_flags=0, won_elsewhere=True),
    ),
    (b"EN\r\nMN\r\n", MetaReply(S.EN)),
    (b"HD c4\r\nMN\r\n", MetaReply(S.HD, cas=4)),
    (b"VA 6 c1 f0\r\n\r\nMN\r\n\r\nMN\r\n", MetaReply(S.VA, b"\r\nMN\r\n", cas=1, client_flags=0)),
    (
        b"VA 20 c18446744073709551615 f4294967295\r\n18446744073709551615\r\nMN\r\n",
        MetaReply(S.VA, b"18446744073709551615", cas=2**64 - 1, client_flags=2**32 - 1),
    ),
]


@pytest.mark.parametrize("case", FLAT_SHAPES, ids=[repr(c[0][:30]) for c in FLAT_SHAPES])
def test_the_flat_paths_replies_are_read_in_one_step(case: tuple[bytes, MetaReply]) -> None:
    wire, expected = case
    assert assert_one_step_agrees(wire) == expected


@pytest.mark.parametrize("case", VALID, ids=valid_id)
def test_one_step_reading_agrees_with_the_general_parser(case: tuple[bytes, list[Any]]) -> None:
    wire, _ = case
    for end in range(len(wire) + 1):
        assert_one_step_agrees(wire[:end])
        assert_one_step_agrees(wire[:end] + b"MN\r\n")


@pytest.mark.parametrize("case", BROKEN, ids=[repr(case[0][:30]) for case in BROKEN])
def test_one_step_reading_leaves_what_breaks_the_stream_to_the_general_parser(
    case: tuple[bytes, type[ProtocolError], str],
) -> None:
    wire, _error, _shown = case
    assert whole_meta_reply(wire + b"MN\r\n", 1024, 8192) is None
    assert whole_meta_reply(wire, 1024, 8192) is None


@pytest.mark.parametrize(
    "wire",
    [
        b"VA 1 c1 t-1\r\n5\r\nMN\r\nMN\r\n",  # two batches
        b"VA 1 c1 t-1\r\n5\r\nEN\r\nMN\r\n",  # two replies
        b"VA 1 c1 t-1\r\n5\r\nMN\r\nHD",  # the start of another
        b"VA 1 c1 t-1\r\n5\r\n",  # no MN yet
        b"VA 1 c1 t-1\r\n5X\nMN\r\n",  # the value's end is not CRLF
        b"VA 1 c1 t-1\r\n5\rXMN\r\n",
        b"VA 1 c1 t-1 c2\r\n5\r\nMN\r\n",  # read by the general parser: the last c counts
        b"HD kfoo c1\r\nMN\r\n",  # a flag the one step does not read
        b"VA 1 t-0\r\n5\r\nMN\r\n",
        b"VA 1 t-12\r\n5\r\nMN\r\n",
        b"VA 01 c1\r\n5\r\nMN\r\n",
        b"VA 000000000000000000001 c1\r\n5\r\nMN\r\n",  # 21 digits: refused
        b"VA 1 c000000000000000000001\r\n5\r\nMN\r\n",
        b"VA 1 c00000000000000000001\r\n5\r\nMN\r\n",  # 20: read
        b"VA 1 c007\r\n5\r\nMN\r\n",
    ],
)
def test_one_step_reading_of_what_is_not_one_whole_plain_reply(wire: bytes) -> None:
    assert_one_step_agrees(wire)


def test_one_step_reading_keeps_the_limits() -> None:
    wire = b"VA 5 c1 f0\r\nhello\r\nMN\r\n"
    assert whole_meta_reply(wire, 5, 100) is not None
    assert whole_meta_reply(wire, 4, 100) is None  # over max_value_size
    assert whole_meta_reply(wire, 5, len(b"VA 5 c1 f0")) is not None
    assert whole_meta_reply(wire, 5, len(b"VA 5 c1 f0") - 1) is None  # over max_line_length
    assert general_reading(wire, 4, 100) == "refused"


@settings(deadline=None)
@given(reply=meta_replies())
def test_one_step_reading_of_replies_as_memcached_writes_them(
    reply: tuple[bytes, MetaReply],
) -> None:
    wire, expected = reply
    fast = assert_one_step_agrees(wire + b"MN\r\n", 1024, 8192)
    plain = expected.key is None and expected.opaque is None
    assert fast == (expected if plain else None)


@settings(deadline=None)
@given(
    reply=meta_replies(),
    at=st.integers(min_value=0),
    byte=st.sampled_from(b" \r\n-0123456789cftWXZkVAHDEN\x00\xff"),
    how=st.sampled_from(["replace", "insert", "delete"]),
)
def test_one_step_reading_of_a_damaged_reply_agrees_with_the_general_parser(
    reply: tuple[bytes, MetaReply], at: int, byte: int, how: str
) -> None:
    wire = bytearray(reply[0] + b"MN\r\n")
    at %= len(wire)
    if how == "replace":
        wire[at] = byte
    elif how == "insert":
        wire.insert(at, byte)
    else:
        del wire[at]
    assert_one_step_agrees(bytes(wire), 1024, 8192)
