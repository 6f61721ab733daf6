"""One partition's log: segments, indexes, producer state, transaction index, offsets.

CONTRACT STUB — the public API below is fixed; the implementation is being written.

The server calls only what is here (and LogManager). Everything is synchronous (sans-IO with
respect to the network: plain file I/O, no asyncio); appends to one partition are serialised by
the single event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exactly.records.batch import BatchHeader
from exactly.storage.config import LogConfig
from exactly.storage.producer_state import AppendOrigin, ProducerStateEntry
from exactly.types import TopicPartition


class OffsetOutOfRangeError(Exception):
    """Fetch/ListOffsets outside [log_start_offset, log_end_offset]."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_offset: int  # assigned base offset, or the original one for a duplicate
    last_offset: int
    log_append_time: int  # -1 unless message.timestamp.type=LogAppendTime
    log_start_offset: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes  # whole batches, possibly empty
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[AbortedTxn, ...] | None  # only for read_committed


class PartitionLog:
    tp: TopicPartition
    directory: Path
    config: LogConfig

    @classmethod
    def open(
        cls,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        *,
        recovery_point: int | None,
        now_ms: int,
    ) -> PartitionLog:
        """Open (creating if absent). ``recovery_point`` None means 'clean shutdown, trust
        everything' is NOT assumed: callers pass the checkpointed recovery point, and recovery
        validates every batch after it (CRC, lengths), truncates a torn tail, rebuilds indexes that
        are missing or corrupt, loads producer state from snapshot + replay of the tail."""
        raise NotImplementedError

    # --- offsets --------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        raise NotImplementedError

    @property
    def log_end_offset(self) -> int:
        raise NotImplementedError

    @property
    def high_watermark(self) -> int:
        """Separate from LEO (replication later). Single broker: advanced by
        ``update_high_watermark`` right after each append."""
        raise NotImplementedError

    def update_high_watermark(self, offset: int) -> None:
        raise NotImplementedError

    @property
    def last_stable_offset(self) -> int:
        """min(first unstable offset, high watermark)."""
        raise NotImplementedError

    @property
    def recovery_point(self) -> int:
        raise NotImplementedError

    # --- writes ---------------------------------------------------------------------------
    def append(
        self,
        batch: bytearray,
        header: BatchHeader,
        *,
        leader_epoch: int,
        now_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendResult:
        """Append one validated batch (``header`` parsed from ``batch``). Assigns offsets by
        patching the base offset and partition leader epoch in place, asks producer state
        (duplicate -> original offsets, nothing written; errors raise ProducerStateError), writes,
        indexes, rolls segments by size/age (snapshotting producer state on roll), applies the
        producer state, honours flush.messages/flush.ms. Raises RecordTooLargeError... via
        InvalidRecordError(MESSAGE_TOO_LARGE) when the batch exceeds max.message.bytes."""
        raise NotImplementedError

    # --- reads ----------------------------------------------------------------------------
    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        read_committed: bool,
        min_one_batch: bool = True,
    ) -> ReadResult:
        """Whole batches starting at the batch containing ``fetch_offset``, bounded by the high
        watermark (or the LSO when read_committed), up to max_bytes (but at least one batch when
        min_one_batch). Raises OffsetOutOfRangeError outside [log_start_offset, LEO]."""
        raise NotImplementedError

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record batch with max timestamp >= timestamp."""
        raise NotImplementedError

    def producers(self) -> dict[int, ProducerStateEntry]:
        raise NotImplementedError

    # --- maintenance ----------------------------------------------------------------------
    def flush(self) -> None:
        raise NotImplementedError

    def apply_retention(self, now_ms: int) -> int:
        """Delete whole segments past retention.ms / retention.bytes (never the active one).
        Returns the number of segments deleted."""
        raise NotImplementedError

    def maybe_roll(self, now_ms: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush, snapshot producer state; the caller then writes the recovery checkpoint."""
        raise NotImplementedError

    def delete(self) -> None:
        raise NotImplementedError
