"""whole_status, the flat path's one-step read of a one-line reply, against the general
parser: whenever it reads a reply, the parser reads the same one, and nothing is left."""

from __future__ import annotations

import pytest

from django_fastcache.errors import ProtocolError
from django_fastcache.protocol import ReplyKind, ReplyParser, Status
from django_fastcache.protocol.parser import whole_status

LINES = [
    *(status.value + b"\r\n" for status in Status),
    b"0\r\n",
    b"01\r\n",
    b"42\r\n",
    b"%d\r\n" % (2**64 - 1),
    b"%d\r\n" % 2**64,
    b"1" * 20 + b"\r\n",
    b"1" * 21 + b"\r\n",
    b"-1\r\n",
    b"4 2\r\n",
    b"\r\n",
    b"",
    b"STORED",
    b"STORED\r",
    b"STORED\n",
    b"STORED\r\nSTORED\r\n",
    b"42\r\n43\r\n",
    b"42\r\nEND\r\n",
    b"ERROR\r\n",
    b"CLIENT_ERROR bad data chunk\r\n",
    b"SERVER_ERROR out of memory storing object\r\n",
    b"stored\r\n",
]
KINDS = [
    ReplyKind.STORAGE,
    ReplyKind.DELETE,
    ReplyKind.TOUCH,
    ReplyKind.ARITHMETIC,
    ReplyKind.RETRIEVAL,
    ReplyKind.OK,
]


def _general(reply: bytes, kind: ReplyKind) -> object:
    parser = ReplyParser()
    parser.feed(reply)
    try:
        found = parser.next_reply(kind)
    except ProtocolError:
        return ProtocolError
    return found if parser.unread == 0 else "more"


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
@pytest.mark.parametrize("reply", LINES)
def test_agrees_with_the_general_parser(reply: bytes, kind: ReplyKind) -> None:
    found = whole_status(reply, kind)
    if found is not None:
        general = _general(reply, kind)
        assert found == general
        assert type(found) is type(general)


@pytest.mark.parametrize(
    ("reply", "kind", "expected"),
    [
        (b"STORED\r\n", ReplyKind.STORAGE, Status.STORED),
        (b"NOT_STORED\r\n", ReplyKind.STORAGE, Status.NOT_STORED),
        (b"EXISTS\r\n", ReplyKind.STORAGE, Status.EXISTS),
        (b"NOT_FOUND\r\n", ReplyKind.STORAGE, Status.NOT_FOUND),
        (b"DELETED\r\n", ReplyKind.DELETE, Status.DELETED),
        (b"NOT_FOUND\r\n", ReplyKind.DELETE, Status.NOT_FOUND),
        (b"TOUCHED\r\n", ReplyKind.TOUCH, Status.TOUCHED),
        (b"42\r\n", ReplyKind.ARITHMETIC, 42),
        (b"%d\r\n" % (2**64 - 1), ReplyKind.ARITHMETIC, 2**64 - 1),
        (b"NOT_FOUND\r\n", ReplyKind.ARITHMETIC, Status.NOT_FOUND),
        # Left to the general parser: out of range, an error line, another kind's word.
        (b"%d\r\n" % 2**64, ReplyKind.ARITHMETIC, None),
        (b"SERVER_ERROR out of memory\r\n", ReplyKind.STORAGE, None),
        (b"DELETED\r\n", ReplyKind.STORAGE, None),
        (b"STORED\r\nSTORED\r\n", ReplyKind.STORAGE, None),
        (b"STORED\r\n", ReplyKind.OK, None),
    ],
)
def test_reads(reply: bytes, kind: ReplyKind, expected: object) -> None:
    assert whole_status(reply, kind) == expected
