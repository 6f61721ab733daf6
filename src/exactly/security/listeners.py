"""Named listeners (``listeners``, ``advertised.listeners``, ``listener.security.protocol.map``,
``inter.broker.listener.name``), parsed as Kafka parses them.

A listener is ``NAME://host:port``; its security protocol comes from the protocol map, or is the
name itself when the name is a protocol (``SASL_SSL://...`` needs no mapping). Every name is
unique, and every advertised name must be a listener. Per-listener settings are looked up as
Kafka does: ``listener.name.<lower-case name>.<key>`` first, then ``<key>``.

Invariant: a ``Listeners`` value holds at least one listener and every listener's protocol is
one of the four Kafka protocols."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class ListenerError(ValueError):
    """A listener setting Kafka would refuse at start-up."""


class SecurityProtocol(enum.Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One ``NAME://host:port`` entry with its protocol (host "" means all interfaces)."""

    name: str
    protocol: SecurityProtocol
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Listeners:
    """The broker's listeners (bind addresses) and what it advertises for each name."""

    bind: tuple[ListenerSpec, ...]
    advertised: tuple[ListenerSpec, ...]
    inter_broker: str

    def spec(self, name: str) -> ListenerSpec:
        for spec in self.bind:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def advertised_spec(self, name: str) -> ListenerSpec | None:
        for spec in self.advertised:
            if spec.name == name:
                return spec
        return None


def parse_protocol_map(text: str) -> dict[str, SecurityProtocol]:
    """``CLIENT:SASL_SSL,REPL:PLAINTEXT`` -> {name: protocol}; empty text gives an empty map."""
    out: dict[str, SecurityProtocol] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, proto = item.partition(":")
        if not sep or not name.strip():
            raise ListenerError(f"listener.security.protocol.map entry {item!r} is not NAME:PROTOCOL")
        try:
            out[name.strip().upper()] = SecurityProtocol(proto.strip().upper())
        except ValueError:
            raise ListenerError(f"unknown security protocol {proto.strip()!r} in {item!r}") from None
    return out


def _protocol(name: str, protocol_map: Mapping[str, SecurityProtocol]) -> SecurityProtocol:
    if name in protocol_map:
        return protocol_map[name]
    try:
        return SecurityProtocol(name)
    except ValueError:
        raise ListenerError(
            f"listener {name} has no security protocol: map it in listener.security.protocol.map"
        ) from None


def parse_listener_list(
    text: str, protocol_map: Mapping[str, SecurityProtocol], what: str = "listeners"
) -> tuple[ListenerSpec, ...]:
    """``NAME://host:port,...`` -> specs; a bare ``host:port`` (the pre-listener form) is a
    PLAINTEXT listener."""
    specs: list[ListenerSpec] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, address = item.partition("://")
        if not sep:
            name, address = "PLAINTEXT", item
        name = name.strip().upper()
        host, colon, port = address.rpartition(":")
        if not colon or not port.isdigit() or not name:
            raise ListenerError(f"{what} entry {item!r} is not NAME://HOST:PORT")
        if any(s.name == name for s in specs):
            raise ListenerError(f"{what} names listener {name} twice")
        specs.append(ListenerSpec(name, _protocol(name, protocol_map), host.strip("[]"), int(port)))
    if not specs:
        raise ListenerError(f"{what} is empty")
    return tuple(specs)


def parse_listeners(
    listeners: str,
    advertised: str,
    protocol_map_text: str,
    inter_broker_name: str,
    inter_broker_protocol: str,
) -> Listeners:
    """All four settings together, validated as Kafka's KafkaConfig validates them.

    ``inter.broker.listener.name`` (default: the listener named after
    ``security.inter.broker.protocol``, itself PLAINTEXT when empty) must name a listener; at
    most one of the two is set, as Kafka requires."""
    protocol_map = parse_protocol_map(protocol_map_text)
    bind = parse_listener_list(listeners, protocol_map)
    adv = (
        parse_listener_list(advertised, protocol_map, "advertised.listeners") if advertised.strip() else bind
    )
    names = {s.name for s in bind}
    for spec in adv:
        if spec.name not in names:
            raise ListenerError(f"advertised listener {spec.name} is not one of the listeners")
    if inter_broker_name.strip() and inter_broker_protocol.strip():
        raise ListenerError(
            "only one of inter.broker.listener.name and security.inter.broker.protocol may be set"
        )
    if inter_broker_name.strip():
        inter = inter_broker_name.strip().upper()
        if inter not in names:
            raise ListenerError(f"inter.broker.listener.name {inter} is not one of the listeners")
    else:
        try:
            wanted = SecurityProtocol(inter_broker_protocol.strip().upper() or "PLAINTEXT")
        except ValueError:
            raise ListenerError(f"unknown security.inter.broker.protocol {inter_broker_protocol!r}") from None
        inter = wanted.value  # may name no listener: only a cluster needs one (checked there)
    return Listeners(bind, adv, inter)


def listener_setting(values: Mapping[str, str], listener: str, key: str) -> str:
    """Kafka's per-listener override: ``listener.name.<name>.<key>`` wins over ``<key>``."""
    prefixed = f"listener.name.{listener.lower()}.{key}"
    if prefixed in values:
        return values[prefixed]
    return values.get(key, "")
