"""Helpers for the cleaner tests, in the shape of Kafka's LogCleanerTest utilities: keyed and
transactional appends, one cleaning pass, and what the log holds afterwards."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from exactly.records.batch import BatchHeader
from exactly.records.builder import Record, build_batch, decode_batch
from exactly.storage.cleaner.cleanable import cleanable_offsets, log_to_clean
from exactly.storage.cleaner.cleaner import Cleaner, CleanerStats, segment_batches
from exactly.storage.cleaner.offset_map import BYTES_PER_ENTRY, OffsetMap
from exactly.storage.cleaner.swap import SwapHook
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import AppendResult, PartitionLog
from exactly.storage.producer_state import AppendOrigin
from tests.storage.helpers import NOW, TP, append_marker

COMPACT = LogConfig(cleanup_policy="compact", segment_bytes=1024, index_interval_bytes=64)

Kv = tuple[int, int | None]  # (key, value); value None is a tombstone


def key_bytes(key: int) -> bytes:
    return str(key).encode()


def append_keyed(
    log: PartitionLog,
    items: Iterable[Kv | int],
    *,
    producer_id: int = -1,
    epoch: int = 0,
    seq: int = -1,
    transactional: bool = False,
    timestamp: int = NOW,
    now_ms: int = NOW,
) -> AppendResult:
    """One batch of keyed records; a bare int ``k`` stands for (k, k)."""
    records = []
    for item in items:
        key, value = (item, item) if isinstance(item, int) else item
        records.append(Record(key=key_bytes(key), value=None if value is None else str(value).encode()))
    batch = bytearray(
        build_batch(
            records,
            producer_id=producer_id,
            producer_epoch=epoch if producer_id >= 0 else -1,
            base_sequence=seq,
            transactional=transactional,
            base_timestamp=timestamp,
        )
    )
    result = log.append(batch, BatchHeader.parse(batch), leader_epoch=0, now_ms=now_ms)
    log.update_high_watermark(log.log_end_offset)
    return result


class TxnProducer:
    """A transactional (or idempotent) producer appending keyed batches with rising sequences
    (Kafka's appendTransactionalAsLeader / appendIdempotentAsLeader)."""

    def __init__(self, log: PartitionLog, pid: int, epoch: int = 0, *, transactional: bool = True) -> None:
        self.log, self.pid, self.epoch, self.transactional = log, pid, epoch, transactional
        self.seq = 0

    def __call__(self, keys: Sequence[Kv | int], *, timestamp: int = NOW) -> AppendResult:
        result = append_keyed(
            self.log,
            keys,
            producer_id=self.pid,
            epoch=self.epoch,
            seq=self.seq,
            transactional=self.transactional,
            timestamp=timestamp,
        )
        self.seq += len(keys)
        return result

    def commit(self, *, now_ms: int = NOW) -> AppendResult:
        return append_marker(self.log, self.pid, self.epoch, abort=False, now_ms=now_ms)

    def abort(self, *, now_ms: int = NOW) -> AppendResult:
        return append_marker(self.log, self.pid, self.epoch, abort=True, now_ms=now_ms)


def run_clean(
    log: PartitionLog,
    *,
    now_ms: int = NOW,
    first_dirty: int | None = None,
    map_entries: int = 10_000,
    hook: SwapHook | None = None,
    replica_floor: int | None = None,
) -> tuple[int, CleanerStats]:
    """One pass from ``first_dirty`` (the log start when None) to the first uncleanable offset,
    with a map of ``map_entries`` keys (and a cluster's ``replica_floor``, None: a single broker)."""
    offsets = cleanable_offsets(
        log.segments,
        log_start_offset=log.log_start_offset,
        log_end_offset=log.log_end_offset,
        last_stable_offset=log.last_stable_offset,
        high_watermark=log.high_watermark,
        checkpoint=first_dirty,
        config=log.config,
        now_ms=now_ms,
    )
    to_clean = log_to_clean(log.segments, offsets, log.config, now_ms)
    offset_map = OffsetMap(4 * map_entries * BYTES_PER_ENTRY)
    offset_map.capacity = map_entries  # exactly this many keys (Kafka's tests size maps by keys too)
    cleaner = Cleaner(offset_map, hook=hook)
    return cleaner.clean(log, to_clean, now_ms, replica_floor=replica_floor)


def two_pass_clean(
    log: PartitionLog,
    *,
    now_ms: int = NOW,
    delete_retention_ms: int | None = None,
    replica_floor: int | None = None,
) -> int:
    """Kafka's runTwoPassClean: one pass, then one past the delete horizon it set."""
    retention = log.config.delete_retention_ms if delete_retention_ms is None else delete_retention_ms
    run_clean(log, now_ms=now_ms, replica_floor=replica_floor)
    return run_clean(log, now_ms=now_ms + retention + 1, replica_floor=replica_floor)[0]


def batches(log: PartitionLog) -> list[tuple[BatchHeader, list[Record]]]:
    out = []
    for segment in log.segments:
        for buf, header in segment_batches(segment):
            out.append(decode_batch(buf, header.position))
    return out


def keys_in(log: PartitionLog) -> list[int]:
    """Keys of the data records, in offset order (Kafka's keysInLog)."""
    return [int(r.key) for h, rs in batches(log) if not h.is_control for r in rs if r.key is not None]


def key_values(log: PartitionLog) -> dict[int, bytes | None]:
    """The last value of each key, reading the log from the start."""
    out: dict[int, bytes | None] = {}
    for h, rs in batches(log):
        if not h.is_control:
            for r in rs:
                if r.key is not None:
                    out[int(r.key)] = r.value
    return out


def committed_key_values(log: PartitionLog) -> dict[int, bytes | None]:
    """The last value of each key as a read_committed consumer reading from the start sees it:
    records of aborted transactions (per the transaction indexes) are skipped."""
    spans = [
        (e.producer_id, e.first_offset, e.last_offset) for s in log.segments for e in s.txn_index.entries
    ]
    out: dict[int, bytes | None] = {}
    for h, rs in batches(log):
        if h.is_control:
            continue
        if h.is_transactional and any(
            p == h.producer_id and f <= h.base_offset <= last for p, f, last in spans
        ):
            continue
        for r in rs:
            if r.key is not None:
                out[int(r.key)] = r.value
    return out


def offsets_in(log: PartitionLog) -> list[int]:
    """Offsets of every record, control records included (Kafka's offsetsInLog)."""
    return [r.offset for _h, rs in batches(log) for r in rs]


def last_offsets_per_batch(log: PartitionLog) -> list[int]:
    return [h.last_offset for h, _rs in batches(log)]


def aborted(log: PartitionLog) -> list[tuple[int, int, int]]:
    return [(e.producer_id, e.first_offset, e.last_offset) for s in log.segments for e in s.txn_index.entries]


def open_compacted(directory: Path, config: LogConfig = COMPACT) -> PartitionLog:
    return PartitionLog.open(directory, TP, config, recovery_point=0, now_ms=NOW)


__all__ = ["COMPACT", "NOW", "AppendOrigin", "TxnProducer"]
