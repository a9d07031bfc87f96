"""A quiet multi-get answered for a key that was not asked (or twice, or without its key)
is another request's answer: the call raises ProtocolError and the connection is
discarded, on both clients, so nothing later reads from the broken stream."""

from __future__ import annotations

from typing import Any

import pytest

from django_fastcache.client.commands import CommandSet
from django_fastcache.errors import ProtocolError
from django_fastcache.protocol import ReplyParser, meta_get_many_command
from django_fastcache.protocol.parser import ReplyKind
from django_fastcache.testing.fake_server import Action, FakeMemcached

from .client_runner import Runner, runner_fixture

run = runner_fixture(timeout=2.0)

WRONG_REPLIES = [
    pytest.param(b"VA 1 f0 kother\r\nx\r\nMN\r\n", id="a key not asked"),
    pytest.param(b"VA 1 f0 ka\r\nx\r\nVA 1 f0 ka\r\ny\r\nMN\r\n", id="a key twice"),
    pytest.param(b"VA 1 f0\r\nx\r\nMN\r\n", id="no key"),
]


@pytest.mark.parametrize("reply", WRONG_REPLIES)
def test_the_connection_is_discarded(run: Runner, reply: bytes) -> None:
    # The fake takes "mg a ... q", "mg b ... q" and "mn" as three requests: the first is
    # answered with the wrong reply (MN included), the others not at all.
    with FakeMemcached(values={b"a": b"1"}, garbage=reply, default=Action.IGNORE) as fake:
        fake.script(Action.GARBAGE)

        async def scenario(client: CommandSet) -> Any:
            with pytest.raises(ProtocolError, match="quiet mg"):
                await client.meta_get_many([b"a", b"b"])
            # Closed by the client before the call returned, not at the end of the run.
            assert fake.wait_for(lambda: fake.closed_by_client == [1])

        run([fake.location], scenario)
        assert fake.accepted == 1


@pytest.mark.parametrize("reply", WRONG_REPLIES)
def test_the_parser_refuses_it_and_stays_broken(reply: bytes) -> None:
    parser = ReplyParser()
    parser.feed(reply)
    with pytest.raises(ProtocolError, match="quiet mg"):
        parser.next_reply(ReplyKind.META, [b"a", b"b"])
    with pytest.raises(ProtocolError):
        parser.next_reply(ReplyKind.META)


def test_the_right_keys_in_any_order_pass() -> None:
    assert meta_get_many_command([b"a", b"b"]).endswith(b"mn\r\n")
    parser = ReplyParser()
    parser.feed(b"VA 1 f0 kb\r\ny\r\nVA 1 f0 ka\r\nx\r\nMN\r\nMN\r\n")
    replies = parser.next_reply(ReplyKind.META, [b"a", b"b"])
    assert [reply.key for reply in replies] == [b"b", b"a"]
    # The next META reply without keys is not checked against the last one's.
    assert parser.next_reply(ReplyKind.META) == []
