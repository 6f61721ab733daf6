"""SCRAM against RFC 7677's SCRAM-SHA-256 example, plus Kafka's rules (authzid, escapes, bounds)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from exactly.security.scram import (
    ScramCredential,
    ScramError,
    ScramMechanism,
    ScramServer,
    credential_from_password,
    credential_from_salted_password,
    salted_password,
    unescape_name,
)

SHA256 = ScramMechanism.SCRAM_SHA_256
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SNONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_FINAL = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="


def _server(users: dict[str, ScramCredential], mechanism: ScramMechanism = SHA256) -> ScramServer:
    return ScramServer(
        mechanism, lambda u, m: users.get(u) if m is mechanism else None, nonce=lambda: RFC_SNONCE
    )


def test_rfc7677_example_exchange() -> None:
    cred = credential_from_password(SHA256, "pencil", 4096, RFC_SALT)
    server = _server({"user": cred})
    first = server.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final, user = server.client_final(RFC_FINAL.encode())
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert user == "user"


def test_wrong_proof_and_unknown_user_fail() -> None:
    cred = credential_from_password(SHA256, "other", 4096, RFC_SALT)
    server = _server({"user": cred})
    server.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramError, match="invalid proof"):
        server.client_final(RFC_FINAL.encode())
    with pytest.raises(ScramError, match="unknown user"):
        _server({}).client_first(b"n,,n=user,r=abc")


@pytest.mark.parametrize(
    "message",
    [
        b"y,,n=user,r=abc",  # channel binding flags other than n
        b"p=tls-unique,,n=user,r=abc",
        b"n,a=other,n=user,r=abc",  # authzid differs from the user
        b"n,,n=us=41er,r=abc",  # bad escape
        b"n,,n=,r=abc",
        b"n,,n=user,r=abc,tokenauth=true",  # delegation tokens
        b"\xff\xfe",
        b"",
    ],
)
def test_malformed_client_first_is_refused(message: bytes) -> None:
    cred = credential_from_password(SHA256, "pencil", 4096, RFC_SALT)
    with pytest.raises(ScramError):
        _server({"user": cred}).client_first(message)


def test_authzid_equal_to_user_is_accepted_and_escapes_decoded() -> None:
    cred = credential_from_password(SHA256, "pw", 4096, RFC_SALT)
    server = _server({"a,b=c": cred})
    assert server.client_first(b"n,a=a=2Cb=3Dc,n=a=2Cb=3Dc,r=xyz").startswith(b"r=xyz")
    assert unescape_name("x=2Cy=3Dz") == "x,y=z"


def test_final_with_a_changed_nonce_or_binding_fails() -> None:
    cred = credential_from_password(SHA256, "pencil", 4096, RFC_SALT)
    server = _server({"user": cred})
    server.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramError, match="nonce"):
        server.client_final(RFC_FINAL.replace("k0,p", "k0x,p").encode())
    server = _server({"user": cred})
    server.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramError, match="channel binding"):
        server.client_final(RFC_FINAL.replace("c=biws", "c=eSws").encode())


def test_credentials_store_keys_not_passwords_and_match_the_admin_path() -> None:
    for mech in ScramMechanism:
        direct = credential_from_password(mech, "secret", 8192, b"salt" * 8)
        salted = salted_password(mech, "secret", b"salt" * 8, 8192)
        assert salted == hashlib.pbkdf2_hmac(mech.hash_name, b"secret", b"salt" * 8, 8192)
        assert credential_from_salted_password(mech, b"salt" * 8, salted, 8192) == direct
        client_key = hmac.new(salted, b"Client Key", mech.hash_name).digest()
        assert direct.stored_key == hashlib.new(mech.hash_name, client_key).digest()
        assert b"secret" not in direct.stored_key + direct.server_key
    with pytest.raises(ValueError):
        credential_from_password(SHA256, "x", 4095)
    with pytest.raises(ValueError):
        credential_from_password(SHA256, "x", 16385)


def test_second_client_first_is_refused() -> None:
    cred = credential_from_password(SHA256, "pencil", 4096, RFC_SALT)
    server = _server({"user": cred})
    server.client_first(b"n,,n=user,r=abc")
    with pytest.raises(ScramError):
        server.client_first(b"n,,n=user,r=abc")
    with pytest.raises(ScramError):
        _server({"user": cred}).client_final(RFC_FINAL.encode())
