"""The connecting side of the brokers' own traffic (cluster mode): TLS and SASL on every
connection a broker opens to another broker, as the inter-broker listener's security protocol
says (settings: :mod:`exactly.security.inter_broker`).

Used by the replica fetchers (``replica_channel``) and the request connections
(``broker_connection``: transaction markers, KIP-890 verification). A connection is opened
with :meth:`InterBrokerClient.connect_options` (the TLS context and the server name the peer's
certificate is checked against) and, on a SASL listener, authenticated with
:meth:`InterBrokerClient.authenticate` before its first request: SaslHandshake v1, then the
mechanism's tokens in SaslAuthenticate v2, as Kafka's own clients do (the peers run this same
broker, so no version negotiation is needed; a broker accepts SaslHandshake as the first
request). The tokens come from the wire client's sans-IO :class:`~exactly.client.security.SaslSession`
(PLAIN, and SCRAM through :class:`~exactly.security.scram_client.ScramClient`), so there is one
SCRAM client in the project.

Failures are :class:`InterBrokerAuthError`, a ConnectionError: every caller already treats an
OSError as "drop the connection and try again later", and logs it (at :func:`failure_level`).
Callers retry a refusal after :func:`refused_backoff_s`, which grows with each one in a row."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from exactly.client.security import SaslSession
from exactly.security.inter_broker import InterBrokerSecurity
from exactly.security.scram import ScramError
from exactly.security.tls import client_context

Call = Callable[[Any], Awaitable[Any]]


REFUSED_BACKOFF_S = 0.2  # the first wait after a refused login or TLS handshake
REFUSED_BACKOFF_MAX_S = 5.0  # the longest (Kafka: reconnect.backoff.ms growing to its maximum)


class InterBrokerAuthError(ConnectionError):
    """The other broker refused this broker's credentials (or its SASL messages were wrong)."""


class BackingOff(ConnectionError):
    """No new connection yet: the last ones were refused (see :func:`refused_backoff_s`)."""


def is_refusal(exc: BaseException) -> bool:
    """A refused login or TLS handshake: a misconfiguration (credentials, certificates, trust
    store), not a broker coming or going, so it is logged as a warning and retried slowly."""
    return isinstance(exc, (InterBrokerAuthError, ssl.SSLError))


def refused_backoff_s(consecutive: int) -> float:
    """The wait before the next attempt after ``consecutive`` (>= 1) refusals in a row: doubling
    from REFUSED_BACKOFF_S up to REFUSED_BACKOFF_MAX_S, so a broker with wrong credentials keeps
    retrying (and heals once they are fixed) without flooding its log or its peer."""
    return float(min(REFUSED_BACKOFF_MAX_S, REFUSED_BACKOFF_S * 2.0 ** (max(consecutive, 1) - 1)))


def failure_level(exc: BaseException) -> int:
    """The log level of a failed inter-broker call: WARNING for a refusal, DEBUG while backing
    off after one (the refusal itself was logged), INFO for the rest."""
    if is_refusal(exc):
        return logging.WARNING
    return logging.DEBUG if isinstance(exc, BackingOff) else logging.INFO


class InterBrokerClient:
    """Built once per broker at start-up (a TlsConfigError from an unusable keystore or
    truststore stops the start); shared by every inter-broker connection."""

    def __init__(self, settings: InterBrokerSecurity) -> None:
        self.settings = settings
        self.ssl_context: ssl.SSLContext | None = (
            client_context(settings.tls_setting) if settings.protocol.tls else None
        )

    @property
    def uses_sasl(self) -> bool:
        return self.settings.protocol.sasl

    def connect_options(self, host: str, handshake_timeout_s: float) -> dict[str, Any]:
        """Keyword arguments of ``create_connection``/``open_connection`` for ``host``."""
        if self.ssl_context is None:
            return {}
        return {
            "ssl": self.ssl_context,
            "server_hostname": host,
            "ssl_handshake_timeout": handshake_timeout_s,
        }

    async def authenticate(self, call: Call, peer: str) -> None:
        """Run the SASL exchange over a fresh connection (no-op without SASL). ``call`` sends one
        request entity and returns the decoded response."""
        settings = self.settings
        if not settings.protocol.sasl:
            return
        assert settings.mechanism and settings.username and settings.password is not None
        mechanism = settings.mechanism
        who = f"as User:{settings.username} ({mechanism}) to {peer}"
        handshake = await call(SaslHandshakeRequest(mechanism=mechanism))
        if int(handshake.error_code) != ErrorCode.none:
            offered = ", ".join(str(m) for m in handshake.mechanisms) or "none"
            raise InterBrokerAuthError(
                f"cannot authenticate {who}: mechanism not enabled there (enabled: {offered})"
            )
        session = SaslSession(mechanism, settings.username, settings.password)
        token: bytes | None = session.first()
        while token is not None:
            response = await call(SaslAuthenticateRequest(auth_bytes=token))
            if int(response.error_code) != ErrorCode.none:
                message = response.error_message or ErrorCode(int(response.error_code)).name
                raise InterBrokerAuthError(f"authentication failed {who}: {message}")
            try:
                token = session.respond(bytes(response.auth_bytes))
            except ScramError as exc:
                raise InterBrokerAuthError(f"authentication failed {who}: {exc}") from None
