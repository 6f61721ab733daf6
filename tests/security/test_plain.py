"""PLAIN tokens and the PlainLoginModule JAAS syntax."""

from __future__ import annotations

import pytest

from exactly.security.plain import JaasError, PlainError, authenticate_plain, parse_jaas_options, plain_users

JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
    'password="admin-secret" user_admin="admin-secret" user_alice="a \\"quoted\\" pw";'
)


def test_jaas_users() -> None:
    assert plain_users(JAAS) == {"admin": "admin-secret", "alice": 'a "quoted" pw'}
    module, options = parse_jaas_options(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username=bob password="x";'
    )
    assert module.endswith("ScramLoginModule") and options == {"username": "bob", "password": "x"}


@pytest.mark.parametrize(
    "bad", ["", "PlainLoginModule", JAAS.rstrip(";"), JAAS.replace("PlainLoginModule", "Other")]
)
def test_bad_jaas_is_refused(bad: str) -> None:
    with pytest.raises(JaasError):
        plain_users(bad)


def test_plain_token_rules() -> None:
    users = {"alice": "pw"}
    assert authenticate_plain(b"\x00alice\x00pw", users) == "alice"
    assert authenticate_plain(b"alice\x00alice\x00pw", users) == "alice"  # kafka-python sends authzid
    for token in (
        b"bob\x00alice\x00pw",
        b"\x00alice\x00no",
        b"\x00\x00pw",
        b"\x00alice\x00",
        b"a\x00b",
        b"\xff",
    ):
        with pytest.raises(PlainError):
            authenticate_plain(token, users)
