"""Producer-state snapshot files: ``<offset:020d>.snapshot`` in the partition directory.

Why
---
Recovery must not replay a whole partition to learn each producer's last sequences. A snapshot
holds the producer state as of ``offset`` (exclusive: every batch below it is applied); recovery
loads the newest valid one at or below the recovery point and replays the log from there.

Layout (big-endian), Kafka's ProducerSnapshot with one extension::

    version        int16   = 2 (Kafka's layout is version 1)
    crc            uint32  CRC32C of every byte after this field
    producer count int32
    per producer (Kafka's 46-byte v1 entry):
        producer id int64, epoch int16, last seq int32, last offset int64, offset delta int32,
        timestamp int64 (the entry's last_timestamp), coordinator epoch int32,
        current txn first offset int64 (-1: none)
      then the extension:
        batch count int8 (0..5), per retained batch oldest first:
        first seq int32, last seq int32, last offset int64, offset delta int32, timestamp int64

Kafka keeps only the last batch of each producer in its snapshots, so after a restart only a
retry of the very last batch is recognised as a duplicate; a retry of any of the 4 older in-flight
batches (librdkafka and the Java client keep up to 5 in flight) would be rejected as out of order
and fail the producer. We store every retained batch (28 bytes each) so dedup survives restarts
for all 5. The Kafka prefix is kept (and cross-checked against the last batch) so the file stays
readable with Kafka's field meanings.

Invariants
----------
* A file is written through ``write_durably`` (to ``<name>.tmp``, fsynced, renamed over
  ``<name>``, the directory fsynced): a snapshot file is either complete or absent.
* ``read_snapshot`` raises ``CorruptSnapshotError`` for anything it cannot fully verify (bad
  version, CRC, truncation, trailing bytes, inconsistent fields); the caller deletes the file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

import crc32c

from exactly.storage.durable import TEMP_SUFFIX, write_durably
from exactly.storage.producer_entry import NUM_BATCHES_TO_RETAIN, BatchMetadata, ProducerStateEntry

SNAPSHOT_VERSION = 2
SNAPSHOT_SUFFIX = ".snapshot"

_PREAMBLE = struct.Struct(">hI")  # version, crc
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiqb")  # Kafka's v1 entry + batch count
_BATCH = struct.Struct(">iiqiq")
_CRC_START = _PREAMBLE.size
_TEMP_NAME_SUFFIX = SNAPSHOT_SUFFIX + TEMP_SUFFIX


class CorruptSnapshotError(Exception):
    """The snapshot cannot be trusted; fall back to an older one or a full replay."""


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> dict[int, Path]:
    """offset -> path of every snapshot file in ``directory`` (missing directory: none)."""
    found: dict[int, Path] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == SNAPSHOT_SUFFIX and stem.isdigit():
            found[int(stem)] = directory / name
    return found


def remove_temp_files(directory: Path) -> None:
    """Delete ``*.snapshot.tmp`` left behind by a crash in the middle of a write. One
    ``os.listdir`` (every partition's load calls this; ``Path.glob`` cost ~10x as much)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(_TEMP_NAME_SUFFIX):
            (directory / name).unlink(missing_ok=True)


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    body = bytearray(_COUNT.size)
    count = 0
    for entry in entries:
        batches = entry.batches
        last = batches[-1] if batches else None
        body += _ENTRY.pack(
            entry.producer_id,
            entry.producer_epoch,
            last.last_seq if last else -1,
            last.last_offset if last else -1,
            last.offset_delta if last else 0,
            entry.last_timestamp,
            entry.coordinator_epoch,
            -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset,
            len(batches),
        )
        for b in batches:
            body += _BATCH.pack(b.first_seq, b.last_seq, b.last_offset, b.offset_delta, b.timestamp)
        count += 1
    _COUNT.pack_into(body, 0, count)
    return _PREAMBLE.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """Parse and verify a snapshot's bytes; raises CorruptSnapshotError."""
    if len(data) < _PREAMBLE.size + _COUNT.size:
        raise CorruptSnapshotError(f"snapshot truncated: {len(data)} bytes")
    version, crc = _PREAMBLE.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"unknown snapshot version {version}")
    if crc32c.crc32c(memoryview(data)[_CRC_START:]) != crc:
        raise CorruptSnapshotError("snapshot CRC32C mismatch")
    try:
        return _decode_entries(data)
    except struct.error as e:
        raise CorruptSnapshotError(f"snapshot truncated: {e}") from None


def _decode_entries(data: bytes) -> list[ProducerStateEntry]:
    (count,) = _COUNT.unpack_from(data, _CRC_START)
    pos = _CRC_START + _COUNT.size
    if count < 0:
        raise CorruptSnapshotError(f"negative producer count {count}")
    entries: list[ProducerStateEntry] = []
    for _ in range(count):
        pid, epoch, last_seq, last_offset, offset_delta, ts, coord_epoch, txn_first, n = _ENTRY.unpack_from(
            data, pos
        )
        pos += _ENTRY.size
        if not 0 <= n <= NUM_BATCHES_TO_RETAIN:
            raise CorruptSnapshotError(f"producer {pid}: {n} batches")
        batches = []
        for _b in range(n):
            batches.append(BatchMetadata(*_BATCH.unpack_from(data, pos)))
            pos += _BATCH.size
        last = (batches[-1].last_seq, batches[-1].last_offset, batches[-1].offset_delta) if batches else None
        if last != ((last_seq, last_offset, offset_delta) if last_offset >= 0 else None):
            raise CorruptSnapshotError(f"producer {pid}: last batch disagrees with the entry")
        entries.append(
            ProducerStateEntry(
                pid, epoch, tuple(batches), coord_epoch, ts, None if txn_first < 0 else txn_first
            )
        )
    if pos != len(data):
        raise CorruptSnapshotError(f"{len(data) - pos} trailing bytes after the last producer")
    return entries


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    """Read and verify one snapshot file; raises CorruptSnapshotError (also if it vanished)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptSnapshotError(f"{path} disappeared") from None
    return decode_snapshot(data)


def write_snapshot(directory: Path, offset: int, entries: Iterable[ProducerStateEntry]) -> Path:
    """Write durably (storage/durable.py: tmp + fsync + rename + directory fsync); returns the
    final path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(directory, offset)
    write_durably(path, encode_snapshot(entries))
    return path
