"""listeners / advertised.listeners / listener.security.protocol.map parsing."""

from __future__ import annotations

import pytest

from exactly.security.listeners import ListenerError, SecurityProtocol, listener_setting, parse_listeners


def test_names_protocols_and_advertised_defaults() -> None:
    parsed = parse_listeners(
        "PLAINTEXT://127.0.0.1:9092,CLIENT://0.0.0.0:9094", "", "CLIENT:SASL_SSL", "", "PLAINTEXT"
    )
    assert [(s.name, s.protocol, s.host, s.port) for s in parsed.bind] == [
        ("PLAINTEXT", SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092),
        ("CLIENT", SecurityProtocol.SASL_SSL, "0.0.0.0", 9094),
    ]
    assert parsed.advertised == parsed.bind
    assert parsed.inter_broker == "PLAINTEXT"


def test_bare_host_port_is_plaintext_and_inter_broker_name_is_checked() -> None:
    parsed = parse_listeners("127.0.0.1:0", "", "", "", "PLAINTEXT")
    assert parsed.bind[0].name == "PLAINTEXT"
    with pytest.raises(ListenerError, match=r"inter\.broker\.listener\.name"):
        parse_listeners("PLAINTEXT://h:1", "", "", "REPL", "")
    with pytest.raises(ListenerError, match="only one of"):
        parse_listeners("PLAINTEXT://h:1,REPL://h:2", "", "REPL:SSL", "REPL", "SSL")
    by_protocol = parse_listeners("PLAINTEXT://h:1,SASL_SSL://h:2", "", "", "", "SASL_SSL")
    assert by_protocol.inter_broker == "SASL_SSL"
    assert parse_listeners("PLAINTEXT://h:1", "", "", "", "").inter_broker == "PLAINTEXT"


@pytest.mark.parametrize(
    ("listeners", "advertised", "protocol_map"),
    [
        ("CLIENT://h:1", "", ""),  # no protocol for CLIENT
        ("PLAINTEXT://h:1,PLAINTEXT://h:2", "", ""),  # a name twice
        ("PLAINTEXT://h:x", "", ""),
        ("", "", ""),
        ("PLAINTEXT://h:1", "SSL://h:2", ""),  # advertised name that is not a listener
        ("A://h:1", "", "A:TLS"),  # unknown protocol
    ],
)
def test_invalid_settings_are_refused(listeners: str, advertised: str, protocol_map: str) -> None:
    with pytest.raises(ListenerError):
        parse_listeners(listeners, advertised, protocol_map, "", "PLAINTEXT")


def test_listener_prefixed_setting_wins() -> None:
    values = {"ssl.client.auth": "none", "listener.name.client.ssl.client.auth": "required"}
    assert listener_setting(values, "CLIENT", "ssl.client.auth") == "required"
    assert listener_setting(values, "OTHER", "ssl.client.auth") == "none"
