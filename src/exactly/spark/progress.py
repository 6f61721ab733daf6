"""Progress markers: how a write task learns whether its micro-batch is already committed.

Every exactly-once write task commits one Kafka transaction holding its output records **and** one
progress marker, a small record in the progress topic (default ``exactly-spark-progress``):

    key   = the task's transactional.id  (prefix-queryId-sparkPartition)
    value = JSON {"batch": 7, "query": "...", "partition": 0, "records": 123, "attempt": 0, ...}

Both become visible atomically, so "a committed marker for batch >= B exists" is equivalent to
"this (query, partition) already wrote batch B". A replayed task (Spark re-runs the last batch
after a crash, with the same id and the same data) finds the marker and skips.

Lookup (``last_committed_batch``), after ``init_transactions()`` has fenced and completed every
earlier transaction of the same transactional.id:

1. Take the partition's high watermark (read_uncommitted ListOffsets) *now*. Our last marker, if
   any, is below it.
2. Read the partition with a read_committed consumer up to that high watermark - newest window
   first, widening backwards (x8 each time) until a marker with our key turns up or the log start
   is reached. A read_committed consumer cannot pass the LSO, so the read waits while some
   *other* writer has a transaction open on this progress partition; markers of Spark partition
   ``p`` go to progress partition ``p % N`` so tasks of one query never wait for each other.
3. A per-process cache remembers (marker offset, batch) per transactional.id so the next batch of
   the same task only reads the markers written since (Python workers are reused), and the
   readers themselves (assign-only consumers) are kept across calls (``clients.py``).

Two-phase mode cannot wait like that: a prepared transaction stays open until its driver decides,
after every task of the batch finished. Its tasks read only up to the LSO
(``last_committed_batch_below_lso``) and let the driver's decision records answer for what lies
above (``two_phase.last_committed_batch``).

The topic is created (compacted, keyed by transactional.id) by the driver before any task runs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from exactly.spark import clients
from exactly.spark.fetch import FETCH_WAIT_MAX_MS, consume_available
from exactly.spark.retries import call_retrying, retriable

log = logging.getLogger("exactly.spark.progress")

# (bootstrap, topic, txn id, partition) -> (offset of our newest marker, its batch)
_CACHE: dict[tuple[str, str, str, int], tuple[int, int]] = {}
_CACHE_LOCK = threading.Lock()
_FIRST_WINDOW = 512


class ProgressBlocked(RuntimeError):
    """An open transaction of another writer kept the progress partition's LSO below our marker."""


@dataclass(frozen=True)
class Marker:
    batch: int
    offset: int
    value: dict[str, Any]


def ensure_progress_topic(
    client_conf: dict[str, str], topic: str, partitions: int, timeout: float = 30
) -> int:
    """Create the progress topic if missing; return its partition count."""
    admin = AdminClient({**client_conf, "log_level": "3"})
    # list all topics: a Metadata request naming the topic may auto-create it with 1 partition
    metadata = admin.list_topics(timeout=timeout)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None and existing.partitions:
        return len(existing.partitions)
    futures = admin.create_topics(
        [
            NewTopic(
                topic, num_partitions=partitions, replication_factor=-1, config={"cleanup.policy": "compact"}
            )
        ],
        request_timeout=timeout,
    )
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = admin.list_topics(timeout=timeout).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        time.sleep(0.1)
    raise KafkaException(f"progress topic {topic} did not appear within {timeout}s")


def marker_value(batch: int, query: str, partition: int, records: int, attempt: int) -> bytes:
    return json.dumps(
        {
            "batch": batch,
            "query": query,
            "partition": partition,
            "records": records,
            "attempt": attempt,
            "committed_at_ms": int(time.time() * 1000),
        },
        separators=(",", ":"),
    ).encode()


def remember(
    client_conf: dict[str, str], topic: str, txn_id: str, partition: int, offset: int, batch: int
) -> None:
    """Record a marker we know is committed so the next lookup starts after it."""
    key = (client_conf["bootstrap.servers"], topic, txn_id, partition)
    with _CACHE_LOCK:
        known = _CACHE.get(key)
        if known is None or known[0] < offset:
            _CACHE[key] = (offset, batch)


def last_committed_batch(
    client_conf: dict[str, str], topic: str, partition: int, txn_id: str, *, wait_s: float
) -> int | None:
    """The highest batch id with a committed marker for ``txn_id``, or None if there is none."""
    low, high = _watermarks_uncommitted(client_conf, topic, partition)
    return _newest_marker(client_conf, topic, partition, txn_id, low, high, wait_s)


def last_committed_batch_below_lso(
    client_conf: dict[str, str], topic: str, partition: int, txn_id: str
) -> tuple[int | None, bool]:
    """Like ``last_committed_batch``, but reads only up to the partition's LSO, so it never waits
    for another writer's open transaction. Returns (batch or None, whether the LSO was the high
    watermark: if not, a committed marker of ours may sit above an open transaction, unread)."""
    low, high = _watermarks_uncommitted(client_conf, topic, partition)
    _low, lso = _watermarks_uncommitted(client_conf, topic, partition, isolation="read_committed")
    lso = min(lso, high)
    return _newest_marker(client_conf, topic, partition, txn_id, low, lso, 60.0), lso >= high


def _newest_marker(
    client_conf: dict[str, str], topic: str, partition: int, txn_id: str, low: int, high: int, wait_s: float
) -> int | None:
    """The newest batch of ``txn_id``'s markers in ``[low, high)`` (read_committed)."""
    conf = _reader_conf(client_conf, "read_committed")
    consumer, _reused = clients.borrow("progress", conf, Consumer)
    healthy = False
    try:
        key = txn_id.encode()
        with _CACHE_LOCK:
            cached = _CACHE.get((client_conf["bootstrap.servers"], topic, txn_id, partition))
        if cached is not None and low <= cached[0] < high:
            found = _scan(consumer, topic, partition, cached[0] + 1, high, key, wait_s)
            healthy = True
            if found is None:
                return cached[1]
            remember(client_conf, topic, txn_id, partition, found.offset, found.batch)
            return max(cached[1], found.batch)
        stop = high
        window = _FIRST_WINDOW
        while stop > low:
            begin = max(low, stop - window)
            found = _scan(consumer, topic, partition, begin, stop, key, wait_s)
            if found is not None:
                healthy = True
                remember(client_conf, topic, txn_id, partition, found.offset, found.batch)
                return found.batch
            stop = begin
            window *= 8
        healthy = True
        return None
    finally:
        clients.give_back("progress", conf, consumer, healthy)


def _reader_conf(client_conf: dict[str, str], isolation: str) -> dict[str, Any]:
    return {
        "log_level": 3,
        **client_conf,
        "group.id": "exactly-spark-progress-reader",
        "isolation.level": isolation,
        "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }


def _watermarks_uncommitted(
    client_conf: dict[str, str], topic: str, partition: int, *, isolation: str = "read_uncommitted"
) -> tuple[int, int]:
    """(log start, high watermark) regardless of open transactions (read_committed: the LSO)."""
    conf = _reader_conf(client_conf, isolation)
    consumer, _reused = clients.borrow("watermarks", conf, Consumer)
    healthy = False
    try:
        tp = TopicPartition(topic, partition)
        low, high = call_retrying(
            lambda: consumer.get_watermark_offsets(tp, timeout=10), 60, f"watermarks of {topic}-{partition}"
        )
        healthy = True
        return int(low), int(high)
    finally:
        clients.give_back("watermarks", conf, consumer, healthy)


def _scan(
    consumer: Consumer, topic: str, partition: int, begin: int, stop: int, key: bytes, wait_s: float
) -> Marker | None:
    """The newest marker with ``key`` in ``[begin, stop)``; reads until the position reaches ``stop``."""
    if begin >= stop:
        return None
    tp = TopicPartition(topic, partition)
    consumer.assign([TopicPartition(topic, partition, begin)])
    newest: Marker | None = None
    position = begin
    deadline = time.monotonic() + wait_s
    while position < stop:
        for msg in consume_available(consumer, 5000, 0.1):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF or retriable(err):
                    continue  # a lost connection / moved leader: the consumer recovers by itself
                raise KafkaException(err)
            offset = msg.offset() or 0
            if offset >= stop:
                position = stop
                break
            position = offset + 1
            if msg.key() == key:
                try:
                    value = json.loads(msg.value() or b"{}")
                    batch = int(value["batch"])
                except (ValueError, KeyError, TypeError):
                    log.warning("%s-%d@%d: unreadable progress marker", topic, partition, offset)
                    continue
                if newest is None or batch >= newest.batch:
                    newest = Marker(batch, offset, value)
        at = consumer.position([tp])[0].offset
        if at > position:
            position = at
        if position < stop and time.monotonic() > deadline:
            raise ProgressBlocked(
                f"progress partition {topic}-{partition} stays below offset {stop} (stuck at {position}): "
                f"another writer's transaction is open there for more than {wait_s:.0f}s"
            )
    consumer.unassign()
    return newest


# ---------------------------------------------------------------------------- decisions
# The two-phase (atomic) sink records the driver's commit decisions in the progress topic too:
# key ``<transactionalIdPrefix>-<write id>-decision``, written outside any transaction (an
# idempotent producer, acks=all) and read with read_uncommitted, because the prepared transactions
# it decides hold the progress partitions' LSO until they are committed.


def decision_key(prefix: str, write_id: str) -> str:
    return f"{prefix}-{write_id}-decision"


def decision_partition(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def write_decision(client_conf: dict[str, str], topic: str, partition: int, key: str, value: bytes) -> None:
    """Append one decision record and wait until it is acknowledged by all in-sync replicas.

    The idempotent producer is kept for the process's next decision (``clients.shared``); one
    that failed is dropped."""
    conf = {
        "log_level": 3,
        **clients.PRODUCER_DEFAULTS,
        **client_conf,
        "enable.idempotence": True,
        "acks": "all",
    }
    producer = clients.shared("decisions", conf, Producer)
    errors: list[Any] = []
    producer.produce(
        topic, key=key.encode(), value=value, partition=partition, on_delivery=lambda e, _m: errors.append(e)
    )
    remaining = producer.flush(60)
    if remaining or not errors or errors[0] is not None:
        clients.drop_shared("decisions", conf)
        raise KafkaException(
            errors[0] if errors and errors[0] is not None else "decision not acknowledged in 60 s"
        )


def latest_decision(client_conf: dict[str, str], topic: str, partition: int, key: str) -> Marker | None:
    """The newest decision record with ``key`` (its value has the decided ``batch``), or None."""
    conf = _reader_conf(client_conf, "read_uncommitted")
    consumer, _reused = clients.borrow("progress", conf, Consumer)
    healthy = False
    try:
        low, high = _watermarks_uncommitted(client_conf, topic, partition)
        stop, window = high, _FIRST_WINDOW
        while stop > low:
            begin = max(low, stop - window)
            found = _scan(consumer, topic, partition, begin, stop, key.encode(), 60.0)
            if found is not None:
                healthy = True
                return found
            stop = begin
            window *= 8
        healthy = True
        return None
    finally:
        clients.give_back("progress", conf, consumer, healthy)
