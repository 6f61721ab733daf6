"""The SASL state machine on its own: frames in, steps out (no sockets)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.list_groups.v4.request import ListGroupsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v0.request import SaslAuthenticateRequest as Auth0
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest as Auth2
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as Handshake0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as Handshake1
from kio.serial import entity_reader

from exactly.client.wire import encode_request
from exactly.protocol.apis import ApiKey, schema
from exactly.protocol.header import response_header
from exactly.security.sasl import (
    _TRANSITIONS,
    Action,
    SaslAuthenticator,
    SaslEvent,
    SaslState,
    Step,
    failure_message,
)
from exactly.security.scram import ScramMechanism, credential_from_password

USERS = {"alice": "alice-pw"}
SCRAM = {
    ("carol", ScramMechanism.SCRAM_SHA_512): credential_from_password(
        ScramMechanism.SCRAM_SHA_512, "carol-pw"
    )
}


def _auth(mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-512")) -> SaslAuthenticator:
    return SaslAuthenticator(mechanisms, USERS, lambda u, m: SCRAM.get((u, m)))


def _frame(request: Any, corr: int = 7) -> bytes:
    return encode_request(request, corr, "test")[4:]


def _response(step: Step, api_key: int, version: int) -> Any:
    """Parse a framed response step (size, header, body)."""
    data = step.response
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4
    api = schema(api_key, version)
    head = len(response_header(0, api.response_flexible and api_key != ApiKey.API_VERSIONS))
    return entity_reader(api.response_type)(data, 4 + head)[0]


def test_transition_table_every_live_state_can_fail_and_terminal_states_are_final() -> None:
    for state in SaslState:
        has_failure = (state, SaslEvent.FAILURE) in _TRANSITIONS
        assert has_failure == (state not in (SaslState.COMPLETE, SaslState.FAILED))
    assert not [k for k in _TRANSITIONS if k[0] in (SaslState.COMPLETE, SaslState.FAILED)]


def test_first_request_other_than_api_versions_or_handshake_closes_without_answer() -> None:
    auth = _auth()
    step = auth.receive(
        _frame(
            MetadataRequest(
                topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False
            )
        )
    )
    assert step.action is Action.CLOSE and step.response == b""
    assert auth.state is SaslState.FAILED


def test_api_versions_is_dispatched_once_then_only_a_handshake() -> None:
    auth = _auth()
    av = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    assert auth.receive(_frame(av)).action is Action.DISPATCH
    assert auth.state is SaslState.HANDSHAKE_REQUEST
    assert auth.receive(_frame(av)).action is Action.CLOSE


def test_unsupported_mechanism_answers_33_with_the_enabled_list_then_fails() -> None:
    auth = _auth()
    step = auth.receive(_frame(Handshake1(mechanism="GSSAPI")))
    assert step.action is Action.FAIL
    body = _response(step, ApiKey.SASL_HANDSHAKE, 1)
    assert body.error_code == ErrorCode.unsupported_sasl_mechanism
    assert tuple(body.mechanisms) == ("PLAIN", "SCRAM-SHA-512")


def test_plain_over_sasl_authenticate_succeeds_with_the_principal() -> None:
    auth = _auth()
    step = auth.receive(_frame(Handshake1(mechanism="PLAIN")))
    assert (
        step.action is Action.REPLY and _response(step, ApiKey.SASL_HANDSHAKE, 1).error_code == ErrorCode.none
    )
    step = auth.receive(_frame(Auth2(auth_bytes=b"\x00alice\x00alice-pw")))
    assert step.action is Action.AUTHENTICATED and step.principal == "User:alice"
    assert _response(step, ApiKey.SASL_AUTHENTICATE, 2).error_code == ErrorCode.none
    assert auth.state is SaslState.COMPLETE


@pytest.mark.parametrize("token", [b"\x00alice\x00wrong", b"\x00nobody\x00alice-pw", b"garbage", b"\x00\x00"])
def test_plain_failures_look_alike_to_the_client(token: bytes) -> None:
    auth = _auth()
    auth.receive(_frame(Handshake1(mechanism="PLAIN")))
    step = auth.receive(_frame(Auth2(auth_bytes=token)))
    assert step.action is Action.FAIL
    body = _response(step, ApiKey.SASL_AUTHENTICATE, 2)
    assert body.error_code == ErrorCode.sasl_authentication_failed
    assert body.error_message == failure_message("PLAIN")  # says nothing about the user
    assert auth.state is SaslState.FAILED


def test_handshake_v0_uses_raw_tokens_and_plain_success_is_an_empty_token() -> None:
    auth = _auth()
    assert auth.receive(_frame(Handshake0(mechanism="PLAIN"))).action is Action.REPLY
    assert auth.state is SaslState.RAW_TOKENS
    step = auth.receive(b"\x00alice\x00alice-pw")
    assert step.action is Action.AUTHENTICATED and step.response == b"\x00\x00\x00\x00"
    bad = _auth()
    bad.receive(_frame(Handshake0(mechanism="PLAIN")))
    step = bad.receive(b"\x00alice\x00no")
    assert step.action is Action.FAIL and step.response == b""  # raw framing: just closed


def _scram_client_final(server_first: bytes, client_first_bare: str, password: str) -> str:
    fields = dict(p.split("=", 1) for p in server_first.decode().split(","))
    salt, iterations, nonce = base64.b64decode(fields["s"]), int(fields["i"]), fields["r"]
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    stored = hashlib.sha512(client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"{client_first_bare},{server_first.decode()},{without_proof}".encode()
    signature = hmac.new(stored, auth_message, "sha512").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


@pytest.mark.parametrize("version", [0, 2])
def test_scram_sha_512_exchange_over_sasl_authenticate(version: int) -> None:
    auth = _auth()
    auth.receive(_frame(Handshake1(mechanism="SCRAM-SHA-512")))
    req = Auth0 if version == 0 else Auth2
    step = auth.receive(_frame(req(auth_bytes=b"n,,n=carol,r=cnonce")))
    assert step.action is Action.REPLY
    server_first = _response(step, ApiKey.SASL_AUTHENTICATE, version).auth_bytes
    final = _scram_client_final(server_first, "n=carol,r=cnonce", "carol-pw")
    step = auth.receive(_frame(req(auth_bytes=final.encode())))
    assert step.action is Action.AUTHENTICATED and step.principal == "User:carol"
    assert _response(step, ApiKey.SASL_AUTHENTICATE, version).auth_bytes.startswith(b"v=")


def test_scram_wrong_password_and_unknown_user_get_the_same_answer() -> None:
    answers = []
    for user, password in (("carol", "nope"), ("dave", "carol-pw")):
        auth = _auth()
        auth.receive(_frame(Handshake1(mechanism="SCRAM-SHA-512")))
        step = auth.receive(_frame(Auth2(auth_bytes=f"n,,n={user},r=cnonce".encode())))
        if step.action is Action.REPLY:
            server_first = _response(step, ApiKey.SASL_AUTHENTICATE, 2).auth_bytes
            final = _scram_client_final(server_first, f"n={user},r=cnonce", password)
            step = auth.receive(_frame(Auth2(auth_bytes=final.encode())))
        assert step.action is Action.FAIL
        body = _response(step, ApiKey.SASL_AUTHENTICATE, 2)
        answers.append((body.error_code, body.error_message))
    assert (
        answers[0] == answers[1] == (ErrorCode.sasl_authentication_failed, failure_message("SCRAM-SHA-512"))
    )


def test_other_api_during_authentication_gets_illegal_sasl_state_then_fails() -> None:
    auth = _auth()
    auth.receive(_frame(Handshake1(mechanism="PLAIN")))
    step = auth.receive(_frame(ListGroupsRequest(states_filter=())))
    assert step.action is Action.FAIL
    assert _response(step, ApiKey.LIST_GROUPS, 4).error_code == ErrorCode.illegal_sasl_state
    auth = _auth()
    auth.receive(_frame(Handshake1(mechanism="PLAIN")))
    step = auth.receive(
        _frame(
            MetadataRequest(
                topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False
            )
        )
    )
    assert step.action is Action.FAIL and step.response == b""  # no top-level error code: closed


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00",
        b"\x00\x11\x00\x05\x00\x00\x00\x01\xff\xff",
        b"\x00\x11\x00\x01\x00\x00\x00\x01\x00\x00\x7f\xff",
    ],
)
def test_garbage_before_authentication_never_dispatches(frame: bytes) -> None:
    step = _auth().receive(frame)
    assert step.action in (Action.CLOSE, Action.FAIL)
