"""Consumer groups with kafka-python 3.0 (KafkaConsumer group_id, KafkaAdminClient group APIs)."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.support.broker import Broker
from tests.support.clients import create_topic, produce_values

pytestmark = pytest.mark.timeout(60)


def group_consumer(bootstrap: str, group_id: str, *topics: str) -> KafkaConsumer:
    c = KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=300,
        request_timeout_ms=15_000,
    )
    # kafka-python joins without waiting for the topic's metadata; with the broker's
    # group.initial.rebalance.delay.ms=0 the leader can assign before that metadata arrives
    # ("No partition metadata for topic": an empty assignment), and kafka-python may then miss
    # the rebalance it owes (its KAFKA-3949 race; once in ~4 full suite runs here). Kafka's 3 s
    # default delay hides it; fetching the metadata first removes it.
    for topic in topics:
        assert c.partitions_for_topic(topic), f"no metadata for {topic}"
    return c


def read(c: KafkaConsumer, n: int, timeout: float = 20) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for records in c.poll(timeout_ms=200).values():
            got.extend((r.partition, r.offset, r.value) for r in records)
    return got


def test_subscribe_consume_commit_resume(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=2)
    for p in (0, 1):
        produce_values(gb.bootstrap, topic, [f"p{p}-{i}".encode() for i in range(8)], partition=p)

    c = group_consumer(gb.bootstrap, group, topic)
    start = time.monotonic()
    try:
        first = read(c, 16)
        print(f"kafka-python: 16 records via the group after {(time.monotonic() - start) * 1000:.0f} ms")
        assert sorted((p, o) for p, o, _ in first) == [(p, o) for p in (0, 1) for o in range(8)]
        assert {tp.partition for tp in c.assignment()} == {0, 1}
        c.commit(
            {
                TopicPartition(topic, 0): OffsetAndMetadata(3, "meta-0", -1),
                TopicPartition(topic, 1): OffsetAndMetadata(8, "", -1),
            }
        )
        assert c.committed(TopicPartition(topic, 0)) == 3
        assert c.committed(TopicPartition(topic, 0), metadata=True).metadata == "meta-0"
    finally:
        c.close()

    c = group_consumer(gb.bootstrap, group, topic)
    try:
        resumed = read(c, 5)
        assert sorted((p, o) for p, o, _ in resumed) == [(0, o) for o in range(3, 8)]
        c.commit()  # the consumed positions
        assert c.committed(TopicPartition(topic, 0)) == 8
        assert c.committed(TopicPartition(topic, 1)) == 8
    finally:
        c.close()


def test_admin_group_apis(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=1)
    produce_values(gb.bootstrap, topic, [b"a", b"b"], partition=0)
    a = KafkaAdminClient(bootstrap_servers=gb.bootstrap, request_timeout_ms=15000)
    c = group_consumer(gb.bootstrap, group, topic)
    unknown = group + "-unknown"
    try:
        assert len(read(c, 2)) == 2
        c.commit()
        listed = {g["group_id"]: g for g in a.list_groups()}
        assert listed[group]["protocol_type"] == "consumer"
        assert listed[group]["group_state"] == "Stable"
        assert group in {g["group_id"] for g in a.list_groups(states_filter=["Stable"])}
        assert group not in {g["group_id"] for g in a.list_groups(states_filter=["Empty"])}

        desc = a.describe_groups([group])[group]
        assert desc["error"] is None
        assert (desc["group_state"], desc["protocol_type"], desc["protocol_data"]) == (
            "Stable",
            "consumer",
            "range",
        )
        (member,) = desc["members"]
        assert member["client_host"] == "/127.0.0.1"
        assert member["member_assignment"]["assigned_partitions"] == [{"topic": topic, "partitions": [0]}]

        offsets = a.list_group_offsets({group: None, unknown: None})
        assert {tp: om.offset for tp, om in offsets[group].items()} == {TopicPartition(topic, 0): 2}
        assert offsets[unknown] == {}  # OffsetFetch of an unknown group: no offsets, no error
    finally:
        c.close()
    desc = a.describe_groups([group])[group]
    assert (desc["group_state"], desc["members"]) == ("Empty", [])
    assert a.delete_groups([group]) == {group: "OK"}
    assert a.delete_groups([group]) == {group: "GroupIdNotFoundError"}
    assert group not in {g["group_id"] for g in a.list_groups()}
    assert a.list_group_offsets({group: None}) == {group: {}}
    a.close()
