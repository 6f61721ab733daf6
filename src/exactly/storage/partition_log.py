"""One partition's log: segments, indexes, producer state, transaction index, offsets
(Kafka's UnifiedLog + LocalLog).

The server calls only what is here (and LogManager). Everything is synchronous (sans-IO with
respect to the network: plain file I/O, no asyncio); appends to one partition are serialised by
the single event loop.

Theory of operation
-------------------
*Append* (the hot path) touches only the 61-byte batch header: check max.message.bytes, patch the
base offset and partition leader epoch in place (both lie outside the CRC), stage the producer-state
change (``prepare_append``; a duplicate returns the original offsets and writes nothing), roll the
active segment if the batch does not fit, ``pwrite`` the bytes, then apply the staged change
(prepare -> persist -> complete). A COMMIT/ABORT marker completes a transaction: an aborted one
gets a transaction-index entry, and the first unstable offset (which holds back the LSO) moves.
Nothing is fsynced unless flush.messages says so; durability comes from ``flush`` (flush.ms via
the log manager, segment roll via ``flush_rolled_segments``, close).

*Read* bounds the request by the high watermark (or the LSO for read_committed) and hands it to
``log_read``, which holds the read path and the types reads answer with.

Offsets
-------
``log_start_offset <= last_stable_offset <= high_watermark <= log_end_offset`` and
``log_start_offset <= recovery_point <= log_end_offset``. The high watermark is separate from the
log end offset so replication can hold it back later; a single broker advances it right after each
append (``update_high_watermark``) and, on open, sets it to the recovered log end (everything that
survived on a single broker's disk was acknowledged or is acknowledgeable); a cluster replica opens
at its checkpointed HW instead (``replication-offset-checkpoint``, see ``log_manager``).

The log start offset
--------------------
It is its own number, not the first segment's base offset: DeleteRecords
(``increment_log_start_offset``) moves it to any offset up to the high watermark, possibly inside
a segment and even inside a batch, as Kafka allows. Reads below it raise OffsetOutOfRangeError; a
read at it returns the batch containing it (clients skip the records below their fetch offset,
as they do after any mid-batch fetch). Segments wholly below it are deleted by the retention path
(``apply_retention``), the one holding it stays. Retention deleting segments moves it up to the
new first segment. Producer state is kept, as in Kafka since KIP-360: a producer whose data is
all below the log start keeps its sequence state until producer-id expiration. An open
transaction that started below it stays open; the LSO is clamped to the log start (Kafka's
maybeIncrementFirstUnstableOffset). Persisting it is the log manager's job
(``log-start-offset-checkpoint``); ``open`` takes the checkpointed value.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from exactly.frozen import quick_init
from exactly.records.batch import (
    BatchHeader,
    InvalidRecordError,
    patch_offset_and_epoch,
    stamp_log_append_time,
)
from exactly.records.control import marker_of
from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import LeaderEpochCache
from exactly.storage.log_loader import LoadResult, load_log
from exactly.storage.log_maintenance import LogMaintenance, stable_offset
from exactly.storage.log_read import (
    AbortedTxn,
    OffsetOutOfRangeError,
    ReadResult,
    collect_aborted_transactions,
    offset_for_timestamp,
    read_batches,
)
from exactly.storage.producer_entry import ProducerStateEntry
from exactly.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    AppendOrigin,
    DuplicateBatch,
    ProducerAppendInfo,
    ProducerStateManager,
)
from exactly.storage.roll_policy import rolls_before_append, rolls_before_write
from exactly.storage.segment import LogSegment
from exactly.storage.txn_index import AbortedTxnEntry
from exactly.types import TopicPartition


@quick_init
@dataclass(frozen=True, slots=True)
class AppendResult:
    first_offset: int  # assigned base offset, or the original one for a duplicate
    last_offset: int
    log_append_time: int  # -1 unless message.timestamp.type=LogAppendTime
    log_start_offset: int
    duplicate: bool


class PartitionLog(LogMaintenance):
    """One partition's log (see the module docstring for the append and read paths).

    Owns: its directory, the segments (and through them every index file), the partition's
    ``ProducerStateManager`` (and its snapshots), its ``LeaderEpochCache``, and the offsets
    (log start, high watermark, LSO, recovery point).

    Lifecycle: created by ``open``, which recovers the directory (``log_loader``) before the log
    is usable; the ``LogManager`` then appends, reads, rolls, flushes and applies retention
    through it; ``close`` makes it durable (flush + producer snapshot) and closes every file,
    ``delete`` closes and removes the directory. Both end the object's use; ``close`` twice is a
    no-op.
    """

    tp: TopicPartition
    directory: Path
    config: LogConfig

    def __init__(
        self,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        *,
        loaded: LoadResult,
        producer_state: ProducerStateManager,
        leader_epochs: LeaderEpochCache,
        now_ms: int,
    ) -> None:
        self.directory = directory
        self.tp = tp
        self.config = config
        self.producer_state = producer_state
        self.leader_epochs = leader_epochs
        self.load_result = loaded  # what recovery did (tests, logs)
        self._segments: list[LogSegment] = loaded.segments
        self._bases: list[int] = [s.base_offset for s in self._segments]
        self._recovery_point = loaded.recovery_point
        # ``high_watermark``, ``log_start_offset`` and ``closed`` are plain attributes, not
        # properties: the fast paths read them per request (a call each per read; three, two and
        # one per latency-1k record, lat1k-s19.md, latp99-s20.md). Read-only outside this class
        # and ``LogMaintenance`` (which moves the start, and the high watermark with a truncation
        # or a start past it). The high watermark is separate from the log end (replication);
        # a single broker moves it to the log end right after each append; a cluster leader by
        # ``update_high_watermark``.
        self.high_watermark = self._segments[-1].next_offset
        self.log_start_offset = loaded.log_start_offset
        self._first_unstable: int | None = producer_state.first_unstable_offset()
        # min(first unstable offset, high watermark), at least the log start: a plain attribute
        # too (``LogMaintenance._refresh_lso``), set wherever one of the three changes
        self.last_stable_offset = self.high_watermark
        self._refresh_lso()
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms
        self.closed = False  # True once ``close`` or ``delete`` ended the log's use
        # The lowest offset a truncation cut the log to since the cleaner last asked
        # (``take_truncation``); the cleaner runs on its own thread, hence the lock.
        self._truncation_lock = threading.Lock()
        self._truncated_to: int | None = None
        self._layout_version = 0  # see ``LogMaintenance`` and ``storage.rolled_flush``
        self._rolled_in_flight: tuple[LogSegment, ...] = ()

    @classmethod
    def open(
        cls,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        *,
        recovery_point: int | None,
        now_ms: int,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        log_start_offset: int = 0,
        high_watermark: int | None = None,
    ) -> PartitionLog:
        """Open (creating if absent). ``recovery_point`` None means 'nothing is known to be
        flushed': the whole log is validated. Callers pass the checkpointed recovery point, and
        recovery validates every batch after it (CRC, lengths), truncates a torn tail, rebuilds
        indexes that are missing or corrupt, loads producer state from snapshot + replay of the
        tail (see log_loader). ``log_start_offset`` is the checkpointed one (the first segment's
        base offset wins when higher). ``high_watermark`` is a replica's checkpointed one, capped at
        the recovered log end; None (a single broker) makes it the log end."""
        directory.mkdir(parents=True, exist_ok=True)
        producer_state = ProducerStateManager(directory, producer_id_expiration_ms=producer_id_expiration_ms)
        leader_epochs = LeaderEpochCache(directory)
        loaded = load_log(
            directory,
            config,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            producer_state=producer_state,
            leader_epochs=leader_epochs,
            now_ms=now_ms,
        )
        opened = cls(
            directory,
            tp,
            config,
            loaded=loaded,
            producer_state=producer_state,
            leader_epochs=leader_epochs,
            now_ms=now_ms,
        )
        if high_watermark is not None:
            opened.update_high_watermark(high_watermark)
        return opened

    # --- offsets --------------------------------------------------------------------------
    def update_high_watermark(self, offset: int) -> None:
        """Set the high watermark, clamped to [log_start_offset, log_end_offset]."""
        self.high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)
        self._refresh_lso()

    def computed_last_stable_offset(self) -> int:
        """``last_stable_offset`` computed afresh from what it depends on (tests compare the
        attribute with it after every kind of change)."""
        return stable_offset(self._first_unstable, self.high_watermark, self.log_start_offset)

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        """Oldest first; the last one is the active segment."""
        return tuple(self._segments)

    # --- writes ---------------------------------------------------------------------------
    def append(
        self,
        batch: bytearray | memoryview,
        header: BatchHeader,
        *,
        leader_epoch: int,
        now_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendResult:
        """Append one validated batch (``header`` parsed from ``batch`` at ``header.position``).
        Assigns offsets by patching the base offset and partition leader epoch in place (and the
        max timestamp for LogAppendTime topics), asks producer state (duplicate -> original
        offsets, nothing written; errors raise ProducerStateError), writes, indexes, rolls
        segments by size/age (snapshotting producer state on roll), applies the producer state,
        honours flush.messages. Raises InvalidRecordError(MESSAGE_TOO_LARGE) when the batch
        exceeds max.message.bytes."""
        size = header.size
        position = header.position
        if size > self.config.max_message_bytes:
            raise InvalidRecordError(
                ErrorCode.message_too_large,
                f"batch of {size} bytes exceeds max.message.bytes {self.config.max_message_bytes}",
            )
        control_type, coordinator_epoch = marker_of(batch, header) if header.is_control else (None, -1)
        base_offset = self.log_end_offset
        log_append_time = -1
        if self.config.message_timestamp_type == "LogAppendTime":
            header = stamp_log_append_time(batch, header, now_ms)
            log_append_time = now_ms
        patch_offset_and_epoch(batch, header, base_offset, leader_epoch)
        header = BatchHeader.parse(batch, position)  # the patched header: half the cost of replace()

        staged = self.producer_state.prepare_append(
            header,
            origin=origin,
            now_ms=now_ms,
            control_type=control_type,
            coordinator_epoch=coordinator_epoch,
        )
        if isinstance(staged, DuplicateBatch):
            return AppendResult(
                first_offset=staged.first_offset,
                last_offset=staged.last_offset,
                log_append_time=staged.timestamp if log_append_time >= 0 else -1,
                log_start_offset=self.log_start_offset,
                duplicate=True,
            )
        self._write(batch, header, staged, now_ms)
        return AppendResult(
            first_offset=base_offset,
            last_offset=header.last_offset,
            log_append_time=log_append_time,
            log_start_offset=self.log_start_offset,
            duplicate=False,
        )

    def append_plain(
        self,
        batch: bytearray | memoryview,
        fields: tuple[int, ...],
        now_ms: int,
        leader_epoch: int | None = None,
    ) -> int | None:
        """``append`` of the usual client batch, or None (nothing changed: call ``append``).

        ``batch`` is exactly one validated, non-transactional, non-control batch and ``fields``
        its header as ``BatchHeader.parse`` unpacks it. Taken only on a CreateTime topic, within
        max.message.bytes, and when producer state accepts the batch as new
        (``prepare_plain``): duplicates and every producer-state error go to ``append``, which
        answers them. Does what ``append`` + ``_write`` do for that case, in the same order
        (offsets patched, producer state staged, roll, write, producer state applied, epoch
        cache, flush.messages), returning the base offset. Why a second path: the profile of a
        100 B-record produce shows ~45 Python calls between the handler and the segment write
        (header properties, the staged ``ProducerAppendInfo``, ``AppendResult``), a third of the
        Produce request's Python work; this takes ~12.

        ``leader_epoch`` None: a single broker (epoch 0, the high watermark moves to the log end
        here). A cluster leader passes its epoch and moves the high watermark by its replication
        rules afterwards (``Broker.after_append``), as after ``append``."""
        config = self.config
        epoch = 0 if leader_epoch is None else leader_epoch
        size = fields[1] + 12
        if size > config.max_message_bytes or config.message_timestamp_type != "CreateTime":
            return None
        active = self._segments[-1]
        base_offset = active.next_offset
        offset_delta = fields[6]
        pid = fields[9]
        entry: ProducerStateEntry | None = None
        if pid >= 0:
            entry = self.producer_state.prepare_plain(
                pid, fields[10], fields[11], offset_delta, base_offset, fields[8], now_ms
            )
            if entry is None:
                return None
        header = BatchHeader(base_offset, fields[1], 0, 2, *fields[4:], 0)  # type: ignore[call-arg]
        patch_offset_and_epoch(batch, header, base_offset, epoch)
        if rolls_before_write(active, size, base_offset + offset_delta, fields[8], config, now_ms):
            self.roll(now_ms)
            active = self._segments[-1]
        active.append(batch, header)
        next_offset = base_offset + offset_delta + 1
        self.producer_state.apply_plain(entry, next_offset)
        epochs = self.leader_epochs.entries
        if not epochs or epochs[-1].epoch != epoch or epochs[-1].start_offset > base_offset:
            self.leader_epochs.assign(epoch, base_offset)
        self._unflushed_messages += fields[12]
        if self._unflushed_messages >= config.flush_messages:
            self.flush(now_ms=now_ms)
        if leader_epoch is None:
            self.high_watermark = next_offset  # single broker: the HW is the log end
            first_unstable = self._first_unstable  # ``_refresh_lso``, inlined
            self.last_stable_offset = (
                next_offset
                if first_unstable is None
                else max(min(first_unstable, next_offset), self.log_start_offset)
            )
        return base_offset

    def append_as_follower(self, batch: bytearray | memoryview, header: BatchHeader, *, now_ms: int) -> None:
        """Append one batch exactly as the leader wrote it (Kafka's appendAsFollower): no byte
        changes, so its offsets, partition leader epoch and timestamps (a LogAppendTime topic's
        are the leader's clock) stay the leader's and every replica holds the same bytes.
        Producer state takes the REPLICATION origin (never raises on sequence or epoch: the log
        is the truth). No max.message.bytes check: the leader accepted the batch (Kafka checks
        client appends only). Raises ValueError when the batch starts below the log end. It may
        start past it: the leader's cleaner removed the batches in between (a compacted log has
        gaps, aborted data goes whole), and Kafka's follower takes such a batch too."""
        if header.base_offset < self.log_end_offset:
            raise ValueError(
                f"{self.tp}: a replicated batch starts at {header.base_offset}, the log ends at "
                f"{self.log_end_offset}"
            )
        control_type, coordinator_epoch = marker_of(batch, header)
        staged = self.producer_state.prepare_append(
            header,
            origin=AppendOrigin.REPLICATION,
            now_ms=now_ms,
            control_type=control_type,
            coordinator_epoch=coordinator_epoch,
        )
        if isinstance(staged, DuplicateBatch):  # not answered for REPLICATION; the contract says so
            raise ValueError(f"{self.tp}: replicated batch at {header.base_offset} taken for a duplicate")
        self._write(batch, header, staged, now_ms)

    def append_batches_as_follower(
        self, buf: bytearray | memoryview, headers: Sequence[BatchHeader], *, now_ms: int
    ) -> None:
        """``append_as_follower`` for consecutive batches of one fetch response, written from
        ``buf`` in place (each header's ``position`` is absolute in ``buf``: no batch is copied
        out). Per batch, in order: roll check, producer state, segment write, epoch cache and
        indexes, exactly as one-batch appends would do them, so the replica's bytes, segments
        and indexes are the same whichever way they arrived. Raises ValueError, before writing
        anything, unless the batches follow each other from the log end (gaps allowed: offsets a
        cleaner removed on the leader)."""
        expected = self.log_end_offset
        for header in headers:
            if header.base_offset < expected:
                raise ValueError(
                    f"{self.tp}: a replicated batch starts at {header.base_offset}, expected {expected}"
                )
            expected = header.next_offset
        for header in headers:
            self.append_as_follower(buf, header, now_ms=now_ms)

    def _write(
        self, batch: bytearray | memoryview, header: BatchHeader, staged: ProducerAppendInfo, now_ms: int
    ) -> None:
        """The persist and complete steps of an append whose producer state is staged."""
        if rolls_before_append(self._segments[-1], header, self.config, now_ms):
            self.roll(now_ms)  # Kafka's LocalLog.shouldRoll
        active = self._segments[-1]
        position, size = header.position, header.size
        if position == 0 and len(batch) == size:  # a Produce's records: exactly this batch
            active.append(batch, header)
        else:
            with memoryview(batch) as view:
                active.append(view[position : position + size], header)
        completed = self.producer_state.complete_append(staged)
        self.producer_state.update_map_end_offset(header.next_offset)
        if completed is not None:
            self._first_unstable = self.producer_state.first_unstable_offset()
            if completed.is_aborted:
                lso = completed.last_offset + 1 if self._first_unstable is None else self._first_unstable
                active.txn_index.append(
                    AbortedTxnEntry(completed.producer_id, completed.first_offset, completed.last_offset, lso)
                )
        elif header.is_transactional and self._first_unstable is None:
            self._first_unstable = self.producer_state.first_unstable_offset()
        self._refresh_lso()
        self.leader_epochs.assign(header.partition_leader_epoch, header.base_offset)
        self._unflushed_messages += header.record_count
        if self._unflushed_messages >= self.config.flush_messages:
            self.flush(now_ms=now_ms)

    # --- reads ----------------------------------------------------------------------------
    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        read_committed: bool,
        min_one_batch: bool = True,
        up_to_log_end: bool = False,
        slice_from: int | None = None,
    ) -> ReadResult:
        """Whole batches starting at the batch containing ``fetch_offset``, bounded by the high
        watermark (or the LSO when read_committed; the log end offset with ``up_to_log_end``, for
        a follower replica's fetch, Kafka's FetchIsolation.LOG_END), up to max_bytes (but at least
        one batch when min_one_batch). Data comes from one segment per call, as in Kafka. Raises
        OffsetOutOfRangeError outside [log_start_offset, LEO]. ``slice_from``: a read of at least
        that many bytes may come back as a ``FileSlice`` (see ``log_read``)."""
        log_start, log_end = self.log_start_offset, self.log_end_offset
        if fetch_offset < log_start or fetch_offset > log_end:
            raise OffsetOutOfRangeError(
                f"{self.tp}: offset {fetch_offset} is outside [{log_start}, {log_end}]"
            )
        hw = self.high_watermark
        lso = self.last_stable_offset
        bound = log_end if up_to_log_end else lso if read_committed else hw
        records, upper = read_batches(
            self._segments, self._bases, log_end, fetch_offset, bound, max_bytes, min_one_batch, slice_from
        )
        aborted: tuple[AbortedTxn, ...] | None = None
        if read_committed:
            aborted = self.collect_aborted_transactions(fetch_offset, upper) if records else ()
        return ReadResult(records, hw, lso, log_start, aborted)

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound: int) -> tuple[AbortedTxn, ...]:
        """Aborted transactions overlapping [fetch_offset, upper_bound) (see ``log_read``)."""
        return collect_aborted_transactions(self._segments, self._bases, fetch_offset, upper_bound)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch with max timestamp >= ``timestamp``,
        not bounded by the high watermark (see ``log_read``)."""
        return offset_for_timestamp(self._segments, self.log_start_offset, timestamp)

    def take_truncation(self) -> int | None:
        """The lowest offset the log was truncated to since the last call (None: no truncation),
        for the cleaner: its checkpoint must not stay above data that was replaced."""
        with self._truncation_lock:
            offset, self._truncated_to = self._truncated_to, None
        return offset

    def producers(self) -> dict[int, ProducerStateEntry]:
        return self.producer_state.active_producers()

    # --- maintenance (rolls, flushes, retention, truncation): inherited from LogMaintenance ---

    def close(self) -> None:
        """Flush, snapshot producer state; the caller then writes the recovery checkpoint."""
        if self.closed:
            return
        self._segments[-1].on_become_inactive()
        self.flush()
        self.producer_state.take_snapshot()
        for segment in self._segments:
            segment.close()
        self.closed = True

    def delete(self) -> None:
        self.leader_epochs.discard()  # no owed rewrite may recreate a file in the directory
        for segment in self._segments:
            segment.close()
        self.closed = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.tp}, start={self.log_start_offset}, end={self.log_end_offset}, "
            f"hw={self.high_watermark}, segments={len(self._segments)})"
        )
