"""``--json`` of ``txn list|describe|find-hanging``, ``producers``, ``groups list|describe`` and
``topics describe``: one JSON document on stdout with the documented keys, against the real
broker with real transactional producers and a real consumer group."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.cli.test_ops_cli import exactly, ok, open_transaction, tid, txn_producer
from tests.support.broker import Broker
from tests.support.clients import create_topic, member_that_committed, produce_values

pytestmark = pytest.mark.timeout(180)


def doc(*args: str) -> Any:
    """Runs a command with --json; stdout must be exactly one JSON document."""
    return json.loads(ok(*args, "--json"))


def test_txn_list_and_describe_json(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic, partitions=2)
    t = tid("json")
    p = txn_producer(broker.bootstrap, t, **{"transaction.timeout.ms": 45_000})
    open_transaction(p, topic, [b"a"], partition=1)

    listed = doc("txn", "list", *bs)
    assert set(listed) == {"transactions"}
    (mine,) = [x for x in listed["transactions"] if x["transactional_id"] == t]
    assert mine["state"] == "Ongoing"
    assert set(mine) == {"transactional_id", "producer_id", "state"}
    assert isinstance(mine["producer_id"], int) and mine["producer_id"] >= 0

    (described,) = doc("txn", "describe", t, *bs)["transactions"]
    assert set(described) == {
        "transactional_id",
        "producer_id",
        "producer_epoch",
        "state",
        "timeout_ms",
        "start_time_ms",
        "duration_ms",
        "partitions",
    }
    assert described["producer_id"] == mine["producer_id"]
    assert (described["state"], described["producer_epoch"], described["timeout_ms"]) == (
        "Ongoing",
        0,
        45_000,
    )
    assert described["partitions"] == [{"topic": topic, "partition": 1}]
    assert abs(described["start_time_ms"] - time.time() * 1000) < 60_000
    assert described["duration_ms"] >= 0
    assert doc("txn", "find-hanging", "--max-age-ms", "0", *bs) == {"hanging": []}

    p.commit_transaction(30)
    (described,) = doc("txn", "describe", t, *bs)["transactions"]
    assert described["state"] == "CompleteCommit"
    assert described["duration_ms"] is None

    # a known and an unknown id: the document of what was found, then one error line, exit 1
    proc = exactly("txn", "describe", t, f"nope-{t}", "--json", *bs)
    assert proc.returncode == 1
    assert [x["transactional_id"] for x in json.loads(proc.stdout)["transactions"]] == [t]
    assert "transactional id(s) not found: nope-" in proc.stderr.decode()


def test_producers_json(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    assert doc("producers", topic, "0", *bs) == {"topic": topic, "partition": 0, "producers": []}
    produce_values(broker.bootstrap, topic, [b"x", b"y", b"z"])
    p = txn_producer(broker.bootstrap, tid("prod-json"))
    open_transaction(p, topic, [b"t1"])

    producers = doc("producers", topic, "0", *bs)["producers"]
    assert len(producers) == 2
    for entry in producers:
        assert set(entry) == {
            "producer_id",
            "producer_epoch",
            "last_sequence",
            "last_timestamp",
            "coordinator_epoch",
            "current_txn_start_offset",
        }
    idem, txn = sorted(producers, key=lambda e: e["current_txn_start_offset"] is not None)
    assert (idem["last_sequence"], idem["current_txn_start_offset"]) == (2, None)
    assert txn["current_txn_start_offset"] == 3
    p.commit_transaction(30)
    after = {e["producer_id"]: e for e in doc("producers", topic, "0", *bs)["producers"]}
    assert after[txn["producer_id"]]["current_txn_start_offset"] is None
    assert isinstance(after[txn["producer_id"]]["coordinator_epoch"], int)


def test_groups_json(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [f"v{i}".encode() for i in range(5)])
    group = tid("group-json")
    with member_that_committed(broker.bootstrap, topic, group, "json-test-client") as c:  # committed offset 3
        listed = doc("groups", "list", *bs)
        assert {"group_id": group, "state": "Stable"} in listed["groups"]

        described = doc("groups", "describe", group, *bs)
        assert set(described) == {"group_id", "state", "assignor", "coordinator", "members", "offsets"}
        assert (described["group_id"], described["state"], described["assignor"]) == (
            group,
            "Stable",
            "range",
        )
        assert isinstance(described["coordinator"], int)
        (member,) = described["members"]
        assert member["member_id"] == c.memberid()
        assert member["client_id"] == "json-test-client"
        assert member["partitions"] == [{"topic": topic, "partition": 0}]
        assert described["offsets"] == [
            {
                "topic": topic,
                "partition": 0,
                "committed_offset": 3,
                "log_end_offset": 5,
                "lag": 2,
                "member_id": c.memberid(),
            }
        ]


def test_topics_describe_json(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    ok("topics", "create", topic, "--partitions", "2", "--config", "cleanup.policy=compact", *bs)
    plain = f"{topic}-plain"
    ok("topics", "create", plain, *bs)

    (one,) = doc("topics", "describe", topic, *bs)["topics"]
    assert set(one) == {"name", "partition_count", "replication_factor", "configs", "compacted", "partitions"}
    assert (one["name"], one["partition_count"], one["replication_factor"]) == (topic, 2, 1)
    assert one["configs"] == {"cleanup.policy": "compact"}
    assert one["compacted"] is True
    assert [p["partition"] for p in one["partitions"]] == [0, 1]
    for p in one["partitions"]:
        assert set(p) == {"partition", "leader", "replicas", "isr", "dirty_ratio"}
        assert p["replicas"] == [p["leader"]] == p["isr"]
        assert p["dirty_ratio"] is None or 0.0 <= p["dirty_ratio"] <= 1.0

    every = {t["name"]: t for t in doc("topics", "describe", *bs)["topics"]}
    assert {topic, plain} <= set(every)
    assert every[plain]["compacted"] is False
    assert every[plain]["configs"] == {}
    assert all(p["dirty_ratio"] is None for p in every[plain]["partitions"])
