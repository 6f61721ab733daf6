"""Helpers for the transaction integration tests (tests/integration/test_transactions_*.py).

* broker settings that make transactions and groups fast to test (``TXN_BROKER_CONFIG``);
* confluent-kafka helpers: transactional producers, reading a partition set "to the end" under an
  isolation level (the end is the LSO for read_committed, the high watermark otherwise), end offsets;
* raw wire helpers (``WireClient``): transactional InitProducerId / AddPartitionsToTxn / EndTxn /
  Produce, ListOffsets and Fetch with an isolation level, OffsetFetch with ``require_stable``, and a
  dump of a partition's log *including control batches* (``log_entries``) to see where markers are.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from exactly.protocol.apis import build
from exactly.records.batch import BatchHeader
from exactly.records.builder import Record, build_batch, decode_batch
from exactly.records.control import ControlType, read_control_marker
from exactly.testing.wait import wait_until as wait_until  # re-exported: tests import it from here
from tests.support.clients import QUIET, Got
from tests.support.wire import WireClient, fetch_request, produce_request

# Fast timers: timed-out transactions are checked every 0.5 s, groups form at once and sessions may
# be short (the zombie tests let a frozen member's 3 s session expire).
TXN_BROKER_CONFIG: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}

# librdkafka logs go to Python logging (pytest shows them for failing tests only) instead of
# stderr: a fenced or leftover producer keeps reconnecting to a stopped broker until collected.
RDKAFKA_LOGGER = logging.getLogger("librdkafka")

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

# Kafka error codes used by the assertions
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90


# ------------------------------------------------------------------ broker fixtures
def txn_broker_config(**overrides: str) -> dict[str, str]:
    """``TXN_BROKER_CONFIG`` plus ``overrides`` (``_`` may stand for ``.`` in the keys): the usual
    value of a transactional test module's ``module_broker_config`` fixture."""
    return {**TXN_BROKER_CONFIG, **{k.replace("_", "."): str(v) for k, v in overrides.items()}}


def fresh_config(**extra: str) -> dict[str, str]:
    """``TXN_BROKER_CONFIG`` plus ``extra`` as keyword arguments for the ``fresh_broker`` factory."""
    return {k.replace(".", "_"): v for k, v in {**TXN_BROKER_CONFIG, **extra}.items()}


# ------------------------------------------------------------------ confluent-kafka
def txn_producer(bootstrap: str, transactional_id: str, **conf: Any) -> Producer:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "linger.ms": 5,
        **QUIET,
        "logger": RDKAFKA_LOGGER,
    }
    base.update(conf)  # librdkafka names, and confluent's callbacks (error_cb, ...)
    return Producer(base)


def produce_flush(
    p: Producer, items: Iterable[tuple[str, int, bytes]], timeout: float = 15
) -> list[tuple[int, int]]:
    """Produce ``(topic, partition, value)`` items and wait for every delivery; -> [(partition, offset)].

    Flushing before commit/abort matters: an abort purges records still queued in the client, so
    without it an "aborted" record may never have reached the broker at all."""
    delivered: list[tuple[int, int]] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((int(msg.partition()), int(msg.offset())))

    n = 0
    for topic, partition, value in items:
        p.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
        n += 1
    left = p.flush(timeout)
    assert not errors, f"delivery errors: {errors[:5]}"
    assert left == 0 and len(delivered) == n, f"{left} of {n} records not delivered within {timeout}s"
    return delivered


def kafka_error(exc: BaseException) -> KafkaError:
    assert isinstance(exc, KafkaException), f"not a KafkaException: {exc!r}"
    err = exc.args[0]
    assert isinstance(err, KafkaError), f"no KafkaError in {exc!r}"
    return err


def plain_consumer(bootstrap: str, isolation: str, **conf: Any) -> Consumer:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "exactly-txn-tests-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": isolation,
        "fetch.wait.max.ms": 100,
        **QUIET,
        "logger": RDKAFKA_LOGGER,
    }
    base.update(conf)
    return Consumer(base)


def end_offsets(bootstrap: str, topic: str, partitions: Iterable[int], isolation: str) -> dict[int, int]:
    """ListOffsets(latest) through librdkafka with the consumer's isolation level:
    the LSO under read_committed, the high watermark under read_uncommitted."""
    c = plain_consumer(bootstrap, isolation)
    try:
        return {
            p: int(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1])
            for p in partitions
        }
    finally:
        c.close()


def read_to_end(
    bootstrap: str, topic: str, partitions: Iterable[int], isolation: str, timeout: float = 20
) -> list[Got]:
    """Read the partitions from the beginning until the consumer's position reaches the end offsets
    (LSO or high watermark, per ``isolation``) taken at the start. librdkafka moves the position
    past control batches, so a partition ending with a marker still completes."""
    parts = list(partitions)
    ends = end_offsets(bootstrap, topic, parts, isolation)
    c = plain_consumer(bootstrap, isolation)
    got: list[Got] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = time.monotonic() + timeout
        while True:
            for m in c.consume(num_messages=500, timeout=0.1):
                assert m.error() is None, f"consumer error: {m.error()}"
                ts_type, ts = m.timestamp()
                got.append(
                    Got(int(m.partition() or 0), int(m.offset() or 0), m.key(), m.value(), (), ts_type, ts)
                )
            positions = {
                tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in parts])
            }
            if all(positions[p] >= ends[p] for p in parts if ends[p] > 0):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{isolation} consumer of {topic} did not reach the end offsets {ends} within {timeout}s:"
                    f" positions {positions}, read {len(got)} records"
                )
    finally:
        c.close()


def values(records: Iterable[Got]) -> list[bytes]:
    return [r.value for r in records if r.value is not None]


# ------------------------------------------------------------------ raw wire
def _mod(api: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def wire_init_producer_id(
    client: WireClient, transactional_id: str | None, timeout_ms: int = 60_000, version: int = 3
) -> tuple[int, int, int]:
    """InitProducerId -> (error code, producer id, epoch)."""
    from kio.schema.types import ProducerId, TransactionalId
    from kio.static.primitive import i16

    mod = _mod("init_producer_id", version)
    req = build(
        mod.InitProducerIdRequest,
        transactional_id=None if transactional_id is None else TransactionalId(transactional_id),
        transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
        producer_id=ProducerId(-1),
        producer_epoch=i16(-1),
    )
    r = client.send(req)
    return int(r.error_code), int(r.producer_id), int(r.producer_epoch)


def wire_add_partitions(
    client: WireClient,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    partitions: Mapping[str, Iterable[int]],
    version: int = 3,
) -> dict[tuple[str, int], int]:
    """AddPartitionsToTxn (v0-v3, the client flavour) -> {(topic, partition): error code}."""
    from kio.schema.types import ProducerId, TopicName, TransactionalId
    from kio.static.primitive import i16, i32

    mod = _mod("add_partitions_to_txn", version)
    topics = tuple(
        mod.AddPartitionsToTxnTopic(name=TopicName(t), partitions=tuple(i32(p) for p in ps))
        for t, ps in partitions.items()
    )
    if (
        version <= 3
        and hasattr(mod.AddPartitionsToTxnRequest, "__dataclass_fields__")
        and ("v3_and_below_transactional_id" in mod.AddPartitionsToTxnRequest.__dataclass_fields__)
    ):
        req = mod.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=TransactionalId(transactional_id),
            v3_and_below_producer_id=ProducerId(producer_id),
            v3_and_below_producer_epoch=i16(epoch),
            v3_and_below_topics=topics,
        )
    else:
        req = mod.AddPartitionsToTxnRequest(
            transactional_id=TransactionalId(transactional_id),
            producer_id=ProducerId(producer_id),
            producer_epoch=i16(epoch),
            topics=topics,
        )
    r = client.send(req)
    results = getattr(r, "results_by_topic_v3_and_below", None)
    if results is None:
        results = r.results
    out: dict[tuple[str, int], int] = {}
    for t in results:
        for p in t.results_by_partition:
            out[(str(t.name), int(p.partition_index))] = int(p.partition_error_code)
    return out


def wire_end_txn(
    client: WireClient, transactional_id: str, producer_id: int, epoch: int, commit: bool, version: int = 3
) -> int:
    """EndTxn -> error code."""
    from kio.schema.types import ProducerId, TransactionalId
    from kio.static.primitive import i16

    mod = _mod("end_txn", version)
    r = client.send(
        mod.EndTxnRequest(
            transactional_id=TransactionalId(transactional_id),
            producer_id=ProducerId(producer_id),
            producer_epoch=i16(epoch),
            committed=commit,
        )
    )
    return int(r.error_code)


def txn_batch(values_: list[bytes], producer_id: int, epoch: int, base_sequence: int) -> bytes:
    return build_batch(
        [Record(value=v, key=None) for v in values_],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        transactional=True,
        base_timestamp=int(time.time() * 1000),
    )


def wire_produce(
    client: WireClient, topic: str, partition: int, batch: bytes, transactional_id: str | None
) -> tuple[int, int]:
    """Produce v8 of one batch -> (error code, base offset)."""
    r = client.send(produce_request(topic, partition, batch, transactional_id=transactional_id))
    (t,) = r.responses
    (p,) = t.partition_responses
    return int(p.error_code), int(p.base_offset)


def wire_list_offset(
    client: WireClient, topic: str, partition: int, timestamp: int, isolation_level: int, version: int = 2
) -> tuple[int, int, int]:
    """ListOffsets v2+ -> (error code, timestamp, offset); timestamp -1 latest, -2 earliest."""
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64

    mod = _mod("list_offsets", version)
    part = build(
        mod.ListOffsetsPartition,
        partition_index=i32(partition),
        timestamp=i64(timestamp),
        current_leader_epoch=i32(-1),
    )
    req = mod.ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(isolation_level),
        topics=(mod.ListOffsetsTopic(name=TopicName(topic), partitions=(part,)),),
    )
    (t,) = client.send(req).topics
    (p,) = t.partitions
    return int(p.error_code), int(p.timestamp), int(p.offset)


@dataclass(frozen=True)
class FetchResult:
    error: int
    high_watermark: int
    last_stable_offset: int
    aborted: tuple[tuple[int, int], ...]  # (producer id, first offset)
    records: bytes


def wire_fetch(
    client: WireClient, topic: str, partition: int, offset: int, isolation_level: int
) -> FetchResult:
    (t,) = client.send(fetch_request(topic, partition, offset, isolation_level=isolation_level)).responses
    (p,) = t.partitions
    aborted = tuple((int(a.producer_id), int(a.first_offset)) for a in (p.aborted_transactions or ()))
    return FetchResult(
        int(p.error_code), int(p.high_watermark), int(p.last_stable_offset), aborted, bytes(p.records or b"")
    )


@dataclass(frozen=True)
class LogEntry:
    """One record of a partition's log; ``control`` is the marker type for control records."""

    offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: ControlType | None
    value: bytes | None

    @property
    def kind(self) -> str:
        """'data', 'COMMIT' or 'ABORT'."""
        return "data" if self.control is None else self.control.name


def log_entries(client: WireClient, topic: str, partition: int = 0) -> list[LogEntry]:
    """Every record up to the high watermark (read_uncommitted), control records included."""
    out: list[LogEntry] = []
    position = 0
    while True:
        res = wire_fetch(client, topic, partition, position, isolation_level=0)
        assert res.error == 0, f"Fetch error {res.error}"
        data, pos, progressed = res.records, 0, False
        while pos + 61 <= len(data):
            header = BatchHeader.parse(data, pos)
            if pos + header.size > len(data):
                break
            if header.is_control:
                marker = read_control_marker(data, header)
                out.append(
                    LogEntry(
                        header.base_offset, header.producer_id, header.producer_epoch, True, marker.type, None
                    )
                )
            else:
                _, records = decode_batch(data, pos)
                out.extend(
                    LogEntry(
                        r.offset,
                        header.producer_id,
                        header.producer_epoch,
                        header.is_transactional,
                        None,
                        r.value,
                    )
                    for r in records
                    if r.offset >= position
                )
            position = max(position, header.next_offset)
            progressed = True
            pos += header.size
        if not progressed or position >= res.high_watermark:
            return out


def wire_offset_fetch(
    client: WireClient,
    group: str,
    topic: str,
    partitions: Iterable[int],
    require_stable: bool,
    version: int = 7,
) -> dict[int, tuple[int, int]]:
    """OffsetFetch v7 -> {partition: (error code, committed offset)}."""
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i32

    mod = _mod("offset_fetch", version)
    req = mod.OffsetFetchRequest(
        group_id=GroupId(group),
        topics=(
            mod.OffsetFetchRequestTopic(
                name=TopicName(topic), partition_indexes=tuple(i32(p) for p in partitions)
            ),
        ),
        require_stable=require_stable,
    )
    r = client.send(req)
    out: dict[int, tuple[int, int]] = {}
    for t in r.topics:
        for p in t.partitions:
            out[int(p.partition_index)] = (int(p.error_code), int(p.committed_offset))
    if int(r.error_code) != 0:
        out = {p: (int(r.error_code), -1) for p in out}
    return out
