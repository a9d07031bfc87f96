"""Throwaway certificates for TLS tests: a CA, a server certificate signed by it, a client
certificate signed by it, and a second CA that signed nothing here (a "wrong CA").

Made with the ``openssl`` command-line tool (P-256 keys, valid for two days), with the
extensions strict verifiers ask for (CA key usage, key identifiers, subject names), so the
same files pass every Python's default TLS checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certificates", "CertificatesUnavailable", "make_certificates", "openssl_available"]

_DAYS = "2"
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


class CertificatesUnavailable(RuntimeError):
    """The ``openssl`` tool is not installed."""


@dataclass(frozen=True)
class Certificates:
    """PEM files in ``directory``."""

    directory: Path
    #: The CA that signed the server and client certificates.
    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    #: A CA that signed none of these.
    other_ca_file: str
    #: The names the server certificate carries.
    server_names: tuple[str, ...]


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def make_certificates(
    directory: str | os.PathLike[str], server_names: Sequence[str] = ("memcached.test",)
) -> Certificates:
    """Make the certificates in ``directory``. ``server_names`` go into the server
    certificate's subject alternative names (DNS names, or IP addresses)."""
    if not openssl_available():
        raise CertificatesUnavailable("the openssl tool is not installed (apt-get install openssl)")
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)

    def path(name: str) -> str:
        return str(base / name)

    _ca(path("ca.pem"), path("ca.key"), "FastCache test CA")
    _ca(path("other-ca.pem"), path("other-ca.key"), "FastCache unrelated CA")
    alt = ",".join(
        f"IP:{name}" if name.replace(".", "").isdigit() or ":" in name else f"DNS:{name}"
        for name in server_names
    )
    _leaf(base, "server", server_names[0], f"subjectAltName={alt}\nextendedKeyUsage=serverAuth")
    _leaf(base, "client", "fastcache-client", "extendedKeyUsage=clientAuth")
    return Certificates(
        directory=base,
        ca_file=path("ca.pem"),
        server_cert=path("server.pem"),
        server_key=path("server.key"),
        client_cert=path("client.pem"),
        client_key=path("client.key"),
        other_ca_file=path("other-ca.pem"),
        server_names=tuple(server_names),
    )


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(cert: str, key: str, name: str) -> None:
    _openssl(
        "req", "-x509", *_KEY, "-keyout", key, "-out", cert, "-days", _DAYS,
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
    )  # fmt: skip


def _leaf(base: Path, stem: str, common_name: str, extensions: str) -> None:
    request = base / f"{stem}.csr"
    extfile = base / f"{stem}.ext"
    extfile.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n" + extensions + "\n"
    )
    _openssl(
        "req", *_KEY, "-keyout", str(base / f"{stem}.key"), "-out", str(request),
        "-subj", f"/CN={common_name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(base / "ca.pem"),
        "-CAkey", str(base / "ca.key"), "-CAcreateserial", "-days", _DAYS,
        "-out", str(base / f"{stem}.pem"), "-extfile", str(extfile),
    )  # fmt: skip
