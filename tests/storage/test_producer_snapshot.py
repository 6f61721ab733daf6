"""Producer-state snapshots: format, atomic write, load/replay recovery, truncation."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from exactly.records.batch import BatchHeader
from exactly.records.builder import Record, build_batch
from exactly.records.control import ControlType, build_control_batch
from exactly.storage import producer_snapshot as snap
from exactly.storage.producer_entry import BatchMetadata, ProducerStateEntry
from exactly.storage.producer_state import (
    AppendOrigin,
    CompletedTxn,
    DuplicateBatch,
    ProducerAppendInfo,
    ProducerStateManager,
)


def data(
    offset: int, *, pid: int, seq: int, count: int = 1, txn: bool = False, epoch: int = 0
) -> BatchHeader:
    raw = build_batch(
        [Record(value=b"v")] * count,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
        base_timestamp=100 + offset,
    )
    return BatchHeader.parse(raw).with_base_offset(offset)


def commit(offset: int, *, pid: int, epoch: int = 0) -> BatchHeader:
    raw = build_control_batch(
        ControlType.COMMIT, producer_id=pid, producer_epoch=epoch, coordinator_epoch=3, timestamp=1
    )
    return BatchHeader.parse(raw).with_base_offset(offset)


def append(psm: ProducerStateManager, header: BatchHeader, ctype: ControlType | None = None) -> None:
    origin = AppendOrigin.CLIENT if ctype is None else AppendOrigin.COORDINATOR
    info = psm.prepare_append(header, origin=origin, now_ms=1000, control_type=ctype, coordinator_epoch=3)
    assert isinstance(info, ProducerAppendInfo)
    psm.complete_append(info)


def populate(psm: ProducerStateManager) -> list[tuple[BatchHeader, ControlType | None]]:
    """Producer 1: 6 idempotent batches; producer 2: a committed then an open transaction."""
    log: list[tuple[BatchHeader, ControlType | None]] = []
    offset = 0
    for i in range(6):
        log.append((data(offset, pid=1, seq=i * 2, count=2), None))
        offset += 2
    log.append((data(offset, pid=2, seq=0, txn=True), None))
    log.append((commit(offset + 1, pid=2), ControlType.COMMIT))
    log.append((data(offset + 2, pid=2, seq=1, count=3, txn=True), None))
    for header, ctype in log:
        append(psm, header, ctype)
    return log


def test_encode_decode_round_trip_and_kafka_prefix() -> None:
    batches = tuple(BatchMetadata(i, i + 1, 10 * i + 1, 1, 1000 + i) for i in range(5))
    entries = [
        ProducerStateEntry(1, 3, batches, 7, 123, 40),
        ProducerStateEntry(2, 0, (), -1, -1, None),
    ]
    raw = snap.encode_snapshot(entries)
    assert snap.decode_snapshot(raw) == entries
    version, crc, count = struct.unpack_from(">hIi", raw)
    assert (version, count) == (snap.SNAPSHOT_VERSION, 2)
    assert crc == crc32c.crc32c(raw[6:])
    # Kafka's v1 entry: id, epoch, last seq, last offset, offset delta, timestamp, coord epoch, txn
    assert struct.unpack_from(">qhiqiqiq", raw, 10) == (1, 3, 5, 41, 1, 123, 7, 40)
    # an empty producer: no last batch (-1 / -1 / 0), no open transaction (-1)
    second = 10 + 47 + 5 * 28
    assert struct.unpack_from(">qhiqiqiqb", raw, second) == (2, 0, -1, -1, 0, -1, -1, -1, 0)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],  # truncated
        lambda b: b[:5],  # truncated inside the preamble
        lambda b: b + b"\x00",  # trailing garbage
        lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:],  # bit flip: CRC mismatch
        lambda b: b"\x00\x01" + b[2:],  # unknown version
    ],
)
def test_decode_rejects_corruption(mangle: object) -> None:
    raw = snap.encode_snapshot([ProducerStateEntry(1, 0, (BatchMetadata(0, 0, 0, 0, 5),), -1, 5, None)])
    with pytest.raises(snap.CorruptSnapshotError):
        snap.decode_snapshot(mangle(raw))  # type: ignore[operator]


def _with_valid_crc(raw: bytearray) -> bytes:
    struct.pack_into(">I", raw, 2, crc32c.crc32c(bytes(raw[6:])))
    return bytes(raw)


def test_decode_rejects_inconsistent_content_even_with_valid_crc() -> None:
    good = snap.encode_snapshot([ProducerStateEntry(1, 0, (BatchMetadata(0, 4, 9, 4, 5),), -1, 5, None)])
    bad_last_seq = bytearray(good)
    struct.pack_into(">i", bad_last_seq, 10 + 10, 3)  # Kafka prefix's last seq disagrees with the batch
    bad_count = bytearray(good)
    struct.pack_into(">i", bad_count, 6, 2)  # claims a second producer that is not there
    too_many_batches = bytearray(good)
    too_many_batches[10 + 46] = 6
    for raw in (bad_last_seq, bad_count, too_many_batches, bytearray(good) + b"\x00"):
        with pytest.raises(snap.CorruptSnapshotError):
            snap.decode_snapshot(_with_valid_crc(raw))


def test_snapshot_round_trip_restores_dedup_for_all_five_batches(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    populate(psm)
    path = psm.take_snapshot()
    assert path == tmp_path / "00000000000000000017.snapshot"
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind

    restored = ProducerStateManager(tmp_path)
    assert restored.load(log_start_offset=0, recovery_point=17) == 17
    assert restored.map_end_offset == 17
    assert restored.active_producers() == psm.active_producers()
    assert restored.first_unstable_offset() == 14
    assert restored.ongoing_transactions() == {2: 14}
    # the oldest retained batch of producer 1 (seqs 2-3 at offsets 2-3) is still a duplicate
    dup = restored.prepare_append(data(50, pid=1, seq=2, count=2), origin=AppendOrigin.CLIENT, now_ms=0)
    assert dup == DuplicateBatch(first_offset=2, last_offset=3, timestamp=102)
    # and the sequence continues where it was
    info = restored.prepare_append(data(17, pid=1, seq=12), origin=AppendOrigin.CLIENT, now_ms=0)
    assert isinstance(info, ProducerAppendInfo)


def test_take_snapshot_only_when_map_end_offset_moved(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    assert psm.take_snapshot() is None  # empty log at offset 0
    append(psm, data(0, pid=1, seq=0))
    assert psm.take_snapshot() is not None
    assert psm.take_snapshot() is None
    assert psm.latest_snapshot_offset() == 1


def test_load_without_snapshot_starts_at_log_start(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path / "missing")
    assert psm.load(log_start_offset=7, recovery_point=20) == 7
    assert psm.map_end_offset == 7 and psm.active_producers() == {}


def test_corrupt_newest_snapshot_is_deleted_and_older_one_used(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    append(psm, data(0, pid=1, seq=0))
    older = psm.take_snapshot()
    append(psm, data(1, pid=1, seq=1))
    newer = psm.take_snapshot()
    assert older is not None and newer is not None
    newer.write_bytes(newer.read_bytes()[:-3])
    (tmp_path / "00000000000000000009.snapshot.tmp").write_bytes(b"partial")

    restored = ProducerStateManager(tmp_path)
    assert restored.load(log_start_offset=0, recovery_point=2) == 1
    assert not newer.exists() and older.exists()
    assert not list(tmp_path.glob("*.tmp"))
    entry = restored.last_entry(1)
    assert entry is not None and entry.last_seq == 0


def test_snapshots_above_recovery_point_are_deleted_below_log_start_ignored(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    paths = []
    for i in range(4):
        append(psm, data(i, pid=1, seq=i))
        paths.append(psm.take_snapshot())  # offsets 1, 2, 3, 4
    restored = ProducerStateManager(tmp_path)
    assert restored.load(log_start_offset=2, recovery_point=3) == 3
    assert [p.exists() for p in paths if p] == [True, True, True, False]
    assert restored.latest_snapshot_offset() == 3
    # nothing in range: replay from the log start
    again = ProducerStateManager(tmp_path)
    assert again.load(log_start_offset=4, recovery_point=3) == 4
    assert again.active_producers() == {}


def test_replay_from_snapshot_rebuilds_the_live_state(tmp_path: Path) -> None:
    live = ProducerStateManager(tmp_path)
    log = populate(live)
    # snapshot in the middle (after producer 1's batches), then the tail is only in the log
    mid = ProducerStateManager(tmp_path)
    for header, ctype in log[:6]:
        append(mid, header, ctype)
    assert mid.take_snapshot() is not None

    restored = ProducerStateManager(tmp_path)
    start = restored.load(log_start_offset=0, recovery_point=17)
    assert start == 12
    completed = []
    for header, ctype in log:
        if header.base_offset >= start:
            completed.append(restored.replay(header, ctype, coordinator_epoch=3, now_ms=1000))
    assert completed == [None, CompletedTxn(2, 12, 13, is_aborted=False), None]
    assert restored.active_producers() == live.active_producers()
    assert restored.map_end_offset == 17
    assert restored.first_unstable_offset() == 14


def test_full_replay_without_snapshot(tmp_path: Path) -> None:
    live = ProducerStateManager(tmp_path / "a")
    log = populate(live)
    restored = ProducerStateManager(tmp_path / "b")
    assert restored.load(log_start_offset=0, recovery_point=0) == 0
    for header, ctype in log:
        restored.replay(header, ctype, coordinator_epoch=3, now_ms=1000)
    assert restored.active_producers() == live.active_producers()
    assert restored.ongoing_transactions() == live.ongoing_transactions()


def test_replay_defaults_last_timestamp_to_batch_timestamp(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    psm.replay(data(5, pid=1, seq=0))
    entry = psm.last_entry(1)
    assert entry is not None and entry.last_timestamp == 105


def test_truncate_and_reload(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    for i in range(3):
        append(psm, data(i, pid=1, seq=i))
        psm.take_snapshot()  # 1, 2, 3
    psm.truncate_and_reload(log_start_offset=0, log_end_offset=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000001.snapshot",
        "00000000000000000002.snapshot",
    ]
    assert psm.map_end_offset == 2
    entry = psm.last_entry(1)
    assert entry is not None and entry.last_seq == 1
    # same end offset: state kept, snapshots below the log start dropped
    psm.truncate_and_reload(log_start_offset=2, log_end_offset=2)
    assert psm.latest_snapshot_offset() == 2 and not (tmp_path / "00000000000000000001.snapshot").exists()
    assert psm.last_entry(1) is not None


def test_delete_snapshots_before(tmp_path: Path) -> None:
    psm = ProducerStateManager(tmp_path)
    for i in range(3):
        append(psm, data(i, pid=1, seq=i))
        psm.take_snapshot()
    psm.delete_snapshots_before(3)
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000000003.snapshot"]
    assert psm.latest_snapshot_offset() == 3
    psm.delete_snapshots_before(4)
    assert psm.latest_snapshot_offset() is None


def test_remove_temp_files_removes_only_snapshot_temp_files(tmp_path: Path) -> None:
    from exactly.storage.producer_snapshot import remove_temp_files

    for name in (
        "00000000000000000009.snapshot.tmp",
        "leader-epoch-checkpoint.tmp",
        "00000000000000000009.snapshot",
    ):
        (tmp_path / name).write_bytes(b"x")
    remove_temp_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000009.snapshot",
        "leader-epoch-checkpoint.tmp",
    ]
    remove_temp_files(tmp_path / "missing")  # a partition directory not created yet
