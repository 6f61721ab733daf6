"""Shared helpers for the storage tests: build batches, append them, read everything back."""

from __future__ import annotations

from pathlib import Path

from exactly.records.batch import BatchHeader, iter_batches
from exactly.records.builder import Record, build_batch, decode_batch
from exactly.records.control import ControlType, build_control_batch
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import AppendResult, PartitionLog
from exactly.storage.producer_state import AppendOrigin
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)
NOW = 1_700_000_000_000


def make_batch(
    count: int = 1,
    *,
    value_size: int = 10,
    timestamp: int = NOW,
    producer_id: int = -1,
    epoch: int = -1,
    seq: int = -1,
    transactional: bool = False,
    tag: bytes = b"v",
) -> bytearray:
    records = [Record(value=(tag + str(i).encode()).ljust(value_size, b".")) for i in range(count)]
    return bytearray(
        build_batch(
            records,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=transactional,
            base_timestamp=timestamp,
        )
    )


def append(
    log: PartitionLog,
    count: int = 1,
    *,
    now_ms: int = NOW,
    leader_epoch: int = 0,
    advance_hw: bool = True,
    **kwargs: object,
) -> AppendResult:
    batch = make_batch(count, **kwargs)  # type: ignore[arg-type]
    result = log.append(batch, BatchHeader.parse(batch), leader_epoch=leader_epoch, now_ms=now_ms)
    if advance_hw:
        log.update_high_watermark(log.log_end_offset)
    return result


def append_marker(
    log: PartitionLog,
    producer_id: int,
    epoch: int,
    *,
    abort: bool,
    now_ms: int = NOW,
    coordinator_epoch: int = 0,
) -> AppendResult:
    batch = bytearray(
        build_control_batch(
            ControlType.ABORT if abort else ControlType.COMMIT,
            producer_id=producer_id,
            producer_epoch=epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp=now_ms,
        )
    )
    result = log.append(
        batch, BatchHeader.parse(batch), leader_epoch=0, now_ms=now_ms, origin=AppendOrigin.COORDINATOR
    )
    log.update_high_watermark(log.log_end_offset)
    return result


def headers_of(data: bytes) -> list[BatchHeader]:
    return list(iter_batches(data, verify_crc=True))


def read_all(log: PartitionLog, *, read_committed: bool = False) -> list[BatchHeader]:
    """Every batch from the log start to the bound, following segment boundaries."""
    out: list[BatchHeader] = []
    offset = log.log_start_offset
    while True:
        result = log.read(offset, 1 << 30, read_committed=read_committed)
        batches = headers_of(result.records)
        if not batches:
            return out
        out.extend(batches)
        offset = batches[-1].next_offset


def values_of(data: bytes) -> list[bytes | None]:
    values: list[bytes | None] = []
    for header in iter_batches(data):
        _h, records = decode_batch(data, header.position)
        values.extend(r.value for r in records)
    return values


def open_log(
    directory: Path, config: LogConfig | None = None, *, recovery_point: int | None = 0
) -> PartitionLog:
    return PartitionLog.open(directory, TP, config or LogConfig(), recovery_point=recovery_point, now_ms=NOW)


def crash(log: PartitionLog) -> None:
    """Simulate kill -9: the files keep what the process had written (the page cache survives),
    nothing more: no flush, snapshot or checkpoint, and no index entries still pending in memory
    (closing a segment would write those, so the files are put back as they were)."""
    saved = {path: path.read_bytes() for path in log.directory.iterdir() if path.is_file()}
    for segment in log.segments:
        segment.close()
    for path in log.directory.iterdir():
        if path.is_file() and path not in saved:
            path.unlink()
    for path, data in saved.items():
        path.write_bytes(data)
