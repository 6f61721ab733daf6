"""Small wrappers around the real clients (confluent-kafka mostly) shared by integration tests."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

# librdkafka logs go through Python logging: pytest shows them with a failing test, and a client
# that outlives its test does not spray its reconnect errors over the terminal.
QUIET: dict[str, Any] = {"log_level": 4, "logger": logging.getLogger("librdkafka")}


@dataclass(frozen=True)
class Got:
    """One consumed record, as plain data."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_type: int
    timestamp: int


def admin(bootstrap: str, **conf: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **QUIET, **conf})


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    timeout: float = 15,
) -> None:
    client = admin(bootstrap)  # keep a reference: a collected AdminClient fails its futures
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))],
        request_timeout=timeout,
    )
    futures[name].result(timeout)


def producer(bootstrap: str, **conf: Any) -> Producer:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        **QUIET,
    }
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Producer(base)


def produce_values(
    bootstrap: str, topic: str, values: Iterable[bytes], partition: int = 0, timeout: float = 30, **conf: Any
) -> list[int]:
    """Produce with an idempotent producer; returns the offsets, asserting every delivery succeeded."""
    p = producer(bootstrap, **conf)
    offsets: list[int] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    count = 0
    for value in values:
        count += 1
        while True:
            try:
                p.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(timeout)
    assert not errors, f"delivery errors: {errors[:5]}"
    assert left == 0, f"{left} messages not delivered within {timeout}s"
    assert len(offsets) == count
    return offsets


def consumer(bootstrap: str, **conf: Any) -> Consumer:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "exactly-tests-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        **QUIET,
    }
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Consumer(base)


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: Iterable[int] = (0,),
    start: int = OFFSET_BEGINNING,
    timeout: float = 30,
    idle: float | None = None,
    **conf: Any,
) -> list[Got]:
    """Assign the partitions at ``start`` and read until ``count`` records (or ``idle`` s of silence).

    Fails on any consumer error. Returns what was read, in arrival order.
    """
    c = consumer(bootstrap, **conf)
    try:
        c.assign([TopicPartition(topic, p, start) for p in partitions])
        got: list[Got] = []
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while len(got) < count and time.monotonic() < deadline:
            if idle is not None and time.monotonic() - last > idle:
                break
            msgs = c.consume(num_messages=min(1000, count - len(got)), timeout=0.2)
            for m in msgs:
                err = m.error()
                assert err is None, f"consumer error: {err}"
                ts_type, ts = m.timestamp()
                headers: Any = m.headers() or ()
                got.append(
                    Got(
                        int(m.partition() or 0),
                        int(m.offset() or 0),
                        m.key(),
                        m.value(),
                        tuple(headers),
                        ts_type,
                        ts,
                    )
                )
                last = time.monotonic()
        return got
    finally:
        c.close()


@contextmanager
def member_that_committed(
    bootstrap: str, topic: str, group: str, client_id: str, n: int = 3
) -> Iterator[Consumer]:
    """A group member (subscribed to ``topic``) that has read ``n`` records and committed offset
    ``n``; it stays in the group until the block ends, then leaves it."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        c.subscribe([topic])
        seen: list[Any] = []
        deadline = time.monotonic() + 60
        while len(seen) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append(m)
        assert len(seen) == n
        c.commit(message=seen[-1], asynchronous=False)
        yield c
    finally:
        c.close()


def watermarks(bootstrap: str, topic: str, partition: int = 0, timeout: float = 10) -> tuple[int, int]:
    c = consumer(bootstrap)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
        return int(low), int(high)
    finally:
        c.close()
