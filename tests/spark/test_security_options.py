"""The data source passes security options to librdkafka (no Spark session needed)."""

from __future__ import annotations

import pytest

from exactly.spark.options import OptionError, client_config, parse_sink_options, parse_source_options

SCRAM = {
    "kafka.bootstrap.servers": "127.0.0.1:9094",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.username": "alice",
    "kafka.sasl.password": "pw",
    "kafka.ssl.ca.location": "/ca.pem",
    "kafka.ssl.certificate.location": "/c.pem",
    "kafka.ssl.key.location": "/c.key",
}


def test_security_options_reach_source_and_sink_clients() -> None:
    source = parse_source_options({**SCRAM, "subscribe": "t"}, streaming=False)
    sink = parse_sink_options({**SCRAM, "topic": "t", "checkpointLocation": "/tmp/x"})
    for conf in (source.client, sink.client, client_config(SCRAM)):
        for key, value in SCRAM.items():
            assert conf[key[len("kafka.") :]] == value


def test_java_jaas_and_pem_truststore_are_translated() -> None:
    conf = client_config(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="p w";',
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": "/ca.pem",
        }
    )
    assert conf["sasl.username"] == "alice" and conf["sasl.password"] == "p w"
    assert conf["ssl.ca.location"] == "/ca.pem"
    assert "sasl.jaas.config" not in conf and "ssl.truststore.location" not in conf


@pytest.mark.parametrize(
    "extra",
    [
        {"kafka.sasl.jaas.config": "not jaas"},
        {"kafka.sasl.jaas.config": "com.example.Krb5LoginModule required;"},
        {"kafka.ssl.truststore.location": "/store.jks"},
    ],
)
def test_untranslatable_java_options_are_refused(extra: dict[str, str]) -> None:
    with pytest.raises(OptionError):
        client_config({"kafka.bootstrap.servers": "h:1", **extra})
