"""The Prometheus endpoint (``metrics.port`` / ``exactly serve --metrics-port``) of a real broker."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families
from tests.support.broker import Broker, child_env, serve_command
from tests.support.clients import create_topic, produce_values
from tests.support.wire import WireClient, fetch_request, raw_request
from tests.support.wire import create_topic as wire_create_topic

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_url(broker: Broker) -> str:
    address = (broker.data_dir / "metrics-address").read_text().strip()
    host, _, port = address.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0, address
    return f"http://{address}/metrics"


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def partition_labels(topic: str, partition: int = 0) -> dict[str, str]:
    return {"topic": topic, "partition": str(partition)}


@pytest.fixture
def metrics_broker(fresh_broker: Callable[..., Broker]) -> Broker:
    return fresh_broker(**{"metrics.port": "0"})


def test_last_stable_offset_lag_follows_an_open_transaction(metrics_broker: Broker, topic: str) -> None:
    bs = metrics_broker.bootstrap
    url = metrics_url(metrics_broker)
    create_topic(bs, topic)
    produce_values(bs, topic, [b"plain-1", b"plain-2"])
    labels = partition_labels(topic)

    before = scrape(url)
    assert value(before, "exactly_partition_log_end_offset", **labels) == 2
    assert value(before, "exactly_partition_high_watermark", **labels) == 2
    assert value(before, "exactly_partition_last_stable_offset_lag", **labels) == 0
    assert value(before, "exactly_ongoing_producer_transactions", **labels) == 0
    assert value(before, "exactly_open_transactions") == 0

    p = Producer(
        {"bootstrap.servers": bs, "transactional.id": f"prom-{uuid.uuid4().hex[:8]}", "log_level": 0}
    )
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=f"txn-{i}".encode(), partition=0)
    assert p.flush(30) == 0

    during = scrape(url)
    assert value(during, "exactly_partition_log_end_offset", **labels) == 5
    assert value(during, "exactly_partition_high_watermark", **labels) == 5
    assert value(during, "exactly_partition_last_stable_offset_lag", **labels) == 3  # HW 5 - LSO 2
    assert value(during, "exactly_ongoing_producer_transactions", **labels) == 1
    assert value(during, "exactly_open_transactions") == 1

    p.commit_transaction(30)
    after = scrape(url)
    assert value(after, "exactly_partition_log_end_offset", **labels) == 6  # + COMMIT marker
    assert value(after, "exactly_partition_last_stable_offset_lag", **labels) == 0
    assert value(after, "exactly_ongoing_producer_transactions", **labels) == 0
    assert value(after, "exactly_open_transactions") == 0

    produce = value(after, "exactly_requests_total", api="Produce") or 0
    assert produce >= 2
    assert (value(after, "exactly_requests_total", api="EndTxn") or 0) >= 1
    assert (value(after, "exactly_bytes_in_total") or 0) > (value(before, "exactly_bytes_in_total") or 0)
    assert (value(after, "exactly_bytes_out_total") or 0) > (value(before, "exactly_bytes_out_total") or 0)
    assert value(after, "exactly_duplicate_batches_total") == 0
    assert (value(after, "exactly_messages_in_total") or 0) >= 5


def test_a_single_broker_is_its_own_controller_with_nothing_to_replicate(
    metrics_broker: Broker, topic: str
) -> None:
    """Kafka's replication series exist on a single broker too: it is the active controller, and
    an RF 1 partition is neither under-replicated nor offline."""
    create_topic(metrics_broker.bootstrap, topic)
    samples = scrape(metrics_url(metrics_broker))
    assert value(samples, "exactly_active_controller_count") == 1
    assert value(samples, "exactly_under_replicated_partitions") == 0
    assert value(samples, "exactly_offline_partitions_count") == 0
    assert value(samples, "exactly_partition_under_replicated", **partition_labels(topic)) == 0
    for counter in ("isr_shrinks", "isr_expands", "leader_elections", "unclean_leader_elections"):
        assert value(samples, f"exactly_{counter}_total") == 0, counter


def test_error_counts_after_bad_requests(metrics_broker: Broker, topic: str) -> None:
    url = metrics_url(metrics_broker)
    before = scrape(url)
    assert not [k for k in before if k[0] == "exactly_errors_total"]

    with WireClient(metrics_broker.bootstrap) as client:
        result = wire_create_topic(client, "bad name!")  # illegal characters
        assert result.error_code == 17  # INVALID_TOPIC_EXCEPTION
        assert wire_create_topic(client, topic).error_code == 0
        assert wire_create_topic(client, topic).error_code == 36  # TOPIC_ALREADY_EXISTS
        (t,) = client.send(fetch_request(topic, 0, 1000)).responses
        assert t.partitions[0].error_code == 1  # OFFSET_OUT_OF_RANGE
    with WireClient(metrics_broker.bootstrap) as client:
        client.send_frame(raw_request(18, 99, 7))  # ApiVersions v99: answered with v0 + error 35
        assert client.recv_frame()

    after = scrape(url)
    errors = {
        dict(k[1])["api"] + "/" + dict(k[1])["error"]: v
        for k, v in after.items()
        if k[0] == "exactly_errors_total"
    }
    assert errors.get("CreateTopics/INVALID_TOPIC_EXCEPTION") == 1, errors
    assert errors.get("CreateTopics/TOPIC_ALREADY_EXISTS") == 1, errors
    assert errors.get("Fetch/OFFSET_OUT_OF_RANGE") == 1, errors
    assert errors.get("ApiVersions/UNSUPPORTED_VERSION") == 1, errors
    assert (value(after, "exactly_requests_total", api="CreateTopics") or 0) == 3
    assert (value(after, "exactly_requests_total", api="ApiVersions") or 0) >= 1


def test_other_paths_and_methods(metrics_broker: Broker) -> None:
    url = metrics_url(metrics_broker)
    base = url.rsplit("/", 1)[0]
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(base + "/nothing", timeout=10)
    assert info.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
    assert info.value.code == 405
    samples = scrape(url)
    assert (value(samples, "process_resident_memory_bytes") or 0) > 0
    # OpenMetrics on request
    req = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert response.read().decode().rstrip().endswith("# EOF")


def test_metrics_off_by_default(fresh_broker: Callable[..., Broker]) -> None:
    b = fresh_broker()
    assert not (b.data_dir / "metrics-address").exists()
    assert "metrics on http" not in b.log_text()


def test_serve_metrics_port_flag(tmp_path: Path) -> None:
    b = Broker(tmp_path / "data", tmp_path / "broker.log", extra_args=("--metrics-port", "0"), name="flag")
    try:
        b.start()
        url = metrics_url(b)
        assert f"metrics on {url}" in b.log_text()
        assert value(scrape(url), "exactly_open_transactions") == 0
        b.stop()
        # a clean restart without the flag removes the stale address file
        b.extra_args = ()
        b.start()
        assert not (b.data_dir / "metrics-address").exists()
    finally:
        b.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "70000"], "metrics.port must be between 0 and 65535"),
        (["-o", "metrics.port=abc"], "metrics.port must be a port number"),
    ],
)
def test_bad_metrics_port_is_refused(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run(
        serve_command(tmp_path / "data", extra_args=args),
        capture_output=True,
        timeout=30,
        env=child_env(),
    )
    assert proc.returncode == 2, proc.stderr.decode()
    assert message in proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
