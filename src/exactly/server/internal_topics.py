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
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from exactly.records.batch import BatchHeader, InvalidRecordError, iter_batches
from exactly.records.builder import Record, build_batch, decode_batch
from exactly.records.control import ControlType, build_control_batch, read_control_marker
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


class AppendFailed(Exception):
    """An append to an internal topic or a marker write failed; ``error_code`` says why."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


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

    def ensure(self, name: str) -> TopicInfo:
        info = self.broker.logs.topic(name)
        if info is not None:
            return info
        segment_key = (
            "offsets.topic.segment.bytes"
            if name == CONSUMER_OFFSETS_TOPIC
            else "transaction.state.log.segment.bytes"
        )
        overrides = {
            "cleanup.policy": "compact",
            "segment.bytes": self.broker.config.get(segment_key),
        }
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
        raw = build_batch(
            [Record(key=k, value=v) for k, v in records],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=-1,
            transactional=transactional,
            base_timestamp=now,
        )
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
        raw = build_control_batch(
            result,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp=now,
        )
        self._append_raw(plog, raw, now)
        return True

    def _append_raw(self, plog: PartitionLog, raw: bytes, now: int) -> int:
        buf = bytearray(raw)
        header = BatchHeader.parse(buf, 0)
        try:
            result = plog.append(
                buf, header, leader_epoch=INITIAL_LEADER_EPOCH, now_ms=now, origin=AppendOrigin.COORDINATOR
            )
        except (InvalidRecordError, ProducerStateError) as exc:
            raise AppendFailed(exc.error_code, str(exc)) from exc
        except OSError as exc:
            log.error("storage error appending to %s: %s", plog.tp, exc)
            raise AppendFailed(ErrorCode.kafka_storage_error, str(exc)) from exc
        self.broker.after_append(plog)
        return result.first_offset

    # ---- replay -----------------------------------------------------------------------------
    def replay(self, topic: str) -> Iterator[ReplayedBatch]:
        """Every batch of every partition of ``topic`` in offset order (nothing if the topic does
        not exist yet). Reads up to the log end: with one replica everything appended is durable
        as far as this broker can know (recovery already truncated torn tails)."""
        info = self.broker.logs.topic(topic)
        if info is None:
            return
        for partition in range(info.partitions):
            plog = self.broker.logs.get_partition(TopicPartition(topic, partition))
            if plog is None:
                continue
            offset = plog.log_start_offset
            while offset < plog.log_end_offset:
                data = plog.read(offset, REPLAY_CHUNK, read_committed=False, min_one_batch=True).records
                if not data:
                    break
                for header in iter_batches(data):
                    if header.next_offset <= offset:
                        continue
                    control = None
                    entries: tuple[tuple[int, bytes | None, bytes | None], ...] = ()
                    if header.is_control:
                        control = read_control_marker(data, header).type
                    else:
                        _h, recs = decode_batch(data, header.position)
                        entries = tuple((r.offset, r.key, r.value) for r in recs)
                    yield ReplayedBatch(
                        partition,
                        header.base_offset,
                        header.producer_id,
                        header.is_transactional,
                        control,
                        entries,
                    )
                    offset = header.next_offset
