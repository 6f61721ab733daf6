"""Kafka's znode formats: the JSON Kafka writes decodes here, and what we write is Kafka's shape."""

from __future__ import annotations

import json
import uuid

import pytest

from exactly.cluster import znodes as zn
from exactly.cluster.znodes import (
    BrokerRegistration,
    ControllerRegistration,
    Endpoint,
    LeaderAndIsr,
    ProducerIdBlock,
    TopicAssignment,
    ZnodeFormatError,
    decode_topic_id,
    encode_topic_id,
)


def test_broker_registration_v5_has_kafkas_fields() -> None:
    reg = BrokerRegistration(1, (Endpoint("PLAINTEXT", "127.0.0.1", 9093),), timestamp_ms=1700000000123)
    obj = json.loads(reg.encode())
    assert obj == {
        "version": 5,
        "host": "127.0.0.1",
        "port": 9093,
        "endpoints": ["PLAINTEXT://127.0.0.1:9093"],
        "jmx_port": -1,
        "timestamp": "1700000000123",  # a string, as Kafka writes it
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
        "features": {},
    }
    assert BrokerRegistration.decode(1, reg.encode()) == reg


def test_broker_registration_decodes_kafkas_own_znode_with_rack() -> None:
    kafka = (
        b'{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT","INT":"SSL"},'
        b'"endpoints":["PLAINTEXT://b1:9092","INT://b1:9094"],"jmx_port":-1,"port":9092,"host":"b1",'
        b'"version":5,"timestamp":"1609459200000","rack":"r1"}'
    )
    reg = BrokerRegistration.decode(3, kafka)
    assert reg.rack == "r1"
    assert reg.endpoints == (Endpoint("PLAINTEXT", "b1", 9092), Endpoint("INT", "b1", 9094, "SSL"))
    assert reg.timestamp_ms == 1609459200000


def test_broker_without_plaintext_listener_writes_null_host() -> None:
    reg = BrokerRegistration(1, (Endpoint("SECURE", "h", 9095, "SSL"),))
    obj = json.loads(reg.encode())
    assert obj["host"] is None and obj["port"] == -1


def test_controller_znode_version_2_and_version_1_readable() -> None:
    obj = json.loads(ControllerRegistration(2, 5).encode())
    assert obj == {"version": 2, "brokerid": 2, "timestamp": "5", "kraftControllerEpoch": -1}
    assert ControllerRegistration.decode(b'{"version":1,"brokerid":7,"timestamp":"1"}').broker_id == 7


def test_controller_epoch_is_a_plain_integer() -> None:
    assert zn.encode_controller_epoch(7) == b"7"
    assert zn.decode_controller_epoch(b"12") == 12
    with pytest.raises(ZnodeFormatError):
        zn.decode_controller_epoch(b'{"epoch":1}')


def test_topic_assignment_v3_roundtrip_and_kafka_shape() -> None:
    a = TopicAssignment({1: (2, 3), 0: (1, 2)}, topic_id="b8b-Ad3LQqCJ3a3M-WlW7w")
    assert json.loads(a.encode()) == {
        "version": 3,
        "partitions": {"0": [1, 2], "1": [2, 3]},
        "adding_replicas": {},
        "removing_replicas": {},
        "topic_id": "b8b-Ad3LQqCJ3a3M-WlW7w",
    }
    assert TopicAssignment.decode("t", a.encode()) == a
    # Kafka 2.x topics (version 1/2: no topic id, no reassignment maps) still decode
    old = TopicAssignment.decode("t", b'{"version":1,"partitions":{"0":[1]}}')
    assert old.partitions == {0: (1,)} and old.topic_id is None


def test_partition_state_shape_and_recovery_field_only_while_recovering() -> None:
    s = LeaderAndIsr(1, 4, (1, 2), 7)
    assert json.loads(s.encode()) == {
        "version": 1,
        "leader": 1,
        "leader_epoch": 4,
        "isr": [1, 2],
        "controller_epoch": 7,
    }
    recovering = LeaderAndIsr(1, 4, (1,), 7, zn.LEADER_RECOVERY_RECOVERING)
    assert json.loads(recovering.encode())["leader_recovery_state"] == 1
    assert LeaderAndIsr.decode(recovering.encode()) == recovering
    assert s.new_leader_and_isr(2, (2,), 8) == LeaderAndIsr(2, 5, (2,), 8)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"leader":1}',
        b'{"leader":1,"leader_epoch":0,"isr":[true],"controller_epoch":1}',
    ],
)
def test_malformed_partition_state_is_a_format_error(data: bytes) -> None:
    with pytest.raises(ZnodeFormatError):
        LeaderAndIsr.decode(data)


def test_producer_id_block_strings_and_empty_node() -> None:
    block = ProducerIdBlock(2, 1000, 1999)
    assert json.loads(block.encode()) == {
        "version": 1,
        "broker": 2,
        "block_start": "1000",
        "block_end": "1999",
    }
    assert ProducerIdBlock.decode(block.encode()) == block
    assert ProducerIdBlock.decode(b"") is None  # created empty at broker start-up


def test_next_block_starts_after_the_latest_and_refuses_overflow() -> None:
    assert zn.next_producer_id_block(None, 1) == ProducerIdBlock(1, 0, 999)
    assert zn.next_producer_id_block(ProducerIdBlock(3, 0, 999), 1) == ProducerIdBlock(1, 1000, 1999)
    with pytest.raises(ZnodeFormatError):
        zn.next_producer_id_block(ProducerIdBlock(3, 0, zn.MAX_PRODUCER_ID - 10), 1)


def test_topic_config_and_paths() -> None:
    assert json.loads(zn.encode_topic_config({"min.insync.replicas": "2"})) == {
        "version": 1,
        "config": {"min.insync.replicas": "2"},
    }
    assert zn.decode_topic_config(b"") == {}
    assert zn.partition_state_path("t", 3) == "/brokers/topics/t/partitions/3/state"
    assert zn.broker_path(5) == "/brokers/ids/5"
    assert zn.LATEST_PRODUCER_ID_BLOCK in zn.PERSISTENT_PATHS


def test_topic_ids_use_kafkas_base64url_form() -> None:
    topic_id = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    text = encode_topic_id(topic_id)
    assert "=" not in text and len(text) == 22
    assert decode_topic_id(text) == topic_id
    with pytest.raises(ZnodeFormatError):
        decode_topic_id("short")
