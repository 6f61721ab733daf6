"""Which log to clean next and where each log's dirty section starts (Kafka's LogCleanerManager
and LogCleaner.cleanFilthiestLog), for one data directory.

Theory of operation
-------------------
The *cleaner checkpoint* ``<data_dir>/cleaner-offset-checkpoint`` (Kafka's format and name, see
``storage.checkpoint``) holds, per compacted partition, the first dirty offset: everything below
it has been cleaned at least once. A pass over a log ends at an offset that becomes the new
checkpoint (``done_cleaning``). The file is rewritten durably after each pass; losing it only
costs work (the whole log counts as dirty again).

``grab_filthiest`` looks at every compacted log that is not being cleaned and not marked
uncleanable, computes its cleanable range and dirty ratio (``cleanable``), resets a checkpoint
that is out of range, and picks the eligible log with the highest ratio, marking it in progress.
``clean_filthiest`` runs one pass over it; a failure marks the partition *uncleanable* with a log
line and the cleaner carries on with the others (Kafka's ``uncleanable-partitions-count``).

Truncation and deletion: ``maybe_truncate_checkpoint`` lowers a checkpoint above a new log end
(a follower's truncation), ``remove`` forgets a deleted partition.

Thread safety: the manager's state is guarded by one lock, so a cleaner thread and the event loop
(truncation, deletion, metrics) may call it concurrently; the checkpoint file is written outside
it (under a lock of its own), so no reader of the state waits for the file's fsyncs. The logs themselves are not locked
here; ``runner`` says how a pass and the event loop share a log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from exactly.storage.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from exactly.storage.cleaner.cleanable import LogToClean, cleanable_offsets, log_to_clean
from exactly.storage.cleaner.cleaner import Cleaner, CleanerStats, CleaningAbortedError
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"


@dataclass(frozen=True, slots=True)
class Candidate:
    tp: TopicPartition
    log: PartitionLog
    to_clean: LogToClean


@dataclass(frozen=True, slots=True)
class PassResult:
    tp: TopicPartition
    end_offset: int
    stats: CleanerStats
    ratio: float


class LogCleanerManager:
    """Cleaner checkpoint, in-progress and uncleanable partitions of one data directory.

    Owns ``<data_dir>/cleaner-offset-checkpoint``. Lifecycle: created with the log manager of the
    directory (reads the checkpoint), used by the cleaner thread(s) until the broker stops."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._path = data_dir / CLEANER_OFFSET_CHECKPOINT
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._checkpoints: dict[TopicPartition, int] = read_offset_checkpoint(self._path) or {}
        self._in_progress: set[TopicPartition] = set()
        self._uncleanable: dict[TopicPartition, str] = {}
        self.dirtiest_ratio = 0.0
        self.max_compaction_delay_ms = 0
        self._ratios: dict[TopicPartition, float] = {}

    # --- checkpoint ---------------------------------------------------------------------------
    def checkpoints(self) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._checkpoints)

    def _write(self) -> None:
        """Rewrite the file (fsyncs) with the checkpoints as they are when its turn comes: outside
        ``_lock``, so the event loop's readers (metrics, the dirty ratios) never wait for a disk,
        and under ``_write_lock``, so a slower writer never puts older checkpoints back."""
        with self._write_lock:
            with self._lock:
                snapshot = dict(self._checkpoints)
            write_offset_checkpoint(self._path, snapshot)

    def update_checkpoint(self, tp: TopicPartition, offset: int | None) -> None:
        """Set (or, with None, remove) a partition's first dirty offset and rewrite the file."""
        with self._lock:
            if offset is None:
                if self._checkpoints.pop(tp, None) is None:
                    return
            else:
                self._checkpoints[tp] = offset
        self._write()

    def maybe_truncate_checkpoint(self, tp: TopicPartition, log_end_offset: int) -> None:
        """After a truncation: a checkpoint above the new log end comes down to it."""
        with self._lock:
            current = self._checkpoints.get(tp)
            if current is None or current <= log_end_offset:
                return
            self._checkpoints[tp] = log_end_offset
        self._write()

    def remove(self, tp: TopicPartition) -> None:
        with self._lock:
            self._uncleanable.pop(tp, None)
            self._ratios.pop(tp, None)
        self.update_checkpoint(tp, None)

    # --- state --------------------------------------------------------------------------------
    def uncleanable(self) -> dict[TopicPartition, str]:
        with self._lock:
            return dict(self._uncleanable)

    def mark_uncleanable(self, tp: TopicPartition, reason: str) -> None:
        with self._lock:
            self._uncleanable[tp] = reason
            self._in_progress.discard(tp)

    def dirty_ratios(self) -> dict[TopicPartition, float]:
        """Each compacted log's dirty ratio at the last check (metrics, ``topics describe``)."""
        with self._lock:
            return dict(self._ratios)

    def in_progress(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._in_progress)

    # --- choosing -----------------------------------------------------------------------------
    def dirty_state(self, plog: PartitionLog, now_ms: int) -> LogToClean:
        """The log's cleanable range and ratio (resetting an out-of-range checkpoint, and
        lowering one above an offset the log was truncated to since the last look: the data
        appended after a truncation is dirty even where the old checkpoint says clean)."""
        truncated_to = plog.take_truncation()
        if truncated_to is not None:
            self.maybe_truncate_checkpoint(plog.tp, truncated_to)
        with self._lock:
            checkpoint = self._checkpoints.get(plog.tp)
        offsets = cleanable_offsets(
            plog.segments,
            log_start_offset=plog.log_start_offset,
            log_end_offset=plog.log_end_offset,
            last_stable_offset=plog.last_stable_offset,
            high_watermark=plog.high_watermark,
            checkpoint=checkpoint,
            config=plog.config,
            now_ms=now_ms,
            name=str(plog.tp),
        )
        if offsets.force_update_checkpoint:
            self.update_checkpoint(plog.tp, offsets.first_dirty_offset)
        return log_to_clean(plog.segments, offsets, plog.config, now_ms)

    def grab_filthiest(self, logs: Iterable[PartitionLog], now_ms: int) -> Candidate | None:
        """The eligible compacted log with the highest dirty ratio, now marked in progress."""
        with self._lock:
            skip = self._in_progress | set(self._uncleanable)
        candidates: list[Candidate] = []
        max_delay = 0
        for plog in logs:
            if not plog.config.compact or plog.tp in skip:
                continue
            if len(plog.segments) < 2:
                # Only the active segment, which is never cleaned: nothing cleanable, ratio 0 (as
                # Kafka's for no cleanable bytes). The common case of a broker's many compacted
                # partitions (50 of __consumer_offsets, mostly idle), checked on the event loop
                # at every back-off: skip the range computation, keep the truncation bookkeeping.
                truncated_to = plog.take_truncation()
                if truncated_to is not None:
                    self.maybe_truncate_checkpoint(plog.tp, truncated_to)
                with self._lock:
                    self._ratios[plog.tp] = 0.0
                continue
            to_clean = self.dirty_state(plog, now_ms)
            with self._lock:
                self._ratios[plog.tp] = to_clean.cleanable_ratio
            max_delay = max(max_delay, to_clean.compaction_delay_ms)
            if to_clean.total_bytes > 0:
                candidates.append(Candidate(plog.tp, plog, to_clean))
        self.dirtiest_ratio = max((c.to_clean.cleanable_ratio for c in candidates), default=0.0)
        self.max_compaction_delay_ms = max_delay
        eligible = [c for c in candidates if c.to_clean.is_eligible(c.log.config.min_cleanable_dirty_ratio)]
        if not eligible:
            return None
        chosen = max(eligible, key=lambda c: c.to_clean.cleanable_ratio)
        with self._lock:
            self._in_progress.add(chosen.tp)
        return chosen

    def done_cleaning(self, tp: TopicPartition, end_offset: int) -> None:
        with self._lock:
            self._in_progress.discard(tp)
        self.update_checkpoint(tp, end_offset)

    def abort_cleaning(self, tp: TopicPartition) -> None:
        with self._lock:
            self._in_progress.discard(tp)


def clean_filthiest(
    manager: LogCleanerManager,
    cleaner: Cleaner,
    logs: Iterable[PartitionLog],
    now_ms: int,
    *,
    retention: bool = True,
) -> PassResult | None:
    """One pass over the filthiest eligible log (Kafka's cleanFilthiestLog); None when no log is
    eligible. A failure marks the partition uncleanable and is logged, never raised; a pass the
    log's owner overtook (segments deleted or truncated meanwhile) is dropped, the partition stays
    cleanable. With ``retention`` a compact,delete log then gets its retention (a cleaner thread
    leaves that to the owner's periodic maintenance, which applies it anyway)."""
    candidate = manager.grab_filthiest(logs, now_ms)
    if candidate is None:
        return None
    tp = candidate.tp
    try:
        end_offset, stats = cleaner.clean(candidate.log, candidate.to_clean, now_ms)
    except (CleaningAbortedError, FileNotFoundError) as exc:
        log.info("cleaning %s aborted: %s", tp, exc)
        manager.abort_cleaning(tp)
        return None
    except Exception as exc:  # one partition's failure must not stop the cleaner
        log.exception("cleaning %s failed; marking it uncleanable", tp)
        manager.mark_uncleanable(tp, f"{type(exc).__name__}: {exc}")
        return None
    manager.done_cleaning(tp, end_offset)
    if retention and candidate.log.config.delete:
        candidate.log.apply_retention(now_ms)
    log.info(
        "cleaned %s up to %d: %d -> %d bytes, %d -> %d records in %.3f s",
        tp,
        end_offset,
        stats.bytes_read,
        stats.bytes_written,
        stats.records_read,
        stats.records_written,
        stats.elapsed_s,
    )
    return PassResult(tp, end_offset, stats, candidate.to_clean.cleanable_ratio)
