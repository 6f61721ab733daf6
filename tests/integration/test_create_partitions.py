"""CreatePartitions (37) with confluent-kafka's and kafka-python's admin clients, kcat, the wire
(every version), a consumer group that is rebalanced onto the new partitions, and restarts."""

from __future__ import annotations

import datetime
import importlib
import json
import subprocess
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions  # type: ignore[attr-defined]
from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import (
    InvalidPartitionsError,
    InvalidReplicationAssignmentError,
    UnknownTopicOrPartitionError,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from tests.conftest import BrokerFactory
from tests.integration.test_groups_confluent import group_consumer, partitions_of
from tests.support.broker import Broker
from tests.support.clients import admin, consume, create_topic, produce_values
from tests.support.wire import WireClient

pytestmark = pytest.mark.timeout(90)


def add_partitions(
    client: AdminClient, topic: str, count: int, assignment: list[list[int]] | None = None, **kwargs: Any
) -> None:
    new = NewPartitions(topic, count) if assignment is None else NewPartitions(topic, count, assignment)
    futures = client.create_partitions([new], request_timeout=15, **kwargs)
    futures[topic].result(20)


def error_of(client: AdminClient, new: Any, **kwargs: Any) -> KafkaError:
    futures = client.create_partitions([new], request_timeout=15, **kwargs)
    with pytest.raises(KafkaException) as exc_info:
        futures[new.topic].result(20)
    err = exc_info.value.args[0]
    assert isinstance(err, KafkaError)
    return err


def partition_count(client: AdminClient, topic: str) -> int:
    md = client.list_topics(topic=topic, timeout=10)
    tmeta = md.topics[topic]
    assert tmeta.error is None, tmeta.error
    return len(tmeta.partitions)


# ---------------------------------------------------------------------------- confluent-kafka
def test_confluent_admin_adds_partitions_with_the_topic_config(broker: Broker, topic: str) -> None:
    create_topic(
        broker.bootstrap, topic, partitions=2, config={"segment.bytes": "1024", "retention.ms": "3600000"}
    )
    a = admin(broker.bootstrap)
    add_partitions(a, topic, 2 + 3, validate_only=True)
    assert partition_count(a, topic) == 2  # validate_only changes nothing

    add_partitions(a, topic, 5)
    md = a.list_topics(topic=topic, timeout=10).topics[topic]
    assert sorted(md.partitions) == [0, 1, 2, 3, 4]  # at once, in Metadata
    assert all(p.leader == p.replicas[0] == p.isrs[0] for p in md.partitions.values())

    # The new partitions take records and have the topic's config: 1 KiB segments roll.
    offsets = produce_values(
        broker.bootstrap, topic, [b"x" * 300 for _ in range(12)], partition=4, batch_num_messages=1
    )
    assert offsets == list(range(12))
    assert len(list(broker.partition_dir(topic, 4).glob("*.log"))) > 1
    got = consume(broker.bootstrap, topic, 12, partitions=(4,))
    assert [g.offset for g in got] == list(range(12))
    resource = ConfigResource("topic", topic)
    configs = a.describe_configs([resource])[resource].result(10)
    assert configs["segment.bytes"].value == "1024" and configs["retention.ms"].value == "3600000"


def test_confluent_admin_errors(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=3)
    a = admin(broker.bootstrap)
    for count in (3, 2):
        err = error_of(a, NewPartitions(topic, count))
        assert err.code() == KafkaError.INVALID_PARTITIONS, err
    assert "Topic already has 3 partitions" in error_of(a, NewPartitions(topic, 3)).str()
    err = error_of(a, NewPartitions(topic + "-nope", 4))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # validate_only gives the same answers
    err = error_of(a, NewPartitions(topic, 2), validate_only=True)
    assert err.code() == KafkaError.INVALID_PARTITIONS

    node = a.describe_cluster().result(10).nodes[0].id
    err = error_of(a, NewPartitions(topic, 5, [[node], [node + 1]]))
    assert err.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert f"Unknown broker(s) in replica assignment: {node + 1}." in err.str()
    err = error_of(a, NewPartitions(topic, 5, [[node], [node, node]]))
    assert err.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    a.describe_consumer_groups(["cp-any-group"])["cp-any-group"].result(20)  # creates the offsets topic
    err = error_of(a, NewPartitions("__consumer_offsets", 60))
    assert err.code() == KafkaError.POLICY_VIOLATION
    assert partition_count(a, topic) == 3

    add_partitions(a, topic, 5, [[node], [node]])  # valid manual assignment
    assert partition_count(a, topic) == 5
    # operation_timeout 0: Kafka answers REQUEST_TIMED_OUT (not waited for), librdkafka hides it
    add_partitions(a, topic, 6, operation_timeout=0)
    assert partition_count(a, topic) == 6


# ---------------------------------------------------------------------------- kafka-python
def test_kafka_python_admin_create_partitions(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        a.create_partitions({topic: 3}, validate_only=True)
        (desc,) = a.describe_topics([topic])
        assert len(desc["partitions"]) == 1
        a.create_partitions({topic: 3})
        (desc,) = a.describe_topics([topic])
        assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1, 2]
        with pytest.raises(InvalidPartitionsError):
            a.create_partitions({topic: 3})
        with pytest.raises(InvalidPartitionsError):
            a.create_partitions({topic: 2}, validate_only=True)
        with pytest.raises(UnknownTopicOrPartitionError):
            a.create_partitions({topic + "-nope": 2})
        with pytest.raises(InvalidReplicationAssignmentError):
            a.create_partitions({topic: {"count": 5, "assignments": [[0]]}})

        futures = [producer.send(topic, value=f"p2-{i}".encode(), partition=2) for i in range(5)]
        assert [f.get(timeout=15).offset for f in futures] == list(range(5))
    finally:
        producer.close()
        a.close()
    got = consume(broker.bootstrap, topic, 5, partitions=(2,))
    assert [g.value for g in got] == [f"p2-{i}".encode() for i in range(5)]


# ---------------------------------------------------------------------------- kcat
def _kcat(kcat: str, broker: Broker, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-m", "10", *args],
        input=stdin,
        capture_output=True,
        timeout=30,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()}"
    return proc.stdout


def test_kcat_lists_produces_to_and_consumes_new_partitions(kcat: str, broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    md = json.loads(_kcat(kcat, broker, "-L", "-J", "-t", topic))
    assert [p["partition"] for p in md["topics"][0]["partitions"]] == [0]
    add_partitions(admin(broker.bootstrap), topic, 3)

    md = json.loads(_kcat(kcat, broker, "-L", "-J", "-t", topic))
    (t,) = md["topics"]
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    _kcat(kcat, broker, "-P", "-t", topic, "-p", "2", stdin=b"".join(f"v{i}\n".encode() for i in range(10)))
    out = _kcat(kcat, broker, "-C", "-t", topic, "-p", "2", "-o", "beginning", "-e", "-f", "%p:%o:%s\n")
    assert out.decode().splitlines() == [f"2:{i}:v{i}" for i in range(10)]


# ---------------------------------------------------------------------------- the wire
def _request(version: int, topics: list[tuple[str, int, list[list[int]] | None]], **fields: Any) -> Any:
    mod = importlib.import_module(f"kio.schema.create_partitions.v{version}.request")
    return mod.CreatePartitionsRequest(
        topics=tuple(
            mod.CreatePartitionsTopic(
                name=name,
                count=i32(count),
                assignments=None
                if assignments is None
                else tuple(
                    mod.CreatePartitionsAssignment(broker_ids=tuple(i32(b) for b in a)) for a in assignments
                ),
            )
            for name, count, assignments in topics
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=fields.get("timeout_ms", 10_000))),
        validate_only=fields.get("validate_only", False),
    )


def _results(response: Any) -> dict[str, tuple[int, str | None]]:
    return {r.name: (int(r.error_code), r.error_message) for r in response.results}


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_wire_versions(broker: Broker, unique_name: Any, version: int) -> None:
    a, b = unique_name("cp-a"), unique_name("cp-b")
    create_topic(broker.bootstrap, a, partitions=1)
    create_topic(broker.bootstrap, b, partitions=2)
    with WireClient(broker.bootstrap) as c:
        resp = c.send(_request(version, [(a, 2, None), (b, 2, None), (a, 3, None)], validate_only=True))
        assert _results(resp) == {
            a: (ErrorCode.invalid_request, "Duplicate topic in request."),
            b: (ErrorCode.invalid_partitions, "Topic already has 2 partitions."),
        }
        resp = c.send(_request(version, [(a, 3, None), (b, 4, [[0], [0]])]))
        assert _results(resp) == {a: (ErrorCode.none, None), b: (ErrorCode.none, None)}
        resp = c.send(_request(version, [(b, 6, [[0]])]))
        assert _results(resp) == {
            b: (
                ErrorCode.invalid_replica_assignment,
                "Increasing the number of partitions by 2 but 1 assignments provided.",
            )
        }
        # timeout 0: created, but answered REQUEST_TIMED_OUT as Kafka does when it did not wait
        resp = c.send(_request(version, [(a, 4, None)], timeout_ms=0))
        assert _results(resp) == {a: (ErrorCode.request_timed_out, None)}
        resp = c.send(_request(version, [(a, 10**6, None)]))
        assert _results(resp)[a][0] == ErrorCode.policy_violation
    x = admin(broker.bootstrap)
    assert (partition_count(x, a), partition_count(x, b)) == (4, 4)
    assert "CreatePartitions for topic" in broker.log_text()  # refusals are logged


# ---------------------------------------------------------------------------- consumer groups
def test_subscribed_group_is_rebalanced_onto_new_partitions(gb: Broker, topic: str, group: str) -> None:
    """librdkafka notices the new partition count on its next metadata refresh, rejoins, and the
    group's assignment then covers the new partitions; records produced to them (before and after
    the rebalance) are consumed."""
    create_topic(gb.bootstrap, topic, partitions=1)
    produce_values(gb.bootstrap, topic, [b"old-0", b"old-1"], partition=0)
    conf = {"topic.metadata.refresh.interval.ms": 500}
    consumers = [group_consumer(gb.bootstrap, group, **conf) for _ in range(2)]
    try:
        for c in consumers:
            c.subscribe([topic])
        seen: dict[tuple[int, int], bytes | None] = {}

        def poll_until(done: Any, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while not done():
                assert time.monotonic() < deadline, f"not reached in {timeout}s; seen {sorted(seen)}"
                for c in consumers:
                    msg = c.poll(0.05)
                    if msg is not None:
                        assert msg.error() is None, msg.error()
                        seen[(int(msg.partition() or 0), int(msg.offset() or 0))] = msg.value()

        poll_until(lambda: len(seen) == 2, 30)
        assert sorted(partitions_of(consumers[0]) + partitions_of(consumers[1])) == [0]

        add_partitions(admin(gb.bootstrap), topic, 3)
        produce_values(gb.bootstrap, topic, [b"new-1"], partition=1)  # before the rebalance
        poll_until(lambda: sorted(partitions_of(consumers[0]) + partitions_of(consumers[1])) == [0, 1, 2], 30)
        assert all(partitions_of(c) for c in consumers)  # both members have partitions again
        produce_values(gb.bootstrap, topic, [b"new-2"], partition=2)  # after it
        produce_values(gb.bootstrap, topic, [b"old-2"], partition=0)
        poll_until(lambda: len(seen) == 5, 30)
        assert seen == {
            (0, 0): b"old-0",
            (0, 1): b"old-1",
            (1, 0): b"new-1",
            (2, 0): b"new-2",
            (0, 2): b"old-2",
        }
    finally:
        for c in consumers:
            c.close()


# ---------------------------------------------------------------------------- restarts
@pytest.mark.parametrize("clean", [True, False], ids=["sigterm", "kill-9"])
def test_new_partitions_and_their_data_survive_a_restart(
    fresh_broker: BrokerFactory, topic: str, clean: bool
) -> None:
    b = fresh_broker()
    create_topic(b.bootstrap, topic, partitions=1, config={"segment.bytes": "2048"})
    add_partitions(admin(b.bootstrap), topic, 4)
    for p in range(4):
        values = [f"p{p}-{i}".encode() * 20 for i in range(20)]
        produce_values(b.bootstrap, topic, values, partition=p, batch_num_messages=1)
    b.restart(clean=clean)
    a = admin(b.bootstrap)
    assert partition_count(a, topic) == 4
    for p in range(4):
        got = consume(b.bootstrap, topic, 20, partitions=(p,))
        assert [g.value for g in got] == [f"p{p}-{i}".encode() * 20 for i in range(20)]
    assert len(list(b.partition_dir(topic, 3).glob("*.log"))) > 1  # the topic config came back too
    add_partitions(a, topic, 5)  # and it grows again after the restart
    assert produce_values(b.bootstrap, topic, [b"last"], partition=4) == [0]
