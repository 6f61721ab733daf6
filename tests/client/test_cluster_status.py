"""``exactly.client.cluster_status``: classifying a Metadata answer and rendering it."""

from __future__ import annotations

from exactly.client.cluster_status import (
    BrokerInfo,
    RawPartition,
    coordinator_of,
    render,
    summarize,
)
from exactly.coordinator.txn.log import offsets_partition_for, partition_for

BROKERS = [BrokerInfo(2, "h", 9094), BrokerInfo(0, "h", 9092)]  # broker 1 is dead


def raw(
    topic: str, partition: int, leader: int, replicas: tuple[int, ...], isr: tuple[int, ...]
) -> RawPartition:
    offline = tuple(r for r in replicas if r not in (0, 2))
    return RawPartition(topic, partition, leader, 5, replicas, isr, offline)


PARTITIONS = [
    raw("t", 1, 0, (0, 1, 2), (0, 2)),  # under-replicated
    raw("t", 0, 2, (2, 0), (2, 0)),  # fine
    raw("one", 0, -1, (1,), (1,)),  # offline: no leader
    raw("stale", 0, 1, (1, 0), (1, 0)),  # offline: its leader is not alive (not seen dead yet)
    raw("__consumer_offsets", 0, 0, (0, 1, 2), (0, 1, 2)),  # isr still names 1: not under-replicated
    raw("__consumer_offsets", 1, 0, (0, 2), (0, 2)),
    raw("__consumer_offsets", 2, -1, (1,), (1,)),
    raw("__transaction_state", 0, 2, (2, 0), (2,)),
]


def test_offline_and_under_replicated_are_disjoint_and_counted() -> None:
    status = summarize("cid", 2, BROKERS, PARTITIONS, "h:9092")
    assert [b.broker_id for b in status.brokers] == [0, 2]
    assert [(p.topic, p.partition) for p in status.partitions][:2] == [
        ("__consumer_offsets", 0),
        ("__consumer_offsets", 1),
    ]
    assert {(p.topic, p.partition) for p in status.offline} == {
        ("one", 0),
        ("stale", 0),
        ("__consumer_offsets", 2),
    }
    assert {(p.topic, p.partition) for p in status.under_replicated} == {("t", 1), ("__transaction_state", 0)}
    assert status.missing_brokers == (1,)


def test_coordinators_are_the_internal_partitions_leaders() -> None:
    status = summarize("cid", 2, BROKERS, PARTITIONS)
    assert status.coordinators() == {"group": {0: 0, 1: 0, 2: -1}, "transaction": {0: 2}}
    group = "some-group"
    partition = offsets_partition_for(group, 3)
    assert coordinator_of(status, "group", group) == (partition, {0: 0, 1: 0, 2: -1}[partition])
    assert coordinator_of(status, "transaction", "tid") == (partition_for("tid", 1), 2)
    empty = summarize("cid", 0, BROKERS, [raw("t", 0, 0, (0,), (0,))])
    assert coordinator_of(empty, "group", group) is None


def test_render_marks_problems_and_summarises() -> None:
    text = render(summarize("cid", 2, BROKERS, PARTITIONS, "h:9092"))
    lines = text.splitlines()
    assert lines[0].startswith("cluster id: cid")
    assert "controller: 2" in lines
    assert any(line.strip() == "2  h:9094  (controller)" for line in lines)
    assert any("NOT ALIVE" in line and line.strip().startswith("1") for line in lines)
    row = next(line for line in lines if line.startswith("t ") and " 1 " in line)
    assert row.split() == ["t", "1", "0", "5", "0,1,2", "0,2", "UNDER-REPLICATED", "(out", "of", "ISR:", "1)"]
    assert next(line for line in lines if line.startswith("one")).endswith("OFFLINE")
    assert "partitions: 8, under-replicated: 2, offline: 3" in lines
    assert "group coordinators (__consumer_offsets partitions): broker -1" not in text
    assert "group coordinators (__consumer_offsets partitions): NONE (offline): 2; broker 0: 0-1" in lines
    assert "transaction coordinators (__transaction_state partitions): broker 2: 0" in lines
    assert "\x1b[" not in text
    assert "\x1b[1;31m" in render(summarize("cid", 2, BROKERS, PARTITIONS), color=True)


def test_render_problems_only_and_no_controller() -> None:
    text = render(summarize(None, -1, BROKERS, PARTITIONS), problems_only=True)
    assert "controller: none" in text
    table = text.split("\n\n")[1].splitlines()
    assert table[0].split() == ["TOPIC", "PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "STATUS"]
    shown = {(row.split()[0], int(row.split()[1])) for row in table[1:]}
    assert shown == {
        ("__consumer_offsets", 2),
        ("__transaction_state", 0),
        ("one", 0),
        ("stale", 0),
        ("t", 1),
    }
    # the counts still cover every partition
    assert "partitions: 8, under-replicated: 2, offline: 3" in text


def test_json_document() -> None:
    doc = summarize("cid", 2, BROKERS, PARTITIONS, "h:9092").to_json()
    assert doc["controller"] == 2 and doc["missing_brokers"] == [1]
    assert doc["under_replicated_count"] == 2 and doc["offline_count"] == 3
    assert doc["coordinators"] == {"group": {"0": 0, "1": 0, "2": -1}, "transaction": {"0": 2}}
    first = doc["partitions"][0]
    assert first == {
        "topic": "__consumer_offsets",
        "partition": 0,
        "leader": 0,
        "leader_epoch": 5,
        "replicas": [0, 1, 2],
        "isr": [0, 1, 2],
        "offline_replicas": [1],
        "under_replicated": False,
        "offline": False,
    }
