"""The per-partition offset checkpoints of one data directory (the files Kafka's LogManager and
ReplicaManager keep beside the partition directories), read once at start-up and rewritten whole.

Theory of operation
-------------------
A partition's *recovery point* is the offset below which its data was fsynced. The
``recovery-point-offset-checkpoint`` file holds the recovery points as of the last checkpoint:
written periodically (``due``: every ``log.flush.offset.checkpoint.interval.ms``; it only ever
records flushed data, because recovery points only move on flush) and at close after every
partition was flushed. Opening a partition validates everything after its checkpointed recovery
point, so after ``kill -9`` only the unflushed tail is scanned; a partition missing from the
checkpoint is validated from its start.

The *log start offset* checkpoint (Kafka's ``log-start-offset-checkpoint``, same format) lists the
partitions whose log start offset lies above their first segment's base offset, i.e. was moved by
DeleteRecords and not (yet) matched by segment deletion. The log manager rewrites it before a
DeleteRecords returns, so an acknowledged deletion survives ``kill -9``. Kafka writes it only every
log.flush.start.offset.checkpoint.interval.ms and accepts losing a recent deletion when every
replica crashes; a single broker has no other replica, so ``exactly`` writes it at once (one
fsynced file per DeleteRecords request, not per partition).

The *high watermark* checkpoint (Kafka's ``replication-offset-checkpoint``, same format) exists
in cluster mode only (``replicated=True``): a replica's HW is not its log end (a follower may hold
records the ISR has not acknowledged), so on open each partition's HW is the checkpointed one,
capped at the recovered log end (a partition missing from the file starts at its log start, as
Kafka's ``getOrElse(tp, 0)`` clamped). The replica manager writes it every
``replica.high.watermark.checkpoint.interval.ms`` and close writes it last. A single broker neither
writes nor reads it: everything that survived on its disk was acknowledged or is acknowledgeable,
so its HW is the recovered log end.

Every file is written through ``checkpoint.write_offset_checkpoint`` (durably, atomically).
A recovery-point or log-start write whose content equals what this instance last wrote is
skipped: that content is on disk already, durably. These writes run on the event loop (two
fsyncs, 15-35 ms each on this box's disk), and at steady state the periodic ones rewrite the same
offsets (recovery points move only on flush or roll, log starts only on DeleteRecords), so each
was a 30-70 ms stop of every produce, fetch and acks=all answer on the broker once a minute for
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from exactly.storage.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
DEFAULT_CHECKPOINT_INTERVAL_MS = 60_000  # Kafka's log.flush.offset.checkpoint.interval.ms


@dataclass(frozen=True, slots=True)
class StartOffsets:
    """What the checkpoints say at start-up; ``high_watermarks`` is None on a single broker."""

    recovery_points: Mapping[TopicPartition, int]
    log_starts: Mapping[TopicPartition, int]
    high_watermarks: Mapping[TopicPartition, int] | None


class LogCheckpoints:
    """The checkpoint files of ``data_dir``. Single-threaded, like its owner (the log manager).
    Invariant: a file only ever records state that is already durable (recovery points of flushed
    data; log starts and high watermarks the broker has acknowledged)."""

    def __init__(self, data_dir: Path, *, replicated: bool, interval_ms: int, now_ms: int) -> None:
        self.data_dir = data_dir
        self.replicated = replicated
        self.interval_ms = interval_ms
        self._last_ms = now_ms
        # file name -> the offsets last written to it by this instance (absent: unknown, write)
        self._written: dict[str, dict[TopicPartition, int]] = {}

    def read(self) -> StartOffsets:
        d = self.data_dir
        return StartOffsets(
            read_offset_checkpoint(d / RECOVERY_POINT_CHECKPOINT) or {},
            read_offset_checkpoint(d / LOG_START_OFFSET_CHECKPOINT) or {},
            (read_offset_checkpoint(d / REPLICATION_OFFSET_CHECKPOINT) or {}) if self.replicated else None,
        )

    def due(self, now_ms: int) -> bool:
        """Whether the periodic checkpoint is due; if so, the interval restarts at ``now_ms``."""
        if now_ms - self._last_ms < self.interval_ms:
            return False
        self._last_ms = now_ms
        return True

    def write_recovery_points(self, logs: Mapping[TopicPartition, PartitionLog]) -> None:
        """Every partition's recovery point (flushed data only, by construction)."""
        self._write_if_changed(
            RECOVERY_POINT_CHECKPOINT, {tp: plog.recovery_point for tp, plog in logs.items()}
        )

    def write_log_start_offsets(self, logs: Mapping[TopicPartition, PartitionLog]) -> None:
        """The log start offsets that the segments alone do not tell."""
        self._write_if_changed(
            LOG_START_OFFSET_CHECKPOINT,
            {
                tp: plog.log_start_offset
                for tp, plog in logs.items()
                if plog.log_start_offset > plog.segments[0].base_offset
            },
        )

    def _write_if_changed(self, name: str, offsets: dict[TopicPartition, int]) -> None:
        """Write ``offsets`` unless this instance last wrote exactly them (recorded only after
        the durable write returned, so a failed write is retried next time)."""
        if self._written.get(name) == offsets:
            return
        write_offset_checkpoint(self.data_dir / name, offsets)
        self._written[name] = offsets

    def write_high_watermarks(self, logs: Mapping[TopicPartition, PartitionLog]) -> None:
        """Cluster mode: every partition's high watermark. A no-op on a single broker."""
        write = self.high_watermark_write(logs)
        if write is not None:
            write()

    def high_watermark_write(self, logs: Mapping[TopicPartition, PartitionLog]) -> Callable[[], None] | None:
        """Cluster mode: the HW checkpoint as of now, as a call that writes it (from any thread:
        it holds a snapshot of the values, not the logs). None on a single broker."""
        if not self.replicated:
            return None
        offsets = {tp: plog.high_watermark for tp, plog in logs.items()}
        return partial(write_offset_checkpoint, self.data_dir / REPLICATION_OFFSET_CHECKPOINT, offsets)
