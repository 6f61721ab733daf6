"""Offset retention on a real broker: expired offsets and empty groups disappear, and stay gone
after a restart (the tombstones are replayed).

Kafka's retention is configured in minutes, so the consumer-group case waits one real minute after
the group became Empty (``@pytest.mark.slow``). The fast case uses the per-commit
``retention_time`` of OffsetCommit v2-v4 (KIP-211), which only a wire client can send.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, TopicPartition

from exactly.protocol.apis import ApiKey, build, schema
from exactly.testing.wait import wait_until
from tests.conftest import BrokerFactory
from tests.integration.test_groups_confluent import group_consumer
from tests.server.test_prometheus import metrics_url, scrape, value
from tests.support.broker import Broker
from tests.support.clients import admin, create_topic, produce_values
from tests.support.wire import WireClient

OFFSET_INVALID = -1001
CHECK_INTERVAL = {
    "offsets.retention.check.interval.ms": "500",
    "group.initial.rebalance.delay.ms": "0",
}


def committed(bootstrap: str, group_id: str, topic: str) -> int:
    c = group_consumer(bootstrap, group_id)
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


def listed_groups(bootstrap: str) -> dict[str, Any]:
    a = admin(bootstrap)  # keep the client alive until the answer is in
    result = a.list_consumer_groups(request_timeout=10).result(10)
    assert not result.errors
    return {g.group_id: g.state for g in result.valid}


def described_state(bootstrap: str, group_id: str) -> Any:
    a = admin(bootstrap)
    return a.describe_consumer_groups([group_id], request_timeout=10)[group_id].result(10).state


def assert_gone_for_good(b: Broker, group_id: str, topic: str) -> None:
    assert committed(b.bootstrap, group_id, topic) == OFFSET_INVALID
    assert group_id not in listed_groups(b.bootstrap)
    assert described_state(b.bootstrap, group_id) == ConsumerGroupState.DEAD
    assert "expired offsets and" in b.log_text()
    b.restart()  # replay of __consumer_offsets must honour the tombstones
    assert committed(b.bootstrap, group_id, topic) == OFFSET_INVALID
    assert group_id not in listed_groups(b.bootstrap)
    assert described_state(b.bootstrap, group_id) == ConsumerGroupState.DEAD


@pytest.mark.timeout(90)
def test_commit_retention_time_expires_a_simple_group(
    fresh_broker: BrokerFactory, topic: str, unique_name: Callable[[str], str]
) -> None:
    b = fresh_broker(**CHECK_INTERVAL, **{"metrics.port": "0"})
    group_id = unique_name("simple")
    create_topic(b.bootstrap, topic)
    m = schema(ApiKey.OFFSET_COMMIT, 2).request_module
    request = build(
        schema(ApiKey.OFFSET_COMMIT, 2).request_type,
        group_id=group_id,
        generation_id_or_member_epoch=-1,
        member_id="",
        retention_time=datetime.timedelta(milliseconds=3_000),
        topics=(
            build(
                m.OffsetCommitRequestTopic,
                name=topic,
                partitions=(
                    build(
                        m.OffsetCommitRequestPartition,
                        partition_index=0,
                        committed_offset=7,
                        committed_metadata="",
                    ),
                ),
            ),
        ),
    )
    with WireClient(b.bootstrap) as c:
        response = c.send(request)
    assert response.topics[0].partitions[0].error_code == 0
    assert committed(b.bootstrap, group_id, topic) == 7
    assert group_id in listed_groups(b.bootstrap)

    wait_until(
        lambda: committed(b.bootstrap, group_id, topic) == OFFSET_INVALID, 30, "offsets expired", interval=0.5
    )
    samples = scrape(metrics_url(b))
    assert value(samples, "exactly_offsets_expired_total") == 1
    wait_until(
        lambda: value(scrape(metrics_url(b)), "exactly_groups_removed_total") == 1,
        10,
        "exactly_groups_removed_total == 1",
        interval=0.5,
    )
    assert_gone_for_good(b, group_id, topic)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_consumer_group_offsets_expire_after_the_group_is_empty(
    fresh_broker: BrokerFactory, topic: str, unique_name: Callable[[str], str]
) -> None:
    b = fresh_broker(**{"offsets.retention.minutes": "1", **CHECK_INTERVAL})
    group_id = unique_name("g")
    create_topic(b.bootstrap, topic)
    produce_values(b.bootstrap, topic, [b"a", b"b", b"c"])
    c = group_consumer(b.bootstrap, group_id)
    try:
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < 3 and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got += 1
        assert got == 3
        c.commit(asynchronous=False)
    finally:
        c.close()  # LeaveGroup: the group is Empty from now on
    empty_since = time.monotonic()
    assert committed(b.bootstrap, group_id, topic) == 3
    assert listed_groups(b.bootstrap).get(group_id) == ConsumerGroupState.EMPTY

    wait_until(
        lambda: committed(b.bootstrap, group_id, topic) == OFFSET_INVALID,
        150,
        "the empty group's offsets expired",
        interval=2.0,
    )
    waited = time.monotonic() - empty_since
    assert waited >= 55, f"expired after only {waited:.0f}s"
    assert_gone_for_good(b, group_id, topic)
