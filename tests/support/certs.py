"""Test certificates made with the ``openssl`` command line: a CA, a server certificate for
127.0.0.1/localhost, client certificates (valid, expired, and one signed by another CA), all
PEM. EC P-256 keys keep generation fast. Nothing here is used outside tests."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


@dataclass(frozen=True)
class TestPki:
    __test__ = False  # not a test class

    ca: Path  # the trusted CA certificate
    server_keystore: Path  # key + certificate chain in one PEM file (Kafka's PEM keystore)
    server_cert: Path
    server_key: Path
    alice: ClientCert  # subject O=exactly,OU=clients,CN=alice, signed by ``ca``
    expired: ClientCert  # signed by ``ca``, notAfter in the past
    untrusted: ClientCert  # signed by another CA

    ALICE_DN = "CN=alice,OU=clients,O=exactly"


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key_and_csr(d: Path, name: str, subject: str) -> None:
    _run(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d,
    )  # fmt: skip


def _self_signed_ca(d: Path, name: str) -> None:
    _run(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=d,
    )  # fmt: skip


def _sign(d: Path, name: str, ca: str, days: int, ext: str | None = None) -> None:
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key"]
    args += ["-CAcreateserial", "-out", f"{name}.pem", "-days", str(days)]
    if ext is not None:
        (d / f"{name}.ext").write_text(ext)
        args += ["-extfile", f"{name}.ext"]
    _run(*args, cwd=d)


def make_pki(directory: Path) -> TestPki:
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is needed to make test certificates")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    _self_signed_ca(d, "ca")
    _self_signed_ca(d, "other-ca")
    _key_and_csr(d, "server", "/CN=localhost")
    _sign(d, "server", "ca", 2, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "server-keystore.pem").write_text((d / "server.key").read_text() + (d / "server.pem").read_text())
    _key_and_csr(d, "alice", "/O=exactly/OU=clients/CN=alice")
    _sign(d, "alice", "ca", 2)
    _key_and_csr(d, "expired", "/O=exactly/OU=clients/CN=expired")
    _sign(d, "expired", "ca", -1)  # notAfter one day before notBefore: expired
    _key_and_csr(d, "mallory", "/O=exactly/OU=clients/CN=mallory")
    _sign(d, "mallory", "other-ca", 2)
    return TestPki(
        ca=d / "ca.pem",
        server_keystore=d / "server-keystore.pem",
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        alice=ClientCert(d / "alice.pem", d / "alice.key"),
        expired=ClientCert(d / "expired.pem", d / "expired.key"),
        untrusted=ClientCert(d / "mallory.pem", d / "mallory.key"),
    )
