"""The sans-IO side of TLS and authentication: option forms, the request, the verdicts."""

from __future__ import annotations

import ssl

import pytest

from django_fastcache.backends.options import parse_options
from django_fastcache.client.address import parse_address
from django_fastcache.client.security import (
    Security,
    TLSOptions,
    auth_request,
    check_auth_reply,
    check_credentials,
    make_security,
    normalize_tls,
    tls_error,
)
from django_fastcache.errors import (
    AuthenticationError,
    ClientError,
    ConfigurationError,
    ConnectFailedError,
    TLSError,
)
from django_fastcache.protocol import Status


def test_the_auth_request_is_a_set_of_user_and_password_that_expires_at_once() -> None:
    assert auth_request("alice", "pw:1") == b"set fastcache:auth 0 -1 10\r\nalice pw:1\r\n"
    # Lengths are in bytes.
    assert auth_request("é", "ü") == b"set fastcache:auth 0 -1 5\r\n\xc3\xa9 \xc3\xbc\r\n"


@pytest.mark.parametrize(
    ("username", "password", "complaint"),
    [
        ("alice", None, "go together"),
        (None, "pw", "go together"),
        ("", "pw", "username"),
        ("al ice", "pw", "username"),
        ("al:ice", "pw", "username"),
        ("alice\r\n", "pw", "username"),
        ("alice", "", "password"),
        ("alice", "p w", "password"),
        ("alice", "pw\n", "password"),
        ("alice", 7, "password"),
        ("alice", "x" * 300, "too long"),
    ],
)
def test_credentials_memcached_cannot_carry_are_refused(
    username: object, password: object, complaint: str
) -> None:
    with pytest.raises(ConfigurationError, match=complaint) as caught:
        check_credentials(username, password)
    if isinstance(password, str) and len(password) > 1:
        assert password.strip() not in str(caught.value)


def test_no_security_at_all_is_none() -> None:
    assert make_security() is None
    assert make_security(False) is None


def test_the_security_of_credentials_alone_hides_the_password() -> None:
    security = make_security(None, "alice", "hunter22")
    assert security is not None
    assert security.context is None
    assert security.username == "alice"
    assert "hunter22" not in repr(security)
    tcp, unix = parse_address("10.0.0.5:11211"), parse_address("unix:/run/m.sock")
    assert not security.uses_tls(tcp)
    assert not security.uses_tls(unix)


def test_tls_applies_to_tcp_nodes_and_checks_their_host_by_default() -> None:
    security = make_security(True)
    assert security is not None
    assert security.context is not None
    assert security.context.check_hostname
    assert security.context.verify_mode == ssl.CERT_REQUIRED
    tcp, unix = parse_address("Cache1:11211"), parse_address("unix:/run/m.sock")
    assert security.uses_tls(tcp)
    assert not security.uses_tls(unix)  # memcached has no TLS on unix sockets
    assert security.hostname_for(tcp) == "cache1"


def test_the_simple_form() -> None:
    security = make_security({"server_hostname": "memcached.internal", "check_hostname": False})
    assert security is not None
    assert security.context is not None
    assert not security.context.check_hostname
    assert security.hostname_for(parse_address("10.0.0.5")) == "memcached.internal"


def test_a_context_is_used_as_given() -> None:
    context = ssl.create_default_context()
    security = make_security(context)
    assert security is not None
    assert security.context is context


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("yes", "ssl must be"),
        ({"cafile": "/x"}, "unknown ssl key"),
        ({"ca_file": ""}, "ca_file must be"),
        ({"ca_file": 3}, "ca_file must be"),
        ({"check_hostname": "no"}, "check_hostname"),
        ({"key_file": "/k.pem"}, "needs cert_file"),
    ],
)
def test_bad_ssl_options_are_refused(value: object, complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        normalize_tls(value)


def test_normalized_forms_are_hashable() -> None:
    assert normalize_tls(None) is None
    assert normalize_tls(True) == TLSOptions()
    form = normalize_tls({"ca_file": "/etc/ca.pem", "server_hostname": "m"})
    assert form == TLSOptions(ca_file="/etc/ca.pem", server_hostname="m")
    assert hash(form) == hash(TLSOptions(ca_file="/etc/ca.pem", server_hostname="m"))


def test_the_auth_verdict() -> None:
    check_auth_reply(Status.STORED, "10.0.0.5:11211", "alice")
    with pytest.raises(AuthenticationError, match="authentication failure") as caught:
        check_auth_reply(ClientError("authentication failure"), "10.0.0.5:11211", "alice")
    assert isinstance(caught.value, ConnectFailedError)
    assert "10.0.0.5:11211" in str(caught.value)


def test_tls_errors_name_the_fix() -> None:
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_code = 62
    mismatch.verify_message = "Hostname mismatch"
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_code = 20
    untrusted.verify_message = "unable to get local issuer certificate"
    assert "server_hostname" in str(tls_error("n:1", "n", mismatch))
    assert "ca_file" in str(tls_error("n:1", "n", untrusted))
    assert "-Z" in str(tls_error("n:1", "n", ssl.SSLError(1, "wrong version number")))
    assert isinstance(tls_error("n:1", "n", untrusted), TLSError)


def test_backend_options() -> None:
    options, problems = parse_options(
        {"ssl": {"ca_file": "/etc/ca.pem"}, "username": "alice", "password": "hunter22"}
    )
    assert problems == []
    assert options.ssl == TLSOptions(ca_file="/etc/ca.pem")
    assert (options.username, options.password) == ("alice", "hunter22")
    assert "hunter22" not in repr(options)
    hash(options)  # the process-wide client is looked up by the options


def test_backend_option_problems() -> None:
    _options, problems = parse_options({"ssl": {"cafile": "/x"}, "password": "hunter22"})
    assert [problem.id for problem in problems] == [
        "django_fastcache.E041",
        "django_fastcache.E042",
    ]
    assert all("hunter22" not in problem.message for problem in problems)


def test_security_is_frozen() -> None:
    security = Security(username="alice", password="pw")
    with pytest.raises(AttributeError):
        security.password = "other"  # type: ignore[misc]
