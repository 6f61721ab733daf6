"""The orders pipeline over SASL_SSL: the source and the sink take the Spark Kafka connector's
``kafka.security.protocol`` / ``kafka.sasl.*`` / ``kafka.ssl.*`` options (here the Java client's
``sasl.jaas.config`` form, as a Spark Kafka user writes it) and run exactly once against a broker
whose Spark-facing listener needs SCRAM-SHA-512 over TLS. Topics are made, orders generated and the
outputs verified over the broker's PLAINTEXT listener."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.spark.pipeline import JobConfig, run
from tests.support.broker import Broker
from tests.support.certs import TestPki
from tests.support.metrics import metrics_url
from tests.support.security import ALICE_PW, add_alice
from tests.support.security_fixtures import (  # noqa: F401  (fixtures: pki, module_broker_config)
    pki_fixture,
    secured_broker_config_fixture,
)

pytestmark = pytest.mark.timeout(300)


def successful_sasl_ssl_logins(broker: Broker) -> float:
    text = urllib.request.urlopen(metrics_url(broker), timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("exactly_successful_authentication_total{") and 'listener="SASL_SSL"' in line
    )


def test_orders_pipeline_runs_exactly_once_over_sasl_ssl_scram(
    spark: Any, module_broker: Broker, pki: TestPki, tmp_path: Path
) -> None:
    add_alice(module_broker)
    plain = module_broker.listener_address("PLAINTEXT")
    topics = Topics.with_prefix(f"sec{uuid.uuid4().hex[:8]}-")
    create_topics(plain, topics, partitions=2)
    made = generate(plain, topics, 600, txn_size=100, abort_every=3, seed=7)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="alice" password="{ALICE_PW}";'
    )
    config = JobConfig(
        bootstrap=module_broker.listener_address("SASL_SSL"),
        checkpoint=str(tmp_path / "ckpt"),
        topics=topics,
        max_offsets_per_trigger=400,
        kafka_options=(
            ("kafka.security.protocol", "SASL_SSL"),
            ("kafka.sasl.mechanism", "SCRAM-SHA-512"),
            ("kafka.sasl.jaas.config", jaas),
            ("kafka.ssl.truststore.type", "PEM"),
            ("kafka.ssl.truststore.location", str(pki.ca)),
        ),
    )
    before = successful_sasl_ssl_logins(module_broker)
    summary = run(spark, config, on_progress=None)
    assert summary["finished"] and summary["orders"] == 600
    assert successful_sasl_ssl_logins(module_broker) > before  # the job really logged in over SASL_SSL
    report = verify(plain, topics)
    assert report.ok, report.summary()
    assert report.truth_cents["total"] == sum(made.cents.values())
