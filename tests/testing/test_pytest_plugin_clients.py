"""The pytest plugin as an application's test suite uses it: only the fixtures and Kafka clients.

Each client library copies a topic with a transactional consume-transform-produce loop (the
consumer's offsets committed in the producer's transaction), then writes one aborted transaction;
a read_committed reader must see every input transformed exactly once and nothing aborted, and the
group's committed offset must be the end of the input.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import OffsetAndMetadata as AioOffset
from aiokafka.structs import TopicPartition as AioPartition
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import OffsetAndMetadata as KpOffset
from kafka.structs import TopicPartition as KpPartition

WORDS = [f"word-{i}".encode() for i in range(20)]
SHOUTED = sorted(w.upper() for w in WORDS)
DEADLINE_S = 60


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the futures resolve
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(15)


def produce_words(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for word in WORDS:
        producer.produce(topic, word)
    assert producer.flush(15) == 0


def read_committed(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """Everything a read_committed reader gets up to the end of the partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "checker",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if len(values) >= expected:
                    break  # end of partition after the expected records: nothing more follows
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return sorted(values)


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=15)
        return int(tp.offset)
    finally:
        consumer.close()


def test_confluent_kafka_consume_transform_produce(exactly_broker):
    bootstrap = exactly_broker.bootstrap_servers
    create_topics(bootstrap, "words", "shouted")
    produce_words(bootstrap, "words")

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "shouter",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "shouter-0"})
    producer.init_transactions(15)
    consumer.subscribe(["words"])
    copied = 0
    deadline = time.monotonic() + DEADLINE_S
    while copied < len(WORDS) and time.monotonic() < deadline:
        batch = [m for m in consumer.consume(10, 1.0) if not m.error()]
        if not batch:
            continue
        producer.begin_transaction()
        for msg in batch:
            producer.produce("shouted", msg.value().upper())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 15
        )
        producer.commit_transaction(15)
        copied += len(batch)
    consumer.close()
    producer.begin_transaction()
    producer.produce("shouted", b"ABORTED")
    producer.flush(15)
    producer.abort_transaction(15)

    assert read_committed(bootstrap, "shouted", len(WORDS)) == SHOUTED
    assert committed_offset(bootstrap, "shouter", "words") == len(WORDS)


def test_kafka_python_consume_transform_produce(exactly_broker):
    bootstrap = exactly_broker.bootstrap_servers
    create_topics(bootstrap, "words", "shouted")
    produce_words(bootstrap, "words")

    consumer = KafkaConsumer(
        "words",
        bootstrap_servers=bootstrap,
        group_id="shouter",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="shouter-0")
    producer.init_transactions()
    copied = 0
    deadline = time.monotonic() + DEADLINE_S
    while copied < len(WORDS) and time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=1000)
        if not batch:
            continue
        producer.begin_transaction()
        offsets = {}
        for tp, records in batch.items():
            for record in records:
                producer.send("shouted", record.value.upper())
            offsets[KpPartition(tp.topic, tp.partition)] = KpOffset(records[-1].offset + 1, "", -1)
            copied += len(records)
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.commit_transaction()
    consumer.close()
    producer.begin_transaction()
    producer.send("shouted", b"ABORTED")
    producer.flush()
    producer.abort_transaction()
    producer.close()

    assert read_committed(bootstrap, "shouted", len(WORDS)) == SHOUTED
    assert committed_offset(bootstrap, "shouter", "words") == len(WORDS)


def test_aiokafka_consume_transform_produce(exactly_broker):
    bootstrap = exactly_broker.bootstrap_servers
    create_topics(bootstrap, "words", "shouted")
    produce_words(bootstrap, "words")

    async def shout() -> None:
        consumer = AIOKafkaConsumer(
            "words",
            bootstrap_servers=bootstrap,
            group_id="shouter",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="shouter-0")
        await consumer.start()
        await producer.start()
        try:
            copied = 0
            deadline = time.monotonic() + DEADLINE_S
            while copied < len(WORDS) and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=1000)
                if not batch:
                    continue
                async with producer.transaction():
                    offsets = {}
                    for tp, records in batch.items():
                        for record in records:
                            await producer.send("shouted", record.value.upper())
                        offsets[AioPartition(tp.topic, tp.partition)] = AioOffset(records[-1].offset + 1, "")
                        copied += len(records)
                    await producer.send_offsets_to_transaction(offsets, "shouter")
            await producer.begin_transaction()
            await (await producer.send("shouted", b"ABORTED"))
            await producer.abort_transaction()
        finally:
            await consumer.stop()
            await producer.stop()

    asyncio.run(shout())

    assert read_committed(bootstrap, "shouted", len(WORDS)) == SHOUTED
    assert committed_offset(bootstrap, "shouter", "words") == len(WORDS)
