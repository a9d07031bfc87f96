"""TLS and ASCII authentication against real memcached processes.

The servers are started here with ``-Z`` (certificates made by the test with the openssl
tool) and ``-Y`` (an auth file written by the test). Both clients (asyncio on the stock loop
and uvloop, and the blocking one) and the Django backend are driven through them. Refusals
must be typed errors raised at once: every client here has generous timeouts, so a refusal
that surfaced as a timeout would show up as ``OperationTimeoutError`` (and a slow test).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import socket
import ssl
import struct
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from django.core.cache.backends.base import BaseCache

from django_fastcache.backends import FastCache
from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.errors import (
    AuthenticationError,
    ClientError,
    ConfigurationError,
    ConnectFailedError,
    ConnectTimeoutError,
    NetworkError,
    OperationTimeoutError,
    TLSError,
)
from django_fastcache.testing.certificates import (
    Certificates,
    make_certificates,
    openssl_available,
)
from django_fastcache.testing.fake_server import Action, FakeMemcached
from django_fastcache.testing.loopback import ThreadPerConnectionServer
from django_fastcache.testing.servers import MemcachedServer, ServerTLS

pytestmark = pytest.mark.skipif(
    not openssl_available(),
    reason="the openssl tool, which makes the test certificates, is missing",
)

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
# Long enough that a refusal which waited for a timeout could not pass for an answer.
PATIENT = {"timeout": 10.0, "connect_timeout": 10.0}
# The certificate names "memcached.test" and "localhost", not 127.0.0.1.
NAME = "memcached.test"
USER, PASSWORD = "alice", "through-the-looking-glass"


# -- servers --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"), server_names=(NAME, "localhost"))


def _running(server: MemcachedServer) -> Iterator[MemcachedServer]:
    if not MemcachedServer.available():
        pytest.skip("memcached is not installed (apt-get install memcached)")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _tls_needed() -> None:
    if MemcachedServer.available() and not MemcachedServer.supports_tls():
        pytest.skip(
            "this memcached was built without TLS (no -Z): build memcached 1.6 with "
            "./configure --enable-tls (Debian's and Ubuntu's packages have it)"
        )


@pytest.fixture(scope="module")
def tls_server(certificates: Certificates) -> Iterator[MemcachedServer]:
    _tls_needed()
    tls = ServerTLS(certificates.server_cert, certificates.server_key)
    yield from _running(MemcachedServer(tls=tls))


@pytest.fixture(scope="module")
def mutual_tls_server(certificates: Certificates) -> Iterator[MemcachedServer]:
    """Requires a client certificate signed by the test CA."""
    _tls_needed()
    tls = ServerTLS(
        certificates.server_cert,
        certificates.server_key,
        client_ca_file=certificates.ca_file,
        client_cert=certificates.client_cert,
        client_key=certificates.client_key,
    )
    yield from _running(MemcachedServer(tls=tls))


@pytest.fixture(scope="module")
def auth_server() -> Iterator[MemcachedServer]:
    yield from _running(MemcachedServer(users={USER: PASSWORD, "bob": "builder"}))


@pytest.fixture(scope="module")
def auth_unix_server() -> Iterator[MemcachedServer]:
    with tempfile.TemporaryDirectory(prefix="fastcache-auth-sock-") as directory:
        server = MemcachedServer(os.path.join(directory, "m.sock"), users={USER: PASSWORD})
        yield from _running(server)


@pytest.fixture(scope="module")
def tls_auth_server(certificates: Certificates) -> Iterator[MemcachedServer]:
    _tls_needed()
    tls = ServerTLS(certificates.server_cert, certificates.server_key)
    yield from _running(MemcachedServer(tls=tls, users={USER: PASSWORD}))


def trusted(certificates: Certificates, **extra: Any) -> dict[str, Any]:
    """The simple form of the ssl option that trusts the test CA and checks NAME."""
    return {"ca_file": certificates.ca_file, "server_hostname": NAME, **extra}


# -- drivers --------------------------------------------------------------------------------------
@pytest.fixture(params=LOOPS)
def run_async(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        if request.param == "uvloop":
            import uvloop

            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(coroutine)
        finally:
            loop.close()

    return run


async def round_trip(client: Client) -> tuple[Any, ...]:
    try:
        stored = await client.set(b"greeting", b"hello")
        item = await client.get(b"greeting")
        many = await client.get_many([b"greeting", b"absent"])
        return stored, item.value if item else None, sorted(many)
    finally:
        await client.aclose()


def blocking_round_trip(client: BlockingClient) -> tuple[Any, ...]:
    try:
        stored = run_blocking(client.set(b"greeting", b"hello"))
        item = run_blocking(client.get(b"greeting"))
        many = run_blocking(client.get_many([b"greeting", b"absent"]))
        return stored, item.value if item else None, sorted(many)
    finally:
        client.close_thread_connections()


EXPECTED = (True, b"hello", [b"greeting"])


def blocking(servers: list[str], **options: Any) -> BlockingClient:
    return BlockingClient(Client(servers, **{**PATIENT, **options}).cluster)


def refusal_of_async(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any], servers: list[str], **options: Any
) -> tuple[BaseException, float]:
    client = Client(servers, **{**PATIENT, **options})
    began = time.monotonic()
    with pytest.raises(NetworkError) as caught:
        run_async(round_trip(client))
    return caught.value, time.monotonic() - began


def refusal_of_blocking(servers: list[str], **options: Any) -> tuple[BaseException, float]:
    client = blocking(servers, **options)
    began = time.monotonic()
    with pytest.raises(NetworkError) as caught:
        blocking_round_trip(client)
    return caught.value, time.monotonic() - began


def assert_certificate_asked_for(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    servers: list[str],
    certificates: Certificates,
) -> None:
    """Both clients, without a client certificate, get a TLSError naming cert_file, as
    soon as the server hangs up."""
    for error, took in (
        refusal_of_async(run_async, servers, ssl=trusted(certificates)),
        refusal_of_blocking(servers, ssl=trusted(certificates)),
    ):
        assert type(error) is TLSError, repr(error)
        assert took < PATIENT["timeout"]
        assert "cert_file" in str(error)


def assert_refused_at_once(
    refusal: tuple[BaseException, float], kind: type[NetworkError], *words: str
) -> None:
    error, took = refusal
    assert type(error) is kind, repr(error)
    assert not isinstance(error, OperationTimeoutError)
    assert took < PATIENT["connect_timeout"]
    for word in words:
        assert word in str(error)


# -- TLS ------------------------------------------------------------------------------------------
def test_tls_round_trip_async(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    tls_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    client = Client([tls_server.location], ssl=trusted(certificates), **PATIENT)
    assert run_async(round_trip(client)) == EXPECTED


def test_tls_round_trip_blocking(tls_server: MemcachedServer, certificates: Certificates) -> None:
    client = blocking([tls_server.location], ssl=trusted(certificates))
    assert blocking_round_trip(client) == EXPECTED


def test_an_ssl_context_and_the_nodes_own_name(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    tls_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    # With a context, the certificate is checked against the host of the address.
    context = ssl.create_default_context(cafile=certificates.ca_file)
    location = f"localhost:{tls_server.port}"
    assert run_async(round_trip(Client([location], ssl=context, **PATIENT))) == EXPECTED
    assert blocking_round_trip(blocking([location], ssl=context)) == EXPECTED


def test_a_plain_client_cannot_talk_to_the_tls_server(tls_server: MemcachedServer) -> None:
    # What the round trips above went through really was TLS.
    with pytest.raises(NetworkError):
        blocking_round_trip(blocking([tls_server.location], timeout=2.0))


def test_a_wrong_ca_is_a_tls_error_at_once(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    tls_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    wrong_ca = {"ca_file": certificates.other_ca_file, "server_hostname": NAME}
    servers = [tls_server.location]
    for refusal in (
        refusal_of_async(run_async, servers, ssl=wrong_ca),
        refusal_of_blocking(servers, ssl=wrong_ca),
    ):
        assert_refused_at_once(refusal, TLSError, "not trusted", "ca_file")


def test_a_wrong_hostname_is_a_tls_error_at_once(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    tls_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    # Reached as 127.0.0.1, which the certificate does not name.
    by_address = {"ca_file": certificates.ca_file}
    other_name = trusted(certificates, server_hostname="cache.example.com")
    servers = [tls_server.location]
    for ssl_option, name in ((by_address, "'127.0.0.1'"), (other_name, "cache.example.com")):
        for refusal in (
            refusal_of_async(run_async, servers, ssl=ssl_option),
            refusal_of_blocking(servers, ssl=ssl_option),
        ):
            assert_refused_at_once(refusal, TLSError, "not valid for", name, "server_hostname")


def test_hostname_checks_can_be_turned_off(
    tls_server: MemcachedServer, certificates: Certificates
) -> None:
    ssl_option = {"ca_file": certificates.ca_file, "check_hostname": False}
    assert blocking_round_trip(blocking([tls_server.location], ssl=ssl_option)) == EXPECTED
    # The certificate itself is still verified.
    wrong_ca = {"ca_file": certificates.other_ca_file, "check_hostname": False}
    assert_refused_at_once(
        refusal_of_blocking([tls_server.location], ssl=wrong_ca), TLSError, "not trusted"
    )


def test_tls_to_a_server_without_tls_is_a_tls_error_at_once(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    memcached: MemcachedServer,
    certificates: Certificates,
) -> None:
    servers = [memcached.location]
    for refusal in (
        refusal_of_async(run_async, servers, ssl=trusted(certificates)),
        refusal_of_blocking(servers, ssl=trusted(certificates)),
    ):
        assert_refused_at_once(refusal, TLSError, "-Z")


def test_a_client_certificate(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    mutual_tls_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    ssl_option = trusted(
        certificates, cert_file=certificates.client_cert, key_file=certificates.client_key
    )
    servers = [mutual_tls_server.location]
    assert run_async(round_trip(Client(servers, ssl=ssl_option, **PATIENT))) == EXPECTED
    assert blocking_round_trip(blocking(servers, ssl=ssl_option)) == EXPECTED


def test_without_the_client_certificate_the_server_hangs_up(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    mutual_tls_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    # Under TLS 1.3 the server judges the client's certificate after the client's side of
    # the handshake is done: the refusal comes with the first reply, still a TLS error.
    servers = [mutual_tls_server.location]
    assert_certificate_asked_for(run_async, servers, certificates)


class HangingUpTLSServer(ThreadPerConnectionServer):
    """Finishes the TLS handshake, reads the first request, then ends the connection
    without an alert, by a reset (``reset``) or a close: what a client of a TLS 1.3 server
    that refused its certificate sees when the end overtakes the alert."""

    thread_name = "hanging-up-tls-server"

    def __init__(self, certificates: Certificates, *, reset: bool) -> None:
        super().__init__()
        self.reset = reset
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(certificates.server_cert, certificates.server_key)

    def _serve(self, plain: socket.socket) -> None:
        try:
            sock = self.tls.wrap_socket(plain, server_side=True)
            self._adopt(plain, sock)
            if sock.recv(4096) and self.reset:  # the first request, whole or in part
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        except OSError:
            plain.close()


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
def test_a_tls_connection_ended_before_its_first_reply_names_the_certificate(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    certificates: Certificates,
    reset: bool,
) -> None:
    # The end may overtake the refusal's alert (seen with Python 3.13 against memcached -Z
    # with ssl_verify_mode; Python 3.11's TLS layer reads a reset as an end of stream):
    # both clients name the likely fix all the same.
    with HangingUpTLSServer(certificates, reset=reset) as server:
        servers = [server.location]
        assert_certificate_asked_for(run_async, servers, certificates)


def test_missing_certificate_files_are_a_configuration_error(
    certificates: Certificates,
) -> None:
    missing = os.path.join(certificates.directory, "missing.pem")
    with pytest.raises(ConfigurationError, match="cannot load the certificate files"):
        Client(["127.0.0.1:11211"], ssl={"ca_file": missing})


# -- authentication -------------------------------------------------------------------------------
def test_authenticated_round_trip_async(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any], auth_server: MemcachedServer
) -> None:
    client = Client([auth_server.location], username=USER, password=PASSWORD, **PATIENT)
    assert run_async(round_trip(client)) == EXPECTED


def test_authenticated_round_trip_blocking(auth_server: MemcachedServer) -> None:
    client = blocking([auth_server.location], username=USER, password=PASSWORD)
    assert blocking_round_trip(client) == EXPECTED


def test_authentication_over_a_unix_socket(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any], auth_unix_server: MemcachedServer
) -> None:
    servers = [auth_unix_server.location]
    credentials = {"username": USER, "password": PASSWORD}
    assert run_async(round_trip(Client(servers, **credentials, **PATIENT))) == EXPECTED
    assert blocking_round_trip(blocking(servers, **credentials)) == EXPECTED


def test_a_wrong_password_is_an_authentication_error_at_once(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any], auth_server: MemcachedServer
) -> None:
    servers = [auth_server.location]
    for refusal in (
        refusal_of_async(run_async, servers, username=USER, password="wrong"),
        refusal_of_blocking(servers, username=USER, password="wrong"),
        refusal_of_blocking(servers, username="carol", password=PASSWORD),
    ):
        assert_refused_at_once(refusal, AuthenticationError, "refused the credentials", "-Y")
        assert isinstance(refusal[0], ConnectFailedError)


def test_no_credentials_for_a_server_that_wants_them(auth_server: MemcachedServer) -> None:
    # memcached's own answer: the request reached it, it refused to serve it.
    client = blocking([auth_server.location])
    try:
        with pytest.raises(ClientError, match="unauthenticated"):
            run_blocking(client.get(b"greeting"))
    finally:
        client.close_thread_connections()


def test_authentication_happens_once_per_connection(auth_server: MemcachedServer) -> None:
    def auth_counts() -> tuple[int, int]:
        admin = blocking([auth_server.location], username="bob", password="builder")
        try:
            stats = run_blocking(admin.stats())[auth_server.location]
        finally:
            admin.close_thread_connections()
        return int(stats["auth_cmds"]), int(stats["auth_errors"])

    before = auth_counts()
    client = blocking([auth_server.location], username=USER, password=PASSWORD)
    try:
        for number in range(20):
            run_blocking(client.set(b"n", b"%d" % number))
            run_blocking(client.get(b"n"))
    finally:
        client.close_thread_connections()
    after = auth_counts()
    # One for the client's connection, one for the second auth_counts' own.
    assert (after[0] - before[0], after[1] - before[1]) == (2, 0)


def test_credentials_are_never_shown(
    auth_server: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = Client([auth_server.location], username=USER, password=PASSWORD, **PATIENT)
    assert PASSWORD not in repr(client.cluster.settings)
    assert USER in repr(client.cluster.settings)
    error, _took = refusal_of_blocking([auth_server.location], username=USER, password="s3cr3t")
    assert "s3cr3t" not in str(error)
    assert "s3cr3t" not in caplog.text
    assert PASSWORD not in caplog.text


# -- both -----------------------------------------------------------------------------------------
def test_tls_and_authentication_together(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    tls_auth_server: MemcachedServer,
    certificates: Certificates,
) -> None:
    options = {"ssl": trusted(certificates), "username": USER, "password": PASSWORD}
    servers = [tls_auth_server.location]
    assert run_async(round_trip(Client(servers, **options, **PATIENT))) == EXPECTED
    assert blocking_round_trip(blocking(servers, **options)) == EXPECTED
    wrong = {**options, "password": "wrong"}
    assert_refused_at_once(
        refusal_of_async(run_async, servers, **wrong), AuthenticationError, "refused"
    )
    assert_refused_at_once(refusal_of_blocking(servers, **wrong), AuthenticationError, "refused")


# -- the Django backend ---------------------------------------------------------------------------
def backend(location: str, **options: Any) -> BaseCache:
    return FastCache(location, {"OPTIONS": {"disk_tier": False, **PATIENT_OPTIONS, **options}})


PATIENT_OPTIONS = {"operation_timeout": 10.0, "connect_timeout": 10.0}


def test_the_backend_over_tls_with_authentication(
    tls_auth_server: MemcachedServer, certificates: Certificates
) -> None:
    cache = backend(
        tls_auth_server.location, ssl=trusted(certificates), username=USER, password=PASSWORD
    )
    cache.set("page", {"title": "hello"})
    assert cache.get("page") == {"title": "hello"}
    assert asyncio.run(cache.aget("page")) == {"title": "hello"}


def test_the_backend_raises_the_refusal(
    tls_auth_server: MemcachedServer, certificates: Certificates
) -> None:
    wrong_password = backend(
        tls_auth_server.location, ssl=trusted(certificates), username=USER, password="nope"
    )
    with pytest.raises(AuthenticationError):
        wrong_password.get("page")
    wrong_ca = backend(
        tls_auth_server.location,
        ssl={"ca_file": certificates.other_ca_file, "server_hostname": NAME},
        username=USER,
        password=PASSWORD,
    )
    with pytest.raises(TLSError):
        wrong_ca.get("page")


# -- the blocking client's TLS connections between and during requests ----------------------------
@pytest.fixture
def two_tls_servers(certificates: Certificates) -> Iterator[list[MemcachedServer]]:
    _tls_needed()
    tls = ServerTLS(certificates.server_cert, certificates.server_key)
    servers = [MemcachedServer(tls=tls).start(), MemcachedServer(tls=tls).start()]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def test_a_silent_tls_node_times_out_and_the_other_still_answers(
    two_tls_servers: list[MemcachedServer], certificates: Certificates
) -> None:
    # A TLS read must stop at the call's deadline (the TLS layer would retry a read cut
    # short by the kernel's timeout for ever), and the other node's reply, already there,
    # is still taken after that deadline.
    silent, alive = two_tls_servers
    client = blocking([silent.location, alive.location], ssl=trusted(certificates), timeout=0.5)
    route = client.cluster.node_index
    keys = [b"k%d" % number for number in range(40)]
    silent_keys = [key for key in keys if route(key) == 0]
    alive_keys = [key for key in keys if route(key) == 1]
    assert silent_keys
    assert alive_keys
    try:
        assert run_blocking(client.set_many([(k, b"v", 0) for k in keys])) == []
        silent.pause()
        try:
            # The silent node's key first: its connection is read first, and uses up the
            # deadline; the other node's reply is then read late.
            items = [(key, b"w", 0) for key in [silent_keys[0], *alive_keys, *silent_keys[1:]]]
            began = time.monotonic()
            failed = run_blocking(client.set_many(items))
            took = time.monotonic() - began
        finally:
            silent.resume()
        assert sorted(failed) == sorted(silent_keys)
        assert took < 5.0
        assert {k: i.value for k, i in run_blocking(client.get_many(alive_keys)).items()} == {
            key: b"w" for key in alive_keys
        }
        silent.pause()
        try:
            with pytest.raises(OperationTimeoutError):
                run_blocking(client.get(silent_keys[0]))
        finally:
            silent.resume()
    finally:
        client.close_thread_connections()


def test_a_tls_node_that_restarted_is_reconnected_to(
    two_tls_servers: list[MemcachedServer], certificates: Certificates
) -> None:
    # Between requests the server's goodbye is a TLS record on the socket: seen by the
    # check before the next request, which then goes out on a new connection.
    server = two_tls_servers[0]
    client = blocking([server.location], ssl=trusted(certificates))
    try:
        assert run_blocking(client.set(b"a", b"1"))
        server.restart()
        assert run_blocking(client.get(b"a")) is None
        assert run_blocking(client.set(b"a", b"2"))
        item = run_blocking(client.get(b"a"))
        assert item is not None
        assert item.value == b"2"
    finally:
        client.close_thread_connections()


def test_with_the_disk_tier_a_refused_node_is_marked_out_and_logged(
    auth_server: MemcachedServer, disk_directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = {
        **PATIENT_OPTIONS,
        "disk_directory": disk_directory,
        "username": USER,
        "password": "not-the-password",
    }
    cache = FastCache(auth_server.location, {"OPTIONS": options})
    with caplog.at_level(logging.WARNING, logger="django_fastcache"):
        cache.set("page", "kept on disk")
        assert cache.get("page") == "kept on disk"
    assert "refused the credentials" in caplog.text
    assert "not-the-password" not in caplog.text


def test_a_handshake_nobody_answers_is_bounded_by_connect_timeout(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
    two_tls_servers: list[MemcachedServer],
    certificates: Certificates,
) -> None:
    # A stopped memcached still accepts TCP connections (the kernel does), but never
    # answers the TLS handshake: silence is a timeout, within connect_timeout.
    server = two_tls_servers[0]
    options = {"ssl": trusted(certificates), "timeout": 5.0, "connect_timeout": 0.3}
    server.pause()
    try:
        began = time.monotonic()
        # A ConnectTimeoutError (an OperationTimeoutError too): the request was not sent.
        with pytest.raises(ConnectTimeoutError):
            blocking_round_trip(BlockingClient(Client([server.location], **options).cluster))
        with pytest.raises(ConnectTimeoutError):
            run_async(round_trip(Client([server.location], **options)))
        took = time.monotonic() - began
    finally:
        server.resume()
    assert took < 4.0


def test_a_connection_closed_during_authentication_is_a_connect_failure(
    run_async: Callable[[Coroutine[Any, Any, Any]], Any],
) -> None:
    # The server closes the connection when the credentials arrive: nothing of the caller's
    # was sent, so a ConnectFailedError (with the disk tier, such a call is made on disk),
    # not a ConnectionLostError (which says a request may have run).
    credentials = {"username": USER, "password": PASSWORD}
    with FakeMemcached(default=Action.CLOSE) as closing:
        with pytest.raises(ConnectFailedError):
            blocking_round_trip(blocking([closing.location], **credentials))
        with pytest.raises(ConnectFailedError):
            run_async(round_trip(Client([closing.location], **PATIENT, **credentials)))
        assert closing.requests  # the credentials did reach it


def test_a_forked_child_leaves_the_parents_tls_session_alone(
    tls_server: MemcachedServer, certificates: Certificates
) -> None:
    # The child closes its copy of the parent's TLS socket without a TLS goodbye (which
    # would end the parent's session too) and opens a session of its own.
    client = blocking([tls_server.location], ssl=trusted(certificates))

    def total_connections() -> int:
        admin = blocking([tls_server.location], ssl=trusted(certificates))
        try:
            stats = run_blocking(admin.stats())[tls_server.location]
        finally:
            admin.close_thread_connections()
        return int(stats["total_connections"])

    try:
        assert run_blocking(client.set(b"fork", b"parent"))
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                item = run_blocking(client.get(b"fork"))
                stored = run_blocking(client.set(b"fork:child", b"child"))
                code = 0 if item is not None and item.value == b"parent" and stored else 2
            finally:
                os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        before = total_connections()
        item = run_blocking(client.get(b"fork:child"))
        assert item is not None
        assert item.value == b"child"
        # Only the second count's own connection is new: the parent kept its session.
        assert total_connections() - before == 1
    finally:
        client.close_thread_connections()
