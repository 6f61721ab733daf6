"""Opening a partition directory after a clean or unclean shutdown (Kafka's LogLoader).

Theory of operation
-------------------
The *recovery point* is an offset below which everything (log and indexes) was fsynced; the
caller has it from the recovery-point checkpoint. Loading does, in order:

1. Finish or roll back a swap of cleaned segments a crash interrupted (``cleaner.swap``: a
   committed ``*.swap`` replaces the segments it covers, ``*.cleaned`` files are dropped), then
   remove garbage of other interrupted operations (``*.tmp``) and index files whose log is gone.
2. Open every segment without reading it. Segments wholly below the recovery point are trusted:
   only their index file sizes are checked (an index that fails is rebuilt from the log), so restart
   time does not grow with the size of the log.
3. Validate the tail: the segment holding the recovery point from that offset on, and every later
   segment entirely, batch by batch (lengths, magic, CRC32C). The first invalid or incomplete
   batch is where the log ends: that segment is cut there and any later segment is deleted (it
   follows bytes that never fully reached the disk). Index entries of the validated part are
   rebuilt on the way. An empty segment with empty index files has nothing to validate and is
   left as opened (recovery would rewrite the empty files).
4. Producer state: load the newest valid snapshot at or below the recovery point (newer ones are
   dropped: they may describe log that was just cut), and replay batch headers from its offset to the log end. Replay also
   rebuilds the transaction-index entries (aborted transactions) from that offset on, since the
   first offset of an aborted transaction is only known from producer state. A snapshot at the log
   end is then taken so the next restart replays nothing.

The log start offset is the checkpointed one (DeleteRecords may have put it inside the first
segment), or the first segment's base offset when that is higher (segments were deleted after the
checkpoint), capped at the log end (recovery may have cut the tail below a checkpointed start).
Producer state is nevertheless rebuilt from the first segment's base: snapshots there are kept
for that, and replaying the segment part below the log start restores exactly the state the
running broker had.

Invariants on return: the last segment is the active one; ``next_offset`` of every segment is
known for the active one; the recovery point is <= the log end offset.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from exactly.records.control import ControlType, read_control_marker
from exactly.storage.cleaner.swap import recover_swaps
from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import LeaderEpochCache
from exactly.storage.producer_state import ProducerStateManager
from exactly.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    LOOKUP_CHUNK,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
)
from exactly.storage.txn_index import AbortedTxnEntry

log = logging.getLogger(__name__)

_GARBAGE_SUFFIXES = (".tmp", ".deleted", ".cleaned", ".swap")


@dataclass(frozen=True, slots=True)
class LoadResult:
    segments: list[LogSegment]
    recovery_point: int
    log_start_offset: int
    truncated_bytes: int  # bytes cut from a torn tail (0 after a clean shutdown)
    replayed_batches: int  # producer-state replay length (0 when a snapshot covered the log)


def new_segment(directory: Path, base_offset: int, config: LogConfig, now_ms: int) -> LogSegment:
    return LogSegment.create(
        directory,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        index_max_bytes=config.segment_index_bytes,
        now_ms=now_ms,
    )


def _segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segments present; deletes files that belong to no segment."""
    bases: set[int] = set()
    others: list[Path] = []
    for path in directory.iterdir():
        name = path.name
        if name.endswith(_GARBAGE_SUFFIXES):
            path.unlink(missing_ok=True)
            continue
        stem, dot, _ext = name.partition(".")
        if not (dot and len(stem) == 20 and stem.isdigit()):
            continue
        if name.endswith(LOG_SUFFIX):
            bases.add(int(stem))
        elif name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)):
            others.append(path)
    for path in others:
        if int(path.name[:20]) not in bases:
            path.unlink(missing_ok=True)
    return sorted(bases)


def _empty_with_empty_indexes(segment: LogSegment) -> bool:
    """An empty segment whose index files are empty too (a partition that never got a record, a
    segment just rolled): there is nothing to validate, and ``recover`` would only rewrite the
    two empty index files as empty (two ``open(O_TRUNC)``, each an inode change that waits for
    the filesystem journal: tens of ms on a busy disk, for every such partition of a restart).
    Left as opened, the segment is what ``recover`` would leave (no batch, next offset its base,
    indexes empty and loaded on first use). Index files that are not empty go through
    ``recover``, which empties them."""
    if segment.size:
        return False
    try:
        return segment.offset_index.path.stat().st_size == 0 and segment.time_index.path.stat().st_size == 0
    except FileNotFoundError:
        return False


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    recovery_point: int | None,
    producer_state: ProducerStateManager,
    leader_epochs: LeaderEpochCache,
    now_ms: int,
    log_start_offset: int = 0,
) -> LoadResult:
    """Open, validate and recover the segments of one partition; see the module docstring."""
    recover_swaps(directory)
    bases = _segment_bases(directory)
    if not bases:
        segments = [new_segment(directory, 0, config, now_ms)]
        producer_state.truncate_and_reload(log_start_offset=0, log_end_offset=0)
        leader_epochs.truncate_from_end(0, durable=False)
        return LoadResult(segments, 0, 0, 0, 0)
    segments = [
        LogSegment.open(
            directory,
            base,
            index_interval_bytes=config.index_interval_bytes,
            index_max_bytes=config.segment_index_bytes,
            now_ms=now_ms,
        )
        for base in bases
    ]
    log_start = segments[0].base_offset
    rp = log_start if recovery_point is None else max(recovery_point, log_start)

    # The segment holding the recovery point: the last one whose base offset is <= rp.
    first_unflushed = 0
    for i, segment in enumerate(segments):
        if segment.base_offset <= rp:
            first_unflushed = i
    for segment in segments[:first_unflushed]:
        if not segment.indexes_look_sane():
            log.warning("rebuilding indexes of %s", segment)
            segment.rebuild_indexes()

    truncated = 0
    for i in range(first_unflushed, len(segments)):
        segment = segments[i]
        sane = segment.indexes_look_sane()
        if sane and _empty_with_empty_indexes(segment):
            continue
        from_offset = rp if i == first_unflushed and sane else None
        cut = segment.recover(from_offset)
        if cut:
            truncated += cut
            log.warning("truncated %d invalid bytes at the end of %s", cut, segment)
            for doomed in segments[i + 1 :]:
                truncated += doomed.size
                log.warning("deleting %s: it follows invalid data", doomed)
                doomed.delete()
            del segments[i + 1 :]
            break

    log_end = segments[-1].next_offset
    rp = min(rp, log_end)
    leader_epochs.truncate_from_end(log_end, durable=False)
    replayed = rebuild_producer_state(segments, producer_state, leader_epochs, log_start, log_end, rp)
    start = min(max(log_start_offset, log_start), log_end)
    leader_epochs.truncate_from_start(start, durable=False)
    return LoadResult(segments, max(rp, start), start, truncated, replayed)


def rebuild_producer_state(
    segments: list[LogSegment],
    producer_state: ProducerStateManager,
    leader_epochs: LeaderEpochCache,
    log_start: int,
    log_end: int,
    recovery_point: int,
) -> int:
    """Snapshot + replay of the log from the snapshot offset; rebuilds txn-index entries there."""
    # load() drops snapshots above the recovery point (they may describe truncated log).
    replay_from = producer_state.load(log_start_offset=log_start, recovery_point=recovery_point)
    replay_from = max(replay_from, log_start)
    producer_state.delete_snapshots_before(log_start)
    replayed = 0
    for i, segment in enumerate(segments):
        segment_end = segments[i + 1].base_offset if i + 1 < len(segments) else log_end
        if segment_end <= replay_from:
            continue
        segment.txn_index.truncate_to(replay_from)
        start = 0
        if segment.base_offset < replay_from:
            found = segment.find_batch(replay_from)
            if found is None:
                continue
            start = found[0]
        for position, header in segment.scan(start, chunk=LOOKUP_CHUNK):
            if header.base_offset < replay_from:
                continue
            control_type: ControlType | None = None
            coordinator_epoch = -1
            if header.is_control and header.record_count > 0:
                try:
                    marker = read_control_marker(
                        segment.read(position, header.size), dataclasses.replace(header, position=0)
                    )
                    control_type, coordinator_epoch = marker.type, marker.coordinator_epoch
                except (ValueError, IndexError):
                    log.warning("unreadable control batch at offset %d", header.base_offset)
                    continue
            completed = producer_state.replay(header, control_type, coordinator_epoch=coordinator_epoch)
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch > leader_epochs.latest_epoch:
                # Only newer epochs, as Kafka's segment recovery: the checkpoint (durable on
                # every change, already cut at the log end) also holds epochs no batch carries
                # (a leader records (epoch, LEO) when elected), which older batches must not undo.
                leader_epochs.assign(epoch, header.base_offset)
            replayed += 1
            if completed is not None and completed.is_aborted:
                first_unstable = producer_state.first_unstable_offset()
                segment.txn_index.append(
                    AbortedTxnEntry(
                        completed.producer_id,
                        completed.first_offset,
                        completed.last_offset,
                        completed.last_offset + 1 if first_unstable is None else first_unstable,
                    )
                )
    producer_state.update_map_end_offset(log_end)
    if replayed or producer_state.latest_snapshot_offset() != log_end:
        producer_state.take_snapshot()
    return replayed
