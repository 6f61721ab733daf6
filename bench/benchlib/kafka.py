"""Admin helpers over confluent-kafka: readiness, topic create/delete, log end offsets (verification)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 3}  # errors only: keep librdkafka's retry chatter out of the report


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **QUIET})


def wait_ready(bootstrap: str, deadline: float) -> None:
    a = admin(bootstrap)
    last: Exception | None = None
    for _ in range(10_000):
        if time.monotonic() > deadline:
            raise RuntimeError(f"broker at {bootstrap} not answering Metadata: {last}")
        try:
            md = a.list_topics(timeout=2)
            if md.brokers:
                return
        except KafkaException as exc:
            last = exc
        time.sleep(0.05)


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> None:
    a = admin(bootstrap)
    futs = a.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futs[topic].result(timeout=timeout)
    deadline = time.monotonic() + timeout
    for _ in range(100_000):
        md = a.list_topics(topic=topic, timeout=5)
        t = md.topics.get(topic)
        if (
            t is not None
            and t.error is None
            and len(t.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no leaders for {partitions} partitions after {timeout}s")
        time.sleep(0.05)


def delete_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    a = admin(bootstrap)
    try:
        a.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout)[topic].result(timeout)
    except Exception:
        pass


def consumer(bootstrap: str, extra: dict[str, object] | None = None) -> Consumer:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        # confluent-kafka insists on group.id; we only assign() and never commit.
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        **QUIET,
    }
    conf.update(extra or {})
    return Consumer(conf)


def offsets(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> list[tuple[int, int]]:
    """(log start, high watermark) per partition, via ListOffsets."""
    c = consumer(bootstrap)
    try:
        return [
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
            for p in range(partitions)
        ]
    finally:
        c.close()


def record_count(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> int:
    return sum(hi - lo for lo, hi in offsets(bootstrap, topic, partitions, timeout))
