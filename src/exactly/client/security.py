"""Security settings of the project's own wire client, read from a Kafka client configuration
with librdkafka's names, so the dict that configures confluent-kafka's AdminClient configures
:class:`~exactly.client.wire.WireClient` too:

==========================================  ==================================================
``security.protocol``                       PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
``ssl.ca.location`` / ``ssl.ca.pem``        trusted CAs (default: the system's)
``ssl.certificate.location``                client certificate (PEM) for SSL client auth
``ssl.key.location``, ``ssl.key.password``  its private key
``ssl.endpoint.identification.algorithm``   ``https`` (default, as librdkafka >= 2.0) or ``none``
``enable.ssl.certificate.verification``     ``false`` turns verification off (tests only)
``sasl.mechanism(s)``                       PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default GSSAPI in
                                            librdkafka; not supported here, so it must be set)
``sasl.username``, ``sasl.password``
==========================================  ==================================================

Other keys (librdkafka tuning) are ignored. The Java client's ``sasl.jaas.config`` and PEM
truststore are translated by :func:`translate_java_security` (for ``--command-config`` files
written for Kafka's own tools). TLS is 1.2 or newer, as the broker requires. No I/O here: the
wire client wraps its socket with :meth:`ClientSecurity.ssl_context` and drives the
:class:`SaslSession` over SaslHandshake/SaslAuthenticate."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactly.security.plain import JaasError, parse_jaas_options
from exactly.security.scram import ScramMechanism
from exactly.security.scram_client import ScramClient

__all__ = ["ClientConfigError", "ClientSecurity", "SaslSession", "translate_java_security"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_JAAS_MODULES = (
    "org.apache.kafka.common.security.scram.ScramLoginModule",
    "org.apache.kafka.common.security.plain.PlainLoginModule",
)


class ClientConfigError(ValueError):
    """A client configuration the wire client cannot use; one line for the user."""


def translate_java_security(conf: Mapping[str, Any]) -> dict[str, str]:
    """A copy of ``conf`` with the Java client's ``sasl.jaas.config`` (Scram/PlainLoginModule)
    turned into ``sasl.username``/``sasl.password``, ``sasl.mechanism`` kept (librdkafka knows
    it as an alias) and a PEM ``ssl.truststore.location`` into ``ssl.ca.location``; explicit
    librdkafka settings win."""
    out = {str(k): str(v) for k, v in conf.items()}
    jaas = out.pop("sasl.jaas.config", None)
    if jaas is not None:
        try:
            module, options = parse_jaas_options(jaas)
        except JaasError as exc:
            raise ClientConfigError(f"sasl.jaas.config: {exc}") from None
        if module not in _JAAS_MODULES:
            raise ClientConfigError(f"sasl.jaas.config: login module {module} is not supported")
        for java, rdkafka in (("username", "sasl.username"), ("password", "sasl.password")):
            if java in options:
                out.setdefault(rdkafka, options[java])
    store_type = out.pop("ssl.truststore.type", None)
    store = out.pop("ssl.truststore.location", None)
    if store is not None:
        if (store_type or "JKS").upper() != "PEM":
            raise ClientConfigError(
                "ssl.truststore.location needs ssl.truststore.type=PEM (or use ssl.ca.location)"
            )
        out.setdefault("ssl.ca.location", store)
    return out


class SaslSession:
    """The tokens of one SASL exchange: :meth:`first` is sent, then each server token goes to
    :meth:`respond`, which returns the next token or None when the exchange is complete."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.mechanism = mechanism
        self._user = user
        self._password = password
        scram = ScramMechanism.by_name(mechanism)
        self._scram = ScramClient(scram, user, password) if scram is not None else None
        self._step = 0

    def first(self) -> bytes:
        if self._scram is None:  # PLAIN: authzid NUL user NUL password, in one token
            return f"\0{self._user}\0{self._password}".encode()
        return self._scram.client_first()

    def respond(self, token: bytes) -> bytes | None:
        """Raises ScramError when the server's messages are wrong."""
        self._step += 1
        if self._scram is None:
            return None
        if self._step == 1:
            return self._scram.client_final(token)
        self._scram.verify_server_final(token)
        return None


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    ca_location: str | None = None
    ca_pem: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = None
    check_hostname: bool = True
    verify: bool = True
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> ClientSecurity:
        conf = translate_java_security(config or {})
        protocol = conf.get("security.protocol", "PLAINTEXT").upper()
        if protocol not in PROTOCOLS:
            raise ClientConfigError(
                f"security.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
            )
        algorithm = conf.get("ssl.endpoint.identification.algorithm", "https").lower()
        if algorithm not in ("https", "none", ""):
            raise ClientConfigError(
                f"ssl.endpoint.identification.algorithm must be https or none, got {algorithm!r}"
            )
        verify = conf.get("enable.ssl.certificate.verification", "true").lower()
        mechanism = conf.get("sasl.mechanisms", conf.get("sasl.mechanism"))
        security = cls(
            protocol=protocol,
            ca_location=conf.get("ssl.ca.location"),
            ca_pem=conf.get("ssl.ca.pem"),
            certificate_location=conf.get("ssl.certificate.location"),
            key_location=conf.get("ssl.key.location"),
            key_password=conf.get("ssl.key.password"),
            check_hostname=algorithm == "https",
            verify=verify not in ("false", "0"),
            sasl_mechanism=mechanism.upper() if mechanism else None,
            sasl_username=conf.get("sasl.username"),
            sasl_password=conf.get("sasl.password"),
        )
        if security.uses_sasl:
            if security.sasl_mechanism not in MECHANISMS:
                raise ClientConfigError(
                    f"sasl.mechanism must be one of {', '.join(MECHANISMS)} for {protocol}, "
                    f"got {security.sasl_mechanism or 'nothing'}"
                )
            if not security.sasl_username or security.sasl_password is None:
                raise ClientConfigError(f"{protocol} needs sasl.username and sasl.password")
        if security.key_location and not security.certificate_location:
            raise ClientConfigError("ssl.key.location needs ssl.certificate.location")
        return security

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context (TLS 1.2+); a missing or unreadable file is a ClientConfigError."""
        try:
            context = ssl.create_default_context(
                cafile=self.ca_location, cadata=self.ca_pem
            )  # system CAs when neither is given
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.check_hostname = self.check_hostname and self.verify
            if not self.verify:
                context.verify_mode = ssl.CERT_NONE
            if self.certificate_location:
                context.load_cert_chain(self.certificate_location, self.key_location, self.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ClientConfigError(f"cannot load the TLS settings: {exc}") from None
        return context

    def sasl_session(self) -> SaslSession:
        assert self.sasl_mechanism and self.sasl_username and self.sasl_password is not None
        return SaslSession(self.sasl_mechanism, self.sasl_username, self.sasl_password)
