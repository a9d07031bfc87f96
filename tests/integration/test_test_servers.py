"""The test servers' helpers: a flush that fails says why."""

from __future__ import annotations

import socket
import threading

import pytest

from django_fastcache.testing.servers import MemcachedServer

pytestmark = pytest.mark.integration


def test_a_flush_of_a_stopped_memcached_names_the_refusal() -> None:
    if not MemcachedServer.available():
        pytest.skip("memcached is not installed (apt-get install memcached)")
    server = MemcachedServer().start()
    server.flush()
    server.stop()
    with pytest.raises(RuntimeError, match=r"flush_all failed on .*ConnectionRefusedError"):
        server.flush()


def test_a_flush_answered_otherwise_names_the_reply() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def answer() -> None:
            peer, _ = listener.accept()
            with peer:
                peer.recv(256)
                peer.sendall(b"SERVER_ERROR out of memory\r\n")

        thread = threading.Thread(target=answer)
        thread.start()
        server = MemcachedServer()
        server.port = listener.getsockname()[1]
        try:
            with pytest.raises(RuntimeError, match=r"the reply was b'SERVER_ERROR out of memory"):
                server.flush()
        finally:
            thread.join(5)
