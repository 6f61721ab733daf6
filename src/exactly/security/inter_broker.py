"""What a broker presents when it connects to another broker (replica fetchers, transaction
markers, KIP-890 verification): the inter-broker listener's security protocol, its TLS client
settings and, on a SASL listener, the mechanism and the broker's own credentials. Read once at
start-up from Kafka's names, so a Kafka ``server.properties`` carries over:

=================================================  =============================================
``inter.broker.listener.name``                     the listener the brokers reach each other on,
or ``security.inter.broker.protocol``              or the protocol whose listener it is (one of
                                                   the two, as Kafka requires)
``sasl.mechanism.inter.broker.protocol``           PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; it must
                                                   be one of the listener's
                                                   ``sasl.enabled.mechanisms``
``listener.name.<l>.<mechanism>.sasl.jaas.config`` the broker's ``username``/``password``
(else ``sasl.jaas.config``)                        (Plain/ScramLoginModule options)
``ssl.*`` (listener-prefixed first)                truststore (the peer's CA), keystore (sent as
                                                   the client certificate), protocols, ciphers,
                                                   ``ssl.endpoint.identification.algorithm``
=================================================  =============================================

Kafka has no default mechanism it could use here (its default, GSSAPI, is not supported), so a
SASL inter-broker listener without a mechanism or credentials is refused at start-up, as is a
JAAS entry of the wrong login module. Deliberate difference: the un-prefixed ``sasl.jaas.config``
is accepted as the last fallback (Kafka's brokers read the static JAAS file's KafkaServer section
there instead, which exactly does not have). No I/O here: ``exactly.server.inter_broker`` builds
the TLS context and drives the SASL exchange."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exactly.security.listeners import ListenerSpec, SecurityProtocol, listener_setting
from exactly.security.plain import PLAIN_LOGIN_MODULE, JaasError, parse_jaas_options
from exactly.security.sasl import PLAIN, SUPPORTED_MECHANISMS

SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
MECHANISM_KEY = "sasl.mechanism.inter.broker.protocol"

#: the ssl.* settings the client side of a TLS listener reads (listener-prefixed values first)
TLS_CLIENT_KEYS = (
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.key.password",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.truststore.certificates",
    "ssl.enabled.protocols",
    "ssl.cipher.suites",
    "ssl.endpoint.identification.algorithm",
)


class InterBrokerConfigError(ValueError):
    """Inter-broker security settings that cannot work; one line for the operator."""


@dataclass(frozen=True, slots=True)
class InterBrokerSecurity:
    """Invariant: ``mechanism``, ``username`` and ``password`` are set exactly when the protocol
    is SASL; ``tls`` holds the listener's client-side ``ssl.*`` values when it is TLS."""

    listener: str
    protocol: SecurityProtocol
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: Mapping[str, str] = field(default_factory=dict)

    def tls_setting(self, key: str) -> str:
        return self.tls.get(key, "")

    def describe(self) -> str:
        """For log lines: listener, protocol and who the broker authenticates as (no secret)."""
        who = f", {self.mechanism} as User:{self.username}" if self.protocol.sasl else ""
        return f"{self.listener} ({self.protocol.value}{who})"


def _login_module(mechanism: str) -> str:
    return PLAIN_LOGIN_MODULE if mechanism == PLAIN else SCRAM_LOGIN_MODULE


def _credentials(values: Mapping[str, str], listener: str, mechanism: str) -> tuple[str, str]:
    prefixed = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
    jaas = values.get(prefixed, "").strip() or values.get("sasl.jaas.config", "").strip()
    module = _login_module(mechanism)
    if not jaas:
        raise InterBrokerConfigError(
            f"inter-broker listener {listener} uses SASL {mechanism}: the broker's credentials are "
            f'missing; set {prefixed} (or sasl.jaas.config) to {module} required username="..." password="...";'
        )
    try:
        found, options = parse_jaas_options(jaas)
    except JaasError as exc:
        raise InterBrokerConfigError(f"inter-broker listener {listener}: {exc}") from None
    if found != module:
        raise InterBrokerConfigError(
            f"inter-broker listener {listener}: {mechanism} needs {module} in its sasl.jaas.config, got {found}"
        )
    username, password = options.get("username", ""), options.get("password")
    if not username or password is None:
        raise InterBrokerConfigError(
            f"inter-broker listener {listener}: the {mechanism} sasl.jaas.config needs username and "
            "password options (what the broker authenticates to the other brokers with)"
        )
    return username, password


def inter_broker_security(values: Mapping[str, str], spec: ListenerSpec) -> InterBrokerSecurity:
    """The client side of the inter-broker listener ``spec``; InterBrokerConfigError when a
    setting it needs is missing or unusable."""
    name, protocol = spec.name, spec.protocol
    mechanism = username = password = None
    if protocol.sasl:
        mechanism = values.get(MECHANISM_KEY, "").strip().upper()
        if not mechanism:
            raise InterBrokerConfigError(
                f"inter-broker listener {name} uses {protocol.value}: set {MECHANISM_KEY} "
                f"({', '.join(SUPPORTED_MECHANISMS)}) and the broker's credentials"
            )
        if mechanism not in SUPPORTED_MECHANISMS:
            raise InterBrokerConfigError(
                f"{MECHANISM_KEY}={mechanism} is not supported ({', '.join(SUPPORTED_MECHANISMS)})"
            )
        enabled = {
            m.strip().upper() for m in listener_setting(values, name, "sasl.enabled.mechanisms").split(",")
        }
        if mechanism not in enabled:
            raise InterBrokerConfigError(
                f"{MECHANISM_KEY}={mechanism} must be one of listener {name}'s sasl.enabled.mechanisms"
            )
        username, password = _credentials(values, name, mechanism)
    tls = {key: listener_setting(values, name, key) for key in TLS_CLIENT_KEYS} if protocol.tls else {}
    return InterBrokerSecurity(name, protocol, mechanism, username, password, tls)
