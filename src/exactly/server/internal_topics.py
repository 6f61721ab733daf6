"""The coordinators' window on the log: append records to and replay records from the internal
topics ``__consumer_offsets`` and ``__transaction_state``, and write transaction markers.

Why one module: both coordinators persist by appending Kafka-format key/value records to
partitions of ordinary (compacted) topics and recover by replaying them; the transaction
coordinator also writes COMMIT/ABORT control batches to any partition. Storage is synchronous,
so an append either returned its base offset or raised by the time this call returns; there is
nothing to await (acks=all is immediate with one replica).

Internal topics are created lazily, like Kafka does on the first FindCoordinator, with Kafka's
defaults (50 partitions, compacted, 100 MiB segments), and before replay at start-up when they
already exist on disk.

In cluster mode (the broker has a replica manager) the topics are cluster topics: created
through the cluster admin path (``ClusterTopics.request_internal_topic``) with
``offsets.topic.replication.factor`` / ``transaction.state.log.replication.factor`` and, for the
transaction log, ``min.insync.replicas`` = ``transaction.state.log.min.isr``; appends and markers
go through the partition's leadership and are acknowledged only once the ISR has them
(:meth:`InternalTopics.append_replicated`, :meth:`InternalTopics.write_marker_replicated`: Kafka's
acks=-1 with ``offsets.commit.timeout.ms``). The synchronous :meth:`InternalTopics.append` and
:meth:`InternalTopics.write_marker` are the single broker's.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from exactly.frozen import quick_init
from exactly.records.batch import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    InvalidRecordError,
)
from exactly.records.builder import Record, build_batch, payload_key_values, record_key_values
from exactly.records.control import ControlType, build_control_batch, control_type, control_type_at
from exactly.server.clock import now_ms
from exactly.storage.config import InvalidConfigError
from exactly.storage.leader_epoch import INITIAL_LEADER_EPOCH
from exactly.storage.log_manager import TopicExistsError, TopicInfo
from exactly.storage.partition_log import PartitionLog
from exactly.storage.producer_state import AppendOrigin, ProducerStateError
from exactly.topics import CONSUMER_OFFSETS_TOPIC
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.internal")

REPLAY_CHUNK = 4 * 1024 * 1024
# What a load reads of each batch header: base offset, batch length, magic, attributes, last
# offset delta, producer id, record count (the 61-byte v2 header, the rest skipped).
_WALK = struct.Struct(">qi4xb4xhi16xq6xi")


class AppendFailed(Exception):
    """An append to an internal topic or a marker write failed; ``error_code`` says why."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@quick_init
@dataclass(frozen=True, slots=True)
class ReplayedBatch:
    """One batch of an internal partition, decoded for replay."""

    partition: int
    base_offset: int
    producer_id: int
    is_transactional: bool
    control: ControlType | None  # set for COMMIT/ABORT markers
    records: tuple[tuple[int, bytes | None, bytes | None], ...]  # (offset, key, value)


class InternalTopics:
    """The coordinators' window on the log: ``__consumer_offsets`` and ``__transaction_state``.

    Owns no state of its own (the partitions belong to the broker's LogManager); it creates the
    internal topics on first use and appends to / replays them for the coordinator runtimes and
    the marker writer. Lives as long as the broker.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    # ---- topics -----------------------------------------------------------------------------
    def partitions_of(self, name: str) -> int:
        if name == CONSUMER_OFFSETS_TOPIC:
            return self.broker.config.get_int("offsets.topic.num.partitions")
        return self.broker.config.get_int("transaction.state.log.num.partitions")

    @property
    def replicated(self) -> bool:
        """Cluster mode: the internal topics are replicated cluster topics."""
        return self.broker.replicas is not None

    def _overrides(self, name: str) -> dict[str, str]:
        cfg = self.broker.config
        if name == CONSUMER_OFFSETS_TOPIC:
            return {"cleanup.policy": "compact", "segment.bytes": cfg.get("offsets.topic.segment.bytes")}
        overrides = {
            "cleanup.policy": "compact",
            "segment.bytes": cfg.get("transaction.state.log.segment.bytes"),
        }
        if self.replicated:
            overrides["min.insync.replicas"] = cfg.get("transaction.state.log.min.isr")
        return overrides

    def request(self, name: str) -> ErrorCode:
        """Make sure ``name`` exists (FindCoordinator's first lookup creates it): NONE when it
        does, else COORDINATOR_NOT_AVAILABLE (cluster mode: until the admin path has written it
        and the cache has seen it; never when storage refuses on a single broker)."""
        replicas = self.broker.replicas
        if replicas is None:
            try:
                self.ensure(name)
            except AppendFailed as exc:
                log.error("cannot create %s: %s", name, exc)
                return ErrorCode.coordinator_not_available
            return ErrorCode.none
        rf_key = (
            "offsets.topic.replication.factor"
            if name == CONSUMER_OFFSETS_TOPIC
            else "transaction.state.log.replication.factor"
        )
        return replicas.topics.request_internal_topic(
            name, self.partitions_of(name), self.broker.config.get_int(rf_key), self._overrides(name)
        )

    def ensure(self, name: str) -> TopicInfo:
        """Single broker: the local topic, created on first use."""
        info = self.broker.logs.topic(name)
        if info is not None:
            return info
        if self.replicated:  # cluster topics are created by the admin path only
            raise AppendFailed(ErrorCode.not_coordinator, f"{name} is not created yet")
        overrides = self._overrides(name)
        try:
            info = self.broker.logs.create_topic(
                name, self.partitions_of(name), overrides, now_ms=now_ms(), internal=True
            )
        except TopicExistsError:
            existing = self.broker.logs.topic(name)
            assert existing is not None
            return existing
        except InvalidConfigError as exc:  # pragma: no cover - our own overrides are valid
            raise AppendFailed(ErrorCode.unknown_server_error, str(exc)) from exc
        log.info("created internal topic %s with %d partitions", name, info.partitions)
        return info

    def _partition(self, topic: str, partition: int) -> PartitionLog:
        self.ensure(topic)
        plog = self.broker.logs.get_partition(TopicPartition(topic, partition))
        if plog is None:
            raise AppendFailed(ErrorCode.not_coordinator, f"{topic}-{partition} does not exist")
        return plog

    # ---- writes -----------------------------------------------------------------------------
    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None]],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
        transactional: bool = False,
    ) -> int:
        """Append key/value records (value None = tombstone) as one batch; returns its base
        offset. Transactional batches (TxnOffsetCommit) carry the producer's id and epoch so the
        partition's producer state tracks the open transaction and its marker completes it."""
        plog = self._partition(topic, partition)
        now = now_ms()
        raw = _records_batch(records, producer_id, producer_epoch, transactional, now)
        return self._append_raw(plog, raw, now)

    def write_marker(
        self,
        tp: TopicPartition,
        result: ControlType,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> bool:
        """Append a COMMIT/ABORT marker. Returns False when the partition no longer exists (its
        topic was deleted: nothing to complete there). Raises AppendFailed on storage errors."""
        plog = self.broker.logs.get_partition(tp)
        if plog is None:
            return False
        now = now_ms()
        raw = _marker_batch(result, producer_id, producer_epoch, coordinator_epoch, now)
        self._append_raw(plog, raw, now)
        return True

    # ---- cluster mode: leader appends acknowledged by the ISR ---------------------------------
    async def append_replicated(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None]],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
        transactional: bool = False,
    ) -> int:
        """:meth:`append` on a cluster: only as the partition's leader (NOT_LEADER_OR_FOLLOWER
        otherwise), refused before writing when the ISR is below min.insync.replicas
        (NOT_ENOUGH_REPLICAS), returned once the high watermark passed the batch (else
        REQUEST_TIMED_OUT / NOT_LEADER_OR_FOLLOWER / NOT_ENOUGH_REPLICAS_AFTER_APPEND). The
        coordinators map these to their own errors."""
        now = now_ms()
        raw = _records_batch(records, producer_id, producer_epoch, transactional, now)
        return await self._append_acked(TopicPartition(topic, partition), raw, now)

    async def write_marker_replicated(
        self,
        tp: TopicPartition,
        result: ControlType,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> None:
        """:meth:`write_marker` on a cluster, as the partition's leader with acks=-1 (Kafka's
        WriteTxnMarkers handling); raises AppendFailed (UNKNOWN_TOPIC_OR_PARTITION for a partition
        the cluster does not have, TRANSACTION_COORDINATOR_FENCED from the producer state, ...)."""
        now = now_ms()
        raw = _marker_batch(result, producer_id, producer_epoch, coordinator_epoch, now)
        await self._append_acked(tp, raw, now)

    async def _append_acked(self, tp: TopicPartition, raw: bytes, now: int) -> int:
        replicas = self.broker.replicas
        assert replicas is not None, "cluster mode only"
        code, leader = replicas.leader_for_write(tp)
        plog = self.broker.logs.get_partition(tp)
        if leader is None or plog is None:
            if code == ErrorCode.none:
                code = ErrorCode.not_leader_or_follower
            raise AppendFailed(code, f"{tp}: this broker does not lead it")
        min_isr = plog.config.min_insync_replicas
        code = leader.check_before_append(-1, min_isr)
        if code != ErrorCode.none:
            raise AppendFailed(code, f"{tp}: ISR {list(leader.isr)} below min.insync.replicas {min_isr}")
        base = self._append_raw(plog, raw, now, leader_epoch=leader.leader_epoch)
        timeout_s = self.broker.config.get_int("offsets.commit.timeout.ms") / 1000
        code = await replicas.wait_for_acks(tp, leader, plog.log_end_offset, min_isr, timeout_s)
        if code != ErrorCode.none:
            raise AppendFailed(code, f"{tp}: not acknowledged by the ISR ({code.name})")
        return base

    def _append_raw(
        self, plog: PartitionLog, raw: bytes, now: int, *, leader_epoch: int = INITIAL_LEADER_EPOCH
    ) -> int:
        buf = bytearray(raw)
        header = BatchHeader.parse(buf, 0)
        try:
            result = plog.append(
                buf, header, leader_epoch=leader_epoch, now_ms=now, origin=AppendOrigin.COORDINATOR
            )
        except (InvalidRecordError, ProducerStateError) as exc:
            raise AppendFailed(exc.error_code, str(exc)) from exc
        except OSError as exc:
            log.error("storage error appending to %s: %s", plog.tp, exc)
            raise AppendFailed(ErrorCode.kafka_storage_error, str(exc)) from exc
        self.broker.after_append(plog)
        return result.first_offset

    # ---- replay -----------------------------------------------------------------------------
    def replay(self, topic: str, partitions: Iterable[int] | None = None) -> Iterator[ReplayedBatch]:
        """Every batch of ``partitions`` (default: every partition) of ``topic`` in offset order
        (nothing if the topic does not exist yet). Reads up to the log end: with one replica
        everything appended is durable as far as this broker can know (recovery already truncated
        torn tails); a new cluster leader reads to its log end too, as Kafka's loads do."""
        info = self.broker.logs.topic(topic)
        if info is None:
            return
        for partition in range(info.partitions) if partitions is None else sorted(partitions):
            plog = self.broker.logs.get_partition(TopicPartition(topic, partition))
            if plog is None:
                continue
            offset = plog.log_start_offset
            while offset < plog.log_end_offset:
                data = plog.read(
                    offset, REPLAY_CHUNK, read_committed=False, min_one_batch=True, up_to_log_end=True
                ).records
                assert isinstance(data, bytes)  # no slice_from: a copy, never a FileSlice
                if not data:
                    break
                offset = yield from _walk(data, partition, offset)


def _walk(data: bytes, partition: int, offset: int) -> Generator[ReplayedBatch, None, int]:
    """Yield the batches of ``data`` (whole, valid v2 batches up to the first torn or invalid
    one, as :func:`iter_batches` reads them) that end past ``offset``; returns the offset after
    the last one yielded (``offset`` if none).

    Why not ``iter_batches``: a load walks every batch of its partitions, on a compacted
    ``__consumer_offsets`` mostly COMMIT markers kept for ``delete.retention.ms``. Only the
    fields the replay needs are unpacked, a marker's type is read without a parsed header and
    the records of an uncompressed batch straight from its payload; a :class:`BatchHeader` is
    built only for a compressed batch or a marker in a layout the quick read does not take."""
    limit = len(data)
    pos = 0
    walk = _WALK.unpack_from
    view = memoryview(data)
    while pos + HEADER_SIZE <= limit:
        base_offset, batch_length, magic, attributes, last_delta, producer_id, count = walk(data, pos)
        size = batch_length + LOG_OVERHEAD
        if magic != 2 or batch_length < MIN_BATCH_LENGTH or pos + size > limit:
            break
        next_offset = base_offset + last_delta + 1
        if next_offset > offset:
            offset = next_offset
            if attributes & CONTROL_FLAG:
                # A marker the log cleaner emptied (no records; kept for its producer's epoch)
                # decides no transaction, as Kafka's loaders skip it.
                if count:
                    control = control_type_at(data, pos)
                    if control is None:
                        control = control_type(data, BatchHeader.parse(data, pos))
                    transactional = bool(attributes & TRANSACTIONAL_FLAG)
                    yield ReplayedBatch(partition, base_offset, producer_id, transactional, control, ())
            else:
                if attributes & COMPRESSION_MASK:
                    entries = record_key_values(data, BatchHeader.parse(data, pos))
                else:
                    entries = payload_key_values(view[pos + HEADER_SIZE : pos + size], base_offset, count)
                yield ReplayedBatch(
                    partition, base_offset, producer_id, bool(attributes & TRANSACTIONAL_FLAG), None, entries
                )
        pos += size
    return offset


def _records_batch(
    records: Sequence[tuple[bytes, bytes | None]],
    producer_id: int,
    producer_epoch: int,
    transactional: bool,
    now: int,
) -> bytes:
    """One batch of a coordinator's key/value records (no sequences: coordinators write without
    idempotence; transactional offset commits carry the producer's id and epoch)."""
    return build_batch(
        [Record(key=k, value=v) for k, v in records],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        transactional=transactional,
        base_timestamp=now,
    )


def _marker_batch(
    result: ControlType, producer_id: int, producer_epoch: int, coordinator_epoch: int, now: int
) -> bytes:
    """A COMMIT/ABORT control batch for ``producer_id``, stamped with the coordinator epoch."""
    return build_control_batch(
        result,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        coordinator_epoch=coordinator_epoch,
        timestamp=now,
    )
