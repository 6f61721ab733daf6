"""Consumer groups with confluent-kafka (librdkafka 2.x): subscribe, commit, rebalance, static
membership, admin APIs, and offsets that survive a consumer restart and a broker crash."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.conftest import BrokerFactory
from tests.integration.conftest import FAST_GROUPS
from tests.support.broker import Broker
from tests.support.clients import QUIET, admin, create_topic, produce_values

pytestmark = pytest.mark.timeout(60)

OFFSET_INVALID = -1001


def group_consumer(bootstrap: str, group_id: str, **conf: Any) -> Consumer:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 300,
        **QUIET,
    }
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Consumer(base)


def poll_until(consumers: list[Consumer], done: Callable[[], bool], timeout: float = 20) -> float:
    """Poll every consumer (rebalances need polling) until ``done()``; returns the time taken."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not reached within {timeout}s")
        for c in consumers:
            msg = c.poll(0.05)
            assert msg is None or msg.error() is None, msg.error()
    return time.monotonic() - start


def partitions_of(c: Consumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def read(c: Consumer, n: int, timeout: float = 20) -> list[tuple[int, int, bytes | None]]:
    got: list[tuple[int, int, bytes | None]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for m in c.consume(num_messages=n - len(got), timeout=0.2):
            assert m.error() is None, m.error()
            got.append((int(m.partition() or 0), int(m.offset() or 0), m.value()))
    return got


def committed(bootstrap: str, group_id: str, topic: str, partitions: range) -> dict[int, int]:
    c = group_consumer(bootstrap, group_id)
    try:
        return {
            tp.partition: tp.offset
            for tp in c.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        }
    finally:
        c.close()


# ---------------------------------------------------------------------------- basics
def test_subscribe_consume_commit_and_resume_after_consumer_restart(
    gb: Broker, topic: str, group: str
) -> None:
    create_topic(gb.bootstrap, topic, partitions=2)
    for p in (0, 1):
        produce_values(gb.bootstrap, topic, [f"p{p}-{i}".encode() for i in range(10)], partition=p)

    c = group_consumer(gb.bootstrap, group)
    c.subscribe([topic])
    first = read(c, 20)
    assert sorted((p, o) for p, o, _ in first) == [(p, o) for p in (0, 1) for o in range(10)]
    # commit a position in the middle of each partition
    c.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 7)], asynchronous=False)
    c.close()
    assert committed(gb.bootstrap, group, topic, range(2)) == {0: 4, 1: 7}

    c2 = group_consumer(gb.bootstrap, group)
    c2.subscribe([topic])
    resumed = read(c2, 9)
    assert sorted((p, o) for p, o, _ in resumed) == [(0, o) for o in range(4, 10)] + [
        (1, o) for o in range(7, 10)
    ]
    c2.commit(asynchronous=False)  # commits the consumed positions: 10 and 10
    c2.close()
    assert committed(gb.bootstrap, group, topic, range(2)) == {0: 10, 1: 10}


def test_first_assignment_latency_with_zero_initial_delay(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=3)
    c = group_consumer(gb.bootstrap, group)
    assigned: list[float] = []
    start = time.monotonic()
    c.subscribe([topic], on_assign=lambda _c, parts: assigned.append(time.monotonic() - start))
    try:
        poll_until([c], lambda: bool(assigned) and len(c.assignment()) == 3, timeout=10)
        print(f"confluent-kafka: first assignment after {assigned[0] * 1000:.0f} ms")
        assert assigned[0] < 2.0
        assert partitions_of(c) == [0, 1, 2]
    finally:
        c.close()


def test_offset_fetch_of_unknown_group_has_no_offsets(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=2)
    assert committed(gb.bootstrap, group, topic, range(2)) == {0: OFFSET_INVALID, 1: OFFSET_INVALID}
    a = admin(gb.bootstrap)
    from confluent_kafka import ConsumerGroupTopicPartitions

    (fut,) = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=10).values()
    result = fut.result(10)
    assert result.group_id == group
    assert result.topic_partitions == []


# ---------------------------------------------------------------------------- rebalancing
def test_two_consumers_split_partitions_and_rebalance_when_one_leaves(
    gb: Broker, topic: str, group: str
) -> None:
    create_topic(gb.bootstrap, topic, partitions=4)
    c1 = group_consumer(gb.bootstrap, group)
    c2 = group_consumer(gb.bootstrap, group)
    try:
        c1.subscribe([topic])
        poll_until([c1], lambda: partitions_of(c1) == [0, 1, 2, 3])
        c2.subscribe([topic])
        took = poll_until([c1, c2], lambda: len(c1.assignment()) == 2 and len(c2.assignment()) == 2)
        print(f"rebalance to two members took {took * 1000:.0f} ms")
        assert sorted(partitions_of(c1) + partitions_of(c2)) == [0, 1, 2, 3]

        # both consume only their own partitions
        for p in range(4):
            produce_values(gb.bootstrap, topic, [f"p{p}".encode()], partition=p)
        got1: list[int] = []
        got2: list[int] = []

        def drained() -> bool:
            for c, got in ((c1, got1), (c2, got2)):
                for m in c.consume(10, 0.05):
                    assert m.error() is None
                    got.append(int(m.partition() or 0))
            return len(got1) + len(got2) == 4

        poll_until([], drained)
        assert sorted(got1) == partitions_of(c1)
        assert sorted(got2) == partitions_of(c2)

        c2.close()  # LeaveGroup: the survivor gets everything back
        took = poll_until([c1], lambda: partitions_of(c1) == [0, 1, 2, 3])
        print(f"rebalance after LeaveGroup took {took * 1000:.0f} ms")
    finally:
        c1.close()


def test_static_member_rejoins_without_rebalance(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=4)
    b_events: list[str] = []
    a = group_consumer(gb.bootstrap, group, **{"group.instance.id": "static-a"})
    b = group_consumer(gb.bootstrap, group, **{"group.instance.id": "static-b"})
    try:
        a.subscribe([topic])
        b.subscribe(
            [topic],
            on_assign=lambda _c, parts: b_events.append(f"assign {sorted(p.partition for p in parts)}"),
            on_revoke=lambda _c, parts: b_events.append(f"revoke {sorted(p.partition for p in parts)}"),
        )
        poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        a_parts = partitions_of(a)
        b_parts = partitions_of(b)
        settled = time.monotonic() + 0.5
        poll_until([a, b], lambda: time.monotonic() > settled)  # let the callbacks run
        events_before = list(b_events)

        a.close()  # a static member does not send LeaveGroup
        a2 = group_consumer(gb.bootstrap, group, **{"group.instance.id": "static-a"})
        try:
            a2.subscribe([topic])
            poll_until([a2, b], lambda: partitions_of(a2) == a_parts)
            # give a (wrong) rebalance time to show up at b: several heartbeat intervals
            end = time.monotonic() + 1.5
            poll_until([a2, b], lambda: time.monotonic() > end)
            assert partitions_of(b) == b_parts
            assert b_events == events_before, f"b saw a rebalance: {b_events}"
            described = _describe(admin(gb.bootstrap), group)
            assert described.state == ConsumerGroupState.STABLE
            assert sorted(m.group_instance_id for m in described.members) == ["static-a", "static-b"]
        finally:
            a2.close()
    finally:
        b.close()


# ---------------------------------------------------------------------------- admin
def _describe(a: AdminClient, group_id: str) -> Any:
    return a.describe_consumer_groups([group_id], request_timeout=10)[group_id].result(10)


def test_admin_list_describe_delete_groups(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=2)
    produce_values(gb.bootstrap, topic, [b"x"] * 3, partition=0)
    a = admin(gb.bootstrap)
    c = group_consumer(gb.bootstrap, group, **{"client.id": "describe-me"})
    try:
        c.subscribe([topic])
        assert len(read(c, 3)) == 3
        c.commit(asynchronous=False)

        listed = a.list_consumer_groups(request_timeout=10).result(10)
        assert not listed.errors
        mine = [g for g in listed.valid if g.group_id == group]
        assert len(mine) == 1
        assert mine[0].state == ConsumerGroupState.STABLE
        assert not mine[0].is_simple_consumer_group

        d = _describe(a, group)
        assert d.group_id == group
        assert d.state == ConsumerGroupState.STABLE
        assert d.partition_assignor in ("range", "roundrobin")
        (member,) = d.members
        assert member.client_id == "describe-me"
        assert member.host.lstrip("/") == "127.0.0.1"
        assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == [
            (topic, 0),
            (topic, 1),
        ]
        assert d.coordinator.id == 0

        # a group with members cannot be deleted
        with pytest.raises(KafkaException) as exc_info:
            a.delete_consumer_groups([group], request_timeout=10)[group].result(10)
        assert exc_info.value.args[0].code() == 68  # NON_EMPTY_GROUP
    finally:
        c.close()

    assert _describe(a, group).state == ConsumerGroupState.EMPTY
    a.delete_consumer_groups([group], request_timeout=10)[group].result(10)
    listed = a.list_consumer_groups(request_timeout=10).result(10)
    assert group not in {g.group_id for g in listed.valid}
    assert _describe(a, group).state == ConsumerGroupState.DEAD
    # offsets went with the group
    assert committed(gb.bootstrap, group, topic, range(1)) == {0: OFFSET_INVALID}
    with pytest.raises(KafkaException) as exc_info:
        a.delete_consumer_groups([group], request_timeout=10)[group].result(10)
    assert exc_info.value.args[0].code() == 69  # GROUP_ID_NOT_FOUND


# ---------------------------------------------------------------------------- durability
def test_committed_offsets_survive_broker_kill9(fresh_broker: BrokerFactory, topic: str, group: str) -> None:
    b = fresh_broker(**FAST_GROUPS)
    create_topic(b.bootstrap, topic, partitions=2)
    produce_values(b.bootstrap, topic, [f"v{i}".encode() for i in range(10)], partition=0)
    c = group_consumer(b.bootstrap, group)
    c.subscribe([topic])
    assert len(read(c, 10)) == 10
    c.commit(offsets=[TopicPartition(topic, 0, 6), TopicPartition(topic, 1, 0)], asynchronous=False)
    c.close()
    # a second, later commit of another group on the same broker must not disturb ours
    other = group + "-other"
    c = group_consumer(b.bootstrap, other)
    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    c.close()

    b.restart(clean=False)  # SIGKILL: no clean shutdown
    assert committed(b.bootstrap, group, topic, range(2)) == {0: 6, 1: 0}
    assert committed(b.bootstrap, other, topic, range(1)) == {0: 2}

    c = group_consumer(b.bootstrap, group)
    c.subscribe([topic])
    try:
        assert [(p, o) for p, o, _ in read(c, 4)] == [(0, o) for o in range(6, 10)]
    finally:
        c.close()
    d = _describe(admin(b.bootstrap), group)
    assert d.state == ConsumerGroupState.EMPTY


def test_transactional_offsets_commit_abort_and_replay(
    fresh_broker: BrokerFactory, topic: str, group: str
) -> None:
    """send_offsets_to_transaction (TxnOffsetCommit): visible only after COMMIT, dropped on ABORT,
    and the same after a kill -9 (replay of the transactional batches and their markers)."""
    from confluent_kafka import Producer

    b = fresh_broker(**FAST_GROUPS)
    create_topic(b.bootstrap, topic, partitions=1)
    produce_values(b.bootstrap, topic, [b"x"] * 10, partition=0)
    c = group_consumer(b.bootstrap, group)
    c.subscribe([topic])
    assert len(read(c, 10)) == 10
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"tx-{group}", **QUIET})
    p.init_transactions(15)
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], c.consumer_group_metadata(), 15)
    p.commit_transaction(15)
    assert committed(b.bootstrap, group, topic, range(1)) == {0: 7}
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 9)], c.consumer_group_metadata(), 15)
    p.abort_transaction(15)
    assert committed(b.bootstrap, group, topic, range(1)) == {0: 7}
    c.close()
    del p

    b.restart(clean=False)
    assert committed(b.bootstrap, group, topic, range(1)) == {0: 7}
