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

``ProducerSnapshots`` (the base of ``producer_state.ProducerStateManager``, which owns every
attribute it uses) keeps the set of snapshot files of one partition: taking one, loading the
newest valid one into the manager's state, dropping those a truncation or retention made stale.

Invariants
----------
* A file is written through ``write_durably`` (to ``<name>.tmp``, fsynced, renamed over
  ``<name>``, the directory fsynced): a snapshot file is either complete or absent. Except the
  one taken at a segment roll (``take_snapshot(sync=False)``, as Kafka 3.5+'s
  ``takeSnapshot(sync=false)`` with ``flushProducerStateSnapshot`` on its scheduler): renamed
  without the fsyncs, it is complete or absent after a process crash, but a machine crash may
  leave it empty or partial until it is fsynced. Its offset stays in ``_unsynced`` until then,
  and the recovery point never reaches it first: the rolled flush that moves the recovery point
  to the roll's offset fsyncs it (``storage.rolled_flush``), and a synchronous flush or a log
  start move calls ``sync_snapshots``. Should one be lost anyway, the loader's checks below
  drop it and recovery falls back to an older snapshot plus replay.
* ``read_snapshot`` raises ``CorruptSnapshotError`` for anything it cannot fully verify (bad
  version, CRC, truncation, trailing bytes, inconsistent fields); the caller deletes the file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

import crc32c

from exactly.storage.durable import TEMP_SUFFIX, fsync_directory, fsync_file, write_durably
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


def write_snapshot(
    directory: Path, offset: int, entries: Iterable[ProducerStateEntry], *, durable: bool = True
) -> Path:
    """Write durably (storage/durable.py: tmp + fsync + rename + directory fsync; without
    ``durable`` the same minus both fsyncs); returns the final path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(directory, offset)
    write_durably(path, encode_snapshot(entries), durable=durable)
    return path


class ProducerSnapshots:
    """The snapshot files of one partition's producer state, and loading them into it.

    Owns the snapshot files (``_snapshots``: offset -> path) and the offset of the last one
    taken; the producer state it loads into (``_producers``, ``_ongoing``, ``_first_unstable``,
    ``_map_end_offset``) is ``ProducerStateManager``'s, which sets every attribute declared here.
    """

    directory: Path
    _producers: dict[int, ProducerStateEntry]
    _ongoing: dict[int, int]
    _first_unstable: int | None
    _map_end_offset: int
    _last_snap_offset: int
    _snapshots: dict[int, Path]
    _unsynced: set[int]  # offsets of snapshots written without their fsyncs (module docstring)

    def take_snapshot(self, *, sync: bool = True) -> Path | None:
        """Write ``<map_end_offset:020d>.snapshot`` (CRC32C-checked) atomically. Like Kafka, does
        nothing (returns None) unless the map end offset moved past the last snapshot. Without
        ``sync`` (segment roll) the fsyncs are owed: see ``unsynced_snapshots``."""
        offset = self._map_end_offset
        if offset <= self._last_snap_offset or offset in self._snapshots:
            return None
        path = write_snapshot(self.directory, offset, self._producers.values(), durable=sync)
        self._snapshots[offset] = path
        self._last_snap_offset = offset
        if not sync:
            self._unsynced.add(offset)
        return path

    def unsynced_snapshots(self, upto: int) -> tuple[int, ...]:
        """Offsets (at or below ``upto``) of snapshots whose fsyncs are owed: a recovery point
        may reach ``upto`` only once they are done (``snapshots_synced``)."""
        return tuple(sorted(o for o in self._unsynced if o <= upto))

    def snapshots_synced(self, offsets: Iterable[int]) -> None:
        """The files of ``offsets`` (and their directory entries) were fsynced."""
        self._unsynced.difference_update(offsets)

    def sync_snapshots(self, upto: int) -> None:
        """fsync now, on this thread, the owed snapshots at or below ``upto`` and the directory."""
        owed = self.unsynced_snapshots(upto)
        if owed:
            for offset in owed:
                fsync_file(snapshot_path(self.directory, offset))
            fsync_directory(self.directory)
            self.snapshots_synced(owed)

    def load(self, *, log_start_offset: int, recovery_point: int) -> int:
        """Load the newest valid snapshot with offset in [log_start_offset, recovery_point],
        skipping corrupt ones (deleting them). Snapshots above the recovery point describe log
        that recovery may truncate away: they are deleted too. Returns the offset replay must
        start from (the snapshot offset, or log_start_offset when none is usable); the map end
        offset is set to it."""
        remove_temp_files(self.directory)
        self._snapshots = list_snapshots(self.directory)
        for offset in [o for o in self._snapshots if o > recovery_point]:
            self._delete_snapshot(offset)
        return self._load_newest(log_start_offset, recovery_point)

    def _load_newest(self, low: int, high: int) -> int:
        self._clear()
        for offset in sorted((o for o in self._snapshots if low <= o <= high), reverse=True):
            try:
                entries = read_snapshot(self._snapshots[offset])
            except CorruptSnapshotError:
                self._delete_snapshot(offset)
                continue
            for entry in entries:
                self._producers[entry.producer_id] = entry
                if entry.current_txn_first_offset is not None:
                    self._ongoing[entry.producer_id] = entry.current_txn_first_offset
            self._first_unstable = min(self._ongoing.values(), default=None)
            self._map_end_offset = self._last_snap_offset = offset
            return offset
        self._map_end_offset = self._last_snap_offset = low
        return low

    def truncate_and_reload(self, *, log_start_offset: int, log_end_offset: int) -> None:
        """Drop snapshots above log_end_offset / below log_start_offset. If the state no longer
        matches the log end, reload from the newest remaining snapshot: the caller then replays
        the log from ``map_end_offset`` to ``log_end_offset``."""
        for offset in [o for o in self._snapshots if o > log_end_offset or o < log_start_offset]:
            self._delete_snapshot(offset)
        if log_end_offset != self._map_end_offset:
            self._load_newest(log_start_offset, log_end_offset)
        else:
            self._map_end_offset = max(self._map_end_offset, log_start_offset)
            self._last_snap_offset = max(self._snapshots, default=log_start_offset)

    def delete_snapshots_before(self, offset: int) -> None:
        for snap_offset in [o for o in self._snapshots if o < offset]:
            self._delete_snapshot(snap_offset)

    def delete_snapshot(self, offset: int) -> None:
        """Drop the snapshot at ``offset`` (a segment base the log cleaner merged away)."""
        self._delete_snapshot(offset)

    def latest_snapshot_offset(self) -> int | None:
        return max(self._snapshots, default=None)

    def _delete_snapshot(self, offset: int) -> None:
        self._unsynced.discard(offset)
        path = self._snapshots.pop(offset, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def _clear(self) -> None:
        self._producers.clear()
        self._ongoing.clear()
        self._first_unstable = None
