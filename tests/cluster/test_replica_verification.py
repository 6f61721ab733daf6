"""Replica verification over the wire: the debug replica id -2 reads any replica (leader or
follower) up to its own high watermark, and ``exactly cluster verify-replicas`` reports
identical replicas (exit 0), an unreadable replica and a replica whose bytes differ (exit 1)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId

from exactly.client.replica_verification import DEBUG_REPLICA_ID, verify_replicas
from exactly.records.batch import CRC_OFFSET, compute_crc, iter_batches
from exactly.testing.broker import child_env
from tests.cluster.helpers import await_replicas_identical, bootstrap, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, fetch_request

TOPIC = "verified"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"zookeeper.session.timeout.ms": "2500"})


def create_and_fill(brokers: list[Broker], count: int = 30) -> int:
    """A topic with RF 3 and ``count`` acks=all records (one per batch); -> the leader's id."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=3)])[TOPIC].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "acks": "all", "linger.ms": 0})
    for i in range(count):
        producer.produce(TOPIC, value=f"value-{i:04d}".encode(), partition=0)
        producer.flush(30)
    return int(admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly", "cluster", "verify-replicas", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )


def test_debug_replica_id_reads_a_follower_up_to_its_high_watermark(cluster: list[Broker]) -> None:
    leader = create_and_fill(cluster)
    await_replicas_identical(bootstrap(cluster), [TOPIC])
    follower = next(b for b in cluster if b.name != f"broker-{leader}")
    with WireClient(follower.bootstrap) as wire:
        consumer_read = fetch_request(TOPIC, 0, 0)
        (t,) = wire.send(consumer_read).responses
        assert int(t.partitions[0].error_code) == ErrorCode.not_leader_or_follower
        debug_read = fetch_request(TOPIC, 0, 0)
        debug_read = dataclasses.replace(debug_read, replica_id=BrokerId(DEBUG_REPLICA_ID))
        (t,) = wire.send(debug_read).responses
    (p,) = t.partitions
    assert int(p.error_code) == 0
    assert int(p.high_watermark) == 30
    assert [h.base_offset for h in iter_batches(bytes(p.records))] == list(range(30))


def test_verify_replicas_cli_reports_identical_replicas_and_an_unreachable_one(cluster: list[Broker]) -> None:
    create_and_fill(cluster)
    await_replicas_identical(bootstrap(cluster), [TOPIC])
    ok = cli("--bootstrap-server", bootstrap(cluster))
    assert ok.returncode == 0, ok.stderr
    assert f"{TOPIC}-0: 30 batches below offset 30 compared" in ok.stdout
    assert "max lag 0" in ok.stdout
    assert "1 partitions verified, 0 with differences" in ok.stdout
    cluster[2].kill()
    wait_for(
        lambda: (
            2 not in AdminClient({"bootstrap.servers": bootstrap(cluster)}).list_topics(timeout=5).brokers
        ),
        timeout=30,
        what="broker 2 to deregister",
    )
    down = cli("--bootstrap-server", bootstrap(cluster), "--topic", TOPIC)
    assert down.returncode == 1
    assert "unreachable: replica 2: broker not alive" in down.stdout


def test_verify_replicas_finds_a_replica_whose_bytes_differ(cluster: list[Broker]) -> None:
    """A follower's stored record is altered on disk (with a valid CRC, so recovery keeps it):
    offsets still match, bytes do not, and the verification names that replica and offset."""
    leader = create_and_fill(cluster)
    await_replicas_identical(bootstrap(cluster), [TOPIC])
    victim = next(b for b in cluster if b.name != f"broker-{leader}")
    victim_id = int(victim.name.split("-")[1])
    victim.stop()
    (segment,) = sorted(victim.partition_dir(TOPIC, 0).glob("*.log"))
    data = bytearray(segment.read_bytes())
    at = data.index(b"value-0017")
    data[at : at + 10] = b"VALUE-0017"
    (header,) = [h for h in iter_batches(data) if h.position <= at < h.position + h.size]
    data[header.position + CRC_OFFSET : header.position + CRC_OFFSET + 4] = compute_crc(
        data, header.position, header.size
    ).to_bytes(4, "big")
    segment.write_bytes(bytes(data))
    victim.start()
    wait_for(
        lambda: any(
            v.max_lag == 0 and len(v.high_watermarks) == 3 for v in verify_replicas(bootstrap(cluster))
        ),
        timeout=30,
        what="the altered follower to be back",
    )
    (verdict,) = verify_replicas(bootstrap(cluster), [TOPIC])
    (difference,) = verdict.differences
    assert (difference.broker_id, difference.offset) == (victim_id, 17)
    found = cli("--bootstrap-server", bootstrap(cluster))
    assert found.returncode == 1
    assert f"replica {victim_id} differs from {leader} at offset 17" in found.stdout
