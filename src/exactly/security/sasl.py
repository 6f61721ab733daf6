"""The server side of SASL on one connection, before it is authenticated (Kafka's
SaslServerAuthenticator). Sans-IO: ``SaslAuthenticator.receive`` takes one request frame (the
size prefix already removed) and says what to do with it; the connection does the I/O.

States and what each accepts (one Enum, one transition table):

- INITIAL_REQUEST: ApiVersions (answered by the dispatcher, as on any connection) or
  SaslHandshake. Any other API closes the connection without a response; an unparsable frame
  fails with UNSUPPORTED_SASL_MECHANISM semantics (closed; GSSAPI's legacy tokens are not
  supported).
- HANDSHAKE_REQUEST (after ApiVersions): only SaslHandshake; anything else closes.
- A handshake for a mechanism not in ``sasl.enabled.mechanisms`` gets UNSUPPORTED_SASL_MECHANISM
  and the enabled list, then the connection closes. Handshake v0 switches to RAW_TOKENS (each
  SASL token framed by its 4-byte size alone, no Kafka header: what old clients send), v1 to
  AUTHENTICATE (each token inside SaslAuthenticate).
- AUTHENTICATE: only SaslAuthenticate; another API gets its error response with
  ILLEGAL_SASL_STATE where its schema has a top-level error code, then the connection closes.
- COMPLETE: authenticated; the connection dispatches requests with the principal. FAILED:
  nothing is served again; the connection closes after ``connection.failed.authentication.
  delay.ms`` (Kafka's delay against password guessing at full speed).

Failures answer SaslAuthenticate with SASL_AUTHENTICATION_FAILED and one generic message per
mechanism whatever the cause (unknown user, wrong password, malformed token), so the answer does
not reveal whether a user exists; the cause goes to the log line (``Step.reason``) only. In the
raw-token framing a failure just closes, as in Kafka.

Re-authentication (KIP-368) is not supported: ``SessionLifetimeMs`` is 0, so clients never try."""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, encode_response, schema
from exactly.protocol.framing import frame
from exactly.protocol.header import HeaderError, parse_request_header, response_header, skip_tagged_fields
from exactly.security.plain import PlainError, authenticate_plain
from exactly.security.scram import ScramCredential, ScramError, ScramMechanism, ScramServer

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512")
# Kafka's sasl.server.max.receive.size: the largest frame an unauthenticated client may send
MAX_RECEIVE_SIZE = 524288


class SaslState(enum.Enum):
    INITIAL_REQUEST = "initial request"
    HANDSHAKE_REQUEST = "handshake request"
    AUTHENTICATE = "authenticate"  # tokens inside SaslAuthenticate (handshake v1+)
    RAW_TOKENS = "raw tokens"  # tokens framed by size alone (handshake v0)
    COMPLETE = "complete"
    FAILED = "failed"


class SaslEvent(enum.Enum):
    API_VERSIONS = "api versions"
    HANDSHAKE_KAFKA_FRAMING = "handshake v1"
    HANDSHAKE_RAW_FRAMING = "handshake v0"
    TOKEN = "token, exchange goes on"
    AUTHENTICATED = "authenticated"
    FAILURE = "failure"


_S, _E = SaslState, SaslEvent
_TRANSITIONS: dict[tuple[SaslState, SaslEvent], SaslState] = {
    (_S.INITIAL_REQUEST, _E.API_VERSIONS): _S.HANDSHAKE_REQUEST,
    (_S.INITIAL_REQUEST, _E.HANDSHAKE_KAFKA_FRAMING): _S.AUTHENTICATE,
    (_S.INITIAL_REQUEST, _E.HANDSHAKE_RAW_FRAMING): _S.RAW_TOKENS,
    (_S.HANDSHAKE_REQUEST, _E.HANDSHAKE_KAFKA_FRAMING): _S.AUTHENTICATE,
    (_S.HANDSHAKE_REQUEST, _E.HANDSHAKE_RAW_FRAMING): _S.RAW_TOKENS,
    (_S.AUTHENTICATE, _E.TOKEN): _S.AUTHENTICATE,
    (_S.AUTHENTICATE, _E.AUTHENTICATED): _S.COMPLETE,
    (_S.RAW_TOKENS, _E.TOKEN): _S.RAW_TOKENS,
    (_S.RAW_TOKENS, _E.AUTHENTICATED): _S.COMPLETE,
    **{(s, _E.FAILURE): _S.FAILED for s in SaslState if s not in (_S.COMPLETE, _S.FAILED)},
}


class InvalidSaslTransitionError(Exception):
    pass


class Action(enum.Enum):
    DISPATCH = "dispatch"  # hand the frame to the dispatcher (ApiVersions)
    REPLY = "reply"  # write ``response``; keep reading
    AUTHENTICATED = "authenticated"  # write ``response``; from now on dispatch with ``principal``
    FAIL = "fail"  # write ``response`` (may be empty), close after the failed-auth delay
    CLOSE = "close"  # close now, no response


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    response: bytes = b""
    reason: str = ""  # for the log line (never sent to the client)
    principal: str = ""
    mechanism: str = ""


def failure_message(mechanism: str) -> str:
    """Kafka's text for a SaslException: the same for every cause."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


class SaslAuthenticator:
    """One connection's SASL state. ``plain_users``: PLAIN's accounts on this listener;
    ``scram_lookup``: the credential store. Invariant: ``state`` changes only through
    ``_TRANSITIONS``; once COMPLETE or FAILED, ``receive`` is not called again."""

    def __init__(
        self,
        enabled: Collection[str],
        plain_users: Mapping[str, str],
        scram_lookup: Callable[[str, ScramMechanism], ScramCredential | None],
    ) -> None:
        self.enabled = tuple(m for m in enabled)
        self.state = SaslState.INITIAL_REQUEST
        self.mechanism = ""
        self._plain_users = plain_users
        self._scram_lookup = scram_lookup
        self._scram: ScramServer | None = None
        self._correlation = 0
        self._auth_version = 0

    def _move(self, event: SaslEvent) -> None:
        target = _TRANSITIONS.get((self.state, event))
        if target is None:
            raise InvalidSaslTransitionError(f"{event.value} while {self.state.value}")
        self.state = target

    def _fail(self, response: bytes, reason: str) -> Step:
        self._move(SaslEvent.FAILURE)
        return Step(Action.FAIL, response, reason, mechanism=self.mechanism)

    def receive(self, payload: bytes | bytearray) -> Step:
        state = self.state
        if state is SaslState.RAW_TOKENS:
            return self._token(bytes(payload))
        try:
            header, pos = parse_request_header(payload)
        except HeaderError as exc:
            return self._close(f"unparsable frame before authentication ({exc})")
        key = header.api_key
        self._correlation = header.correlation_id
        if state is SaslState.AUTHENTICATE:
            if key != ApiKey.SASL_AUTHENTICATE:
                return self._illegal_in_authenticate(key, header.api_version, header.correlation_id)
            lo, hi = VERSION_RANGES[ApiKey.SASL_AUTHENTICATE]
            if not lo <= header.api_version <= hi:
                return self._close(f"SaslAuthenticate v{header.api_version} is not supported")
            self._auth_version = header.api_version
            try:
                api = schema(key, header.api_version)
                if api.request_flexible:
                    pos = skip_tagged_fields(payload, pos)
                request, _ = api.read_request(bytes(payload), pos)
            except Exception as exc:  # any decode failure of client bytes
                return self._fail(self._auth_response(ErrorCode.illegal_sasl_state, "malformed"), repr(exc))
            return self._token(bytes(request.auth_bytes))
        if key == ApiKey.API_VERSIONS and state is SaslState.INITIAL_REQUEST:
            lo, hi = VERSION_RANGES[ApiKey.API_VERSIONS]
            if lo <= header.api_version <= hi:
                self._move(SaslEvent.API_VERSIONS)
            return Step(Action.DISPATCH)
        if key != ApiKey.SASL_HANDSHAKE:
            return self._close(f"{_api_name(key)} request before SASL authentication (ILLEGAL_SASL_STATE)")
        return self._handshake(payload, pos, header.api_version, header.correlation_id)

    def _close(self, reason: str) -> Step:
        if self.state not in (SaslState.COMPLETE, SaslState.FAILED):
            self._move(SaslEvent.FAILURE)
        return Step(Action.CLOSE, reason=reason, mechanism=self.mechanism)

    def _handshake(self, payload: bytes | bytearray, pos: int, version: int, correlation: int) -> Step:
        lo, hi = VERSION_RANGES[ApiKey.SASL_HANDSHAKE]
        if not lo <= version <= hi:
            return self._close(f"SaslHandshake v{version} is not supported")
        api = schema(ApiKey.SASL_HANDSHAKE, version)
        try:
            request, _ = api.read_request(bytes(payload), pos)
        except Exception as exc:  # any decode failure of client bytes
            return self._close(f"malformed SaslHandshake: {exc!r}")
        mechanism = str(request.mechanism)
        if mechanism not in self.enabled:
            body = build(
                api.response_type, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=self.enabled
            )
            self.mechanism = mechanism[:64]
            return self._fail(
                frame(response_header(correlation, False) + encode_response(api, body)),
                f"unsupported SASL mechanism {mechanism[:64]!r}",
            )
        self.mechanism = mechanism
        if mechanism != PLAIN:
            scram_mechanism = ScramMechanism.by_name(mechanism)
            assert scram_mechanism is not None
            self._scram = ScramServer(scram_mechanism, self._scram_lookup)
        body = build(api.response_type, error_code=ErrorCode.none, mechanisms=self.enabled)
        self._move(SaslEvent.HANDSHAKE_KAFKA_FRAMING if version >= 1 else SaslEvent.HANDSHAKE_RAW_FRAMING)
        return Step(Action.REPLY, frame(response_header(correlation, False) + encode_response(api, body)))

    def _illegal_in_authenticate(self, key: int, version: int, correlation: int) -> Step:
        """Kafka answers the request with its API's error response (ILLEGAL_SASL_STATE), then
        closes; here only where the schema has a top-level error code (else just closed)."""
        response = b""
        lo_hi = VERSION_RANGES.get(key)
        if lo_hi is not None and lo_hi[0] <= version <= lo_hi[1]:
            api = schema(key, version)
            if "error_code" in getattr(api.response_type, "__dataclass_fields__", {}):
                flexible = api.response_flexible and key != ApiKey.API_VERSIONS
                body = build(api.response_type, error_code=ErrorCode.illegal_sasl_state)
                response = frame(response_header(correlation, flexible) + encode_response(api, body))
        return self._fail(
            response, f"{_api_name(key)} request during SASL authentication (ILLEGAL_SASL_STATE)"
        )

    def _auth_response(
        self, error: ErrorCode, message: str | None, token: bytes = b"", final: bool = False
    ) -> bytes:
        version = self._auth_version
        api = schema(ApiKey.SASL_AUTHENTICATE, version)
        body = build(
            api.response_type,
            error_code=error,
            error_message=message,
            auth_bytes=token,
            session_lifetime=datetime.timedelta(0),
        )
        return frame(response_header(self._correlation, api.response_flexible) + encode_response(api, body))

    def _token(self, token: bytes) -> Step:
        raw = self.state is SaslState.RAW_TOKENS
        try:
            if self.mechanism == PLAIN:
                user: str | None = authenticate_plain(token, self._plain_users)
                reply = b""
            else:
                scram = self._scram
                assert scram is not None
                if scram.expecting_final:
                    reply, user = scram.client_final(token)
                else:
                    reply, user = scram.client_first(token), None
        except (PlainError, ScramError) as exc:
            if raw:
                return self._fail(b"", str(exc))
            message = failure_message(self.mechanism)
            return self._fail(self._auth_response(ErrorCode.sasl_authentication_failed, message), str(exc))
        out = frame(reply) if raw else self._auth_response(ErrorCode.none, None, reply)
        if user is None:
            self._move(SaslEvent.TOKEN)
            return Step(Action.REPLY, out, mechanism=self.mechanism)
        self._move(SaslEvent.AUTHENTICATED)
        return Step(Action.AUTHENTICATED, out, principal=f"User:{user}", mechanism=self.mechanism)


def _api_name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return f"API {key}"


def illegal_state_response(api: Any) -> Any:
    """The body SaslHandshake/SaslAuthenticate get once authenticated (or on a listener without
    SASL): ILLEGAL_SASL_STATE, as Kafka's API layer answers them."""
    return build(api.response_type, error_code=ErrorCode.illegal_sasl_state, mechanisms=(), auth_bytes=b"")
