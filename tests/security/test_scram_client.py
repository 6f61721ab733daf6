"""The SCRAM client against the broker's own SCRAM server (both sans-IO), and RFC 7677's
published SCRAM-SHA-256 exchange, so the two sides cannot agree on a shared mistake."""

from __future__ import annotations

import pytest

from exactly.security.scram import (
    ScramCredential,
    ScramError,
    ScramMechanism,
    ScramServer,
    credential_from_password,
)
from exactly.security.scram_client import ScramClient, escape_name


@pytest.mark.parametrize("mechanism", list(ScramMechanism))
@pytest.mark.parametrize("user", ["alice", "a,b=c"])
def test_client_and_server_complete_an_exchange(mechanism: ScramMechanism, user: str) -> None:
    stored = credential_from_password(mechanism, "pw,=1")
    server = ScramServer(mechanism, lambda name, _m: stored if name == user else None)
    client = ScramClient(mechanism, user, "pw,=1")
    server_first = server.client_first(client.client_first())
    server_final, authenticated = server.client_final(client.client_final(server_first))
    client.verify_server_final(server_final)
    assert authenticated == user


def test_wrong_password_fails_at_the_server() -> None:
    mech = ScramMechanism.SCRAM_SHA_512
    stored = credential_from_password(mech, "right")
    server = ScramServer(mech, lambda _n, _m: stored)
    client = ScramClient(mech, "alice", "wrong")
    with pytest.raises(ScramError, match="invalid proof"):
        server.client_final(client.client_final(server.client_first(client.client_first())))


def test_a_server_without_the_users_keys_is_detected() -> None:
    """The server signature proves the broker holds ServerKey: a server that learnt only the
    StoredKey (enough to check proofs) cannot forge it."""
    mech = ScramMechanism.SCRAM_SHA_256
    real = credential_from_password(mech, "pw")
    fake = ScramCredential(real.salt, real.stored_key, b"\0" * len(real.server_key), real.iterations)
    server = ScramServer(mech, lambda _n, _m: fake)
    client = ScramClient(mech, "alice", "pw")
    final, _ = server.client_final(client.client_final(server.client_first(client.client_first())))
    with pytest.raises(ScramError, match="server signature is wrong"):
        client.verify_server_final(final)


def test_rfc7677_example() -> None:
    client = ScramClient(ScramMechanism.SCRAM_SHA_256, "user", "pencil", nonce=lambda: "rOprNGfwEbeRWgbNEkqO")
    assert client.client_first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.client_final(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


@pytest.mark.parametrize(
    ("server_first", "message"),
    [
        (b"r=someone-else,s=c2FsdA==,i=4096", "does not extend"),
        (b"r=abcXYZ,s=c2FsdA==,i=1000", "below 4096"),
        (b"r=abcXYZ,s=***,i=4096", "not base64"),
        (b"e=unknown-user", "refused"),
        (b"garbage", "malformed"),
    ],
)
def test_bad_server_first_messages_are_refused(server_first: bytes, message: str) -> None:
    client = ScramClient(ScramMechanism.SCRAM_SHA_512, "u", "p", nonce=lambda: "abc")
    with pytest.raises(ScramError, match=message):
        client.client_final(server_first)


def test_names_are_escaped() -> None:
    assert escape_name("a=b,c") == "a=3Db=2Cc"
