"""Consumer groups with aiokafka 0.14 (old API versions: JoinGroup/SyncGroup v0-v2, OffsetCommit v2,
OffsetFetch v1-v3, FindCoordinator v0-v1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.support.broker import Broker
from tests.support.clients import create_topic, produce_values

pytestmark = pytest.mark.timeout(60)


def group_consumer(bootstrap: str, group_id: str, topic: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )


async def read(c: AIOKafkaConsumer, n: int, timeout: float = 20) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for records in (await c.getmany(timeout_ms=200)).values():
            got.extend((r.partition, r.offset) for r in records)
    return got


def test_subscribe_consume_commit_resume(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=2)
    for p in (0, 1):
        produce_values(gb.bootstrap, topic, [f"p{p}-{i}".encode() for i in range(6)], partition=p)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def scenario() -> None:
        c = group_consumer(gb.bootstrap, group, topic)
        start = time.monotonic()
        await c.start()
        try:
            got = await read(c, 12)
            print(f"aiokafka: 12 records via the group after {(time.monotonic() - start) * 1000:.0f} ms")
            assert sorted(got) == [(p, o) for p in (0, 1) for o in range(6)]
            assert c.assignment() == {tp0, tp1}
            await c.commit({tp0: 2, tp1: 6})
            assert await c.committed(tp0) == 2
        finally:
            await c.stop()

        c = group_consumer(gb.bootstrap, group, topic)
        await c.start()
        try:
            assert sorted(await read(c, 4)) == [(0, o) for o in range(2, 6)]
            await c.commit()
            assert (await c.committed(tp0), await c.committed(tp1)) == (6, 6)
        finally:
            await c.stop()

    asyncio.run(scenario())


def test_two_consumers_split_and_rebalance_on_leave(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=2)

    async def wait_for(
        cond: Callable[[], bool], consumers: list[AIOKafkaConsumer], timeout: float = 20
    ) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "condition not reached"
            for c in consumers:
                await c.getmany(timeout_ms=50)

    async def scenario() -> None:
        c1 = group_consumer(gb.bootstrap, group, topic)
        c2 = group_consumer(gb.bootstrap, group, topic)
        await c1.start()
        try:
            await wait_for(lambda: len(c1.assignment()) == 2, [c1])
            await c2.start()
            try:
                await wait_for(lambda: len(c1.assignment()) == 1 and len(c2.assignment()) == 1, [c1, c2])
                assert c1.assignment() | c2.assignment() == {
                    TopicPartition(topic, 0),
                    TopicPartition(topic, 1),
                }
            finally:
                await c2.stop()  # sends LeaveGroup
            await wait_for(lambda: len(c1.assignment()) == 2, [c1])
        finally:
            await c1.stop()

    asyncio.run(scenario())
