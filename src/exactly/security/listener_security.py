"""What one listener needs at run time besides its address: its protocol, its TLS context, its
SASL mechanisms and PLAIN accounts, and how certificate principals are mapped. Built once at
start-up from the broker's settings (Kafka's names, listener-prefixed values first); a setting
that cannot work fails the start, as Kafka's ChannelBuilders does.

Kafka's rule kept: on a SASL_SSL listener only a listener-prefixed ``ssl.client.auth`` counts;
the broker-wide value is ignored there (SASL gives the principal)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from exactly.security.listeners import ListenerSpec, SecurityProtocol, listener_setting
from exactly.security.plain import JaasError, plain_users
from exactly.security.principal import MappingRule, PrincipalMappingError, parse_rules
from exactly.security.sasl import PLAIN, SUPPORTED_MECHANISMS
from exactly.security.tls import server_context

log = logging.getLogger("exactly.security")


class ListenerSecurityError(ValueError):
    """A listener's security settings cannot work."""


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    spec: ListenerSpec
    ssl_context: ssl.SSLContext | None = None
    mechanisms: tuple[str, ...] = ()
    plain_users: Mapping[str, str] = field(default_factory=dict)
    principal_rules: tuple[MappingRule, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def protocol(self) -> SecurityProtocol:
        return self.spec.protocol


def build_listener_security(values: Mapping[str, str], spec: ListenerSpec) -> ListenerSecurity:
    name = spec.name

    def setting(key: str) -> str:
        return listener_setting(values, name, key)

    ctx = None
    rules: tuple[MappingRule, ...] = ()
    if spec.protocol.tls:
        client_auth = setting("ssl.client.auth") or "none"
        prefixed = f"listener.name.{name.lower()}.ssl.client.auth"
        if spec.protocol is SecurityProtocol.SASL_SSL and prefixed not in values:
            if client_auth.lower() != "none":
                log.warning(
                    "ssl.client.auth=%s ignored on SASL_SSL listener %s (set %s)", client_auth, name, prefixed
                )
            client_auth = "none"
        try:
            ctx = server_context(setting, client_auth)
            rules = parse_rules(setting("ssl.principal.mapping.rules"))
        except (ValueError, PrincipalMappingError) as exc:
            raise ListenerSecurityError(f"listener {name}: {exc}") from None
    mechanisms: tuple[str, ...] = ()
    users: dict[str, str] = {}
    if spec.protocol.sasl:
        mechanisms = tuple(
            m.strip().upper() for m in setting("sasl.enabled.mechanisms").split(",") if m.strip()
        )
        if not mechanisms:
            raise ListenerSecurityError(f"listener {name}: sasl.enabled.mechanisms is empty")
        unsupported = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
        if unsupported:
            raise ListenerSecurityError(
                f"listener {name}: SASL mechanism(s) {unsupported} not supported ({', '.join(SUPPORTED_MECHANISMS)})"
            )
        if PLAIN in mechanisms:
            jaas = values.get(f"listener.name.{name.lower()}.plain.sasl.jaas.config", "")
            if not jaas:
                raise ListenerSecurityError(
                    f'listener {name}: PLAIN needs listener.name.{name.lower()}.plain.sasl.jaas.config (PlainLoginModule with user_<name>="<password>" entries)'
                )
            try:
                users = plain_users(jaas)
            except JaasError as exc:
                raise ListenerSecurityError(f"listener {name}: {exc}") from None
    return ListenerSecurity(spec, ctx, mechanisms, users, rules)
