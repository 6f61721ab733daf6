"""aiokafka 0.14 (ApiVersions v0, Metadata <= v5, InitProducerId v0 for the idempotent producer)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.support.broker import Broker
from tests.support.clients import consume, create_topic
from tests.support.wire import WireClient, fetch_batches

pytestmark = pytest.mark.timeout(90)

Row = tuple[int, bytes | None, bytes | None, int, list[tuple[str, bytes]]]


async def _produce(bootstrap: str, topic: str, n: int, base_ts: int) -> list[int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=f"k{i}".encode(),
                value=f"v{i}".encode(),
                headers=[("n", str(i).encode())],
                partition=0,
                timestamp_ms=base_ts + i,
            )
            for i in range(n)
        ]
        return [(await f).offset for f in futures]
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str, n: int) -> list[Row]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[Row] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            for records in batch.values():
                got.extend((r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in records)
        end = await consumer.end_offsets([tp])
        assert end[tp] == n
        return got
    finally:
        await consumer.stop()


def test_idempotent_producer_and_assign_consumer(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    n = 150
    base_ts = int(time.time() * 1000) - 5_000
    offsets = asyncio.run(_produce(broker.bootstrap, topic, n, base_ts))
    assert offsets == list(range(n))
    got = asyncio.run(_consume(broker.bootstrap, topic, n))
    assert [g[0] for g in got] == list(range(n))
    for i, (_off, key, value, ts, headers) in enumerate(got):
        assert key == f"k{i}".encode()
        assert value == f"v{i}".encode()
        assert ts == base_ts + i
        assert headers == [("n", str(i).encode())]
    with WireClient(broker.bootstrap) as c:
        batches = fetch_batches(c, topic)
    assert len({h.producer_id for h, _ in batches}) == 1 and batches[0][0].producer_id >= 0
    assert [h.base_sequence for h, _ in batches] == [h.base_offset for h, _ in batches]
    # the batches aiokafka wrote (with its producer id and sequences) read fine with librdkafka too
    assert [g.value for g in consume(broker.bootstrap, topic, n)] == [f"v{i}".encode() for i in range(n)]


def test_two_idempotent_producers_get_distinct_ids(broker: Broker, topic: str) -> None:
    """Two aiokafka producers (InitProducerId v0 each) writing the same partition do not collide."""
    create_topic(broker.bootstrap, topic)

    t1 = int(time.time() * 1000) - 100_000
    t2 = t1 + 50_000

    async def both() -> None:
        await asyncio.gather(
            _produce(broker.bootstrap, topic, 50, t1), _produce(broker.bootstrap, topic, 50, t2)
        )

    asyncio.run(both())
    got = consume(broker.bootstrap, topic, 100, idle=3)
    assert len(got) == 100
    assert sorted(g.timestamp for g in got) == [t1 + i for i in range(50)] + [t2 + i for i in range(50)]
