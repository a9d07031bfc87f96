"""The sync client's one-step read of a one-key get reply (``whole_one_value``) never
accepts what the general parser would refuse, and never reads anything differently."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_fastcache.errors import ProtocolError
from django_fastcache.protocol import ReplyParser
from django_fastcache.protocol.parser import MISS, whole_one_value

KEY = b"site:1:page"


def general(reply: bytes, key: bytes = KEY) -> object:
    """What the incremental parser makes of ``reply``, whole: its answer, "partial" or
    "error"; "unread" when bytes are left over after the reply."""
    parser = ReplyParser(max_value_size=1000)
    parser.feed(reply)
    try:
        found = parser.next_value(key)
    except ProtocolError:
        return "error"
    if found is None:
        return "partial"
    if parser.unread:
        return "unread"
    return found


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"END\r\n", MISS),
        (b"VALUE site:1:page 0 3\r\nabc\r\nEND\r\n", (b"abc", 0)),
        (b"VALUE site:1:page 4294967295 0\r\n\r\nEND\r\n", (b"", 4294967295)),
        (b"VALUE site:1:page 65 10\r\n0123\r\n6789\r\nEND\r\n", (b"0123\r\n6789", 65)),
    ],
)
def test_whole_replies_are_read(reply: bytes, expected: object) -> None:
    assert whole_one_value(reply, KEY, 1000) == expected
    assert general(reply) == expected


@pytest.mark.parametrize(
    "reply",
    [
        b"END\r\nEND\r\n",  # two replies
        b"VALUE site:1:other 0 3\r\nabc\r\nEND\r\n",  # another key
        b"VALUE site:1:pag 0 3\r\nabc\r\nEND\r\n",  # a key's prefix
        b"VALUE site:1:page 0 3 7\r\nabc\r\nEND\r\n",  # a cas unique: not a get's reply
        b"VALUE site:1:page 4294967296 3\r\nabc\r\nEND\r\n",  # flags past 32 bits
        b"VALUE site:1:page 0 1001\r\n" + b"x" * 1001 + b"\r\nEND\r\n",  # past max_value_size
        b"VALUE site:1:page 0 4\r\nabc\r\nEND\r\n",  # shorter than declared
        b"VALUE site:1:page +0 3\r\nabc\r\nEND\r\n",
        b"VALUE site:1:page  0 3\r\nabc\r\nEND\r\n",
        b"VALUE site:1:page 0 3\r\nabcXXEND\r\n",
        b"VALUE site:1:page 0 3\r\nabc\r\nEND\r\r",
        b"SERVER_ERROR out of memory\r\n",
        b"ENDED",
    ],
)
def test_anything_else_is_left_to_the_general_parser(reply: bytes) -> None:
    assert whole_one_value(reply, KEY, 1000) is None


@pytest.mark.parametrize("cut", range(1, 40))
def test_a_reply_cut_short_is_not_read(cut: int) -> None:
    reply = b"VALUE site:1:page 12 3\r\nabc\r\nEND\r\n"
    if cut < len(reply):
        assert whole_one_value(reply[:cut], KEY, 1000) is None


_replies = st.one_of(
    st.binary(max_size=60),
    st.builds(
        lambda key, flags, declared, data, tail: (
            b"VALUE %s %s %s\r\n%s%s" % (key, flags, declared, data, tail)
        ),
        st.sampled_from([KEY, b"site:1:pag", b"other"]),
        st.sampled_from([b"0", b"7", b"4294967295", b"4294967296", b"01", b"", b"x"]),
        st.sampled_from([b"0", b"3", b"4", b"1001", b"", b"3 5"]),
        st.sampled_from([b"", b"abc", b"abcd", b"ab\r\n"]),
        st.sampled_from([b"\r\nEND\r\n", b"\r\nEND\r\nEND\r\n", b"\r\nEN", b"END\r\n", b""]),
    ),
)


@given(_replies)
def test_it_agrees_with_the_general_parser(reply: bytes) -> None:
    fast = whole_one_value(reply, KEY, 1000)
    if fast is not None:
        assert general(reply) == fast
