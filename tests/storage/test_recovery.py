"""Opening a partition after clean and unclean shutdowns (log_loader)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import pytest

from exactly.storage.config import LogConfig
from exactly.storage.file_write import PREALLOCATE_AHEAD, PREALLOCATE_MIN_WRITE
from exactly.storage.log_read import AbortedTxn
from tests.storage.helpers import (
    append,
    append_marker,
    crash,
    headers_of,
    make_batch,
    open_log,
    read_all,
)

ONE = len(make_batch(2, value_size=100))
SMALL_SEGMENTS = LogConfig(segment_bytes=3 * ONE, index_interval_bytes=64)


def fill(log_dir: Path, batches: int, config: LogConfig = SMALL_SEGMENTS) -> list[int]:
    log = open_log(log_dir, config)
    for _ in range(batches):
        append(log, 2, value_size=100)
    bases = [s.base_offset for s in log.segments]
    log.close()
    return bases


def test_clean_reopen_reads_nothing_and_keeps_everything(tmp_path: Path) -> None:
    fill(tmp_path, 10)
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=20)
    assert log.log_end_offset == 20 and log.high_watermark == 20
    assert log.load_result.truncated_bytes == 0 and log.load_result.replayed_batches == 0
    assert [h.base_offset for h in read_all(log)] == list(range(0, 20, 2))
    # The next append continues the offsets.
    assert append(log, 1).first_offset == 20
    log.close()


def test_torn_tail_is_truncated_and_whole_batches_survive(tmp_path: Path) -> None:
    fill(tmp_path, 10)
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=20)
    append(log, 2, value_size=100)
    last = log.segments[-1]
    size_before = last.size
    crash(log)
    extra = make_batch(2, value_size=100)
    with open(last.log_path, "ab") as f:
        f.write(extra[:-7])  # the tail of a write that never completed
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=20)
    assert reopened.load_result.truncated_bytes == len(extra) - 7
    assert reopened.log_end_offset == 22
    assert reopened.segments[-1].size == size_before
    assert [h.base_offset for h in read_all(reopened)] == list(range(0, 22, 2))
    assert append(reopened, 1).first_offset == 22
    reopened.close()


def test_corruption_in_a_middle_segment_drops_everything_after_it(tmp_path: Path) -> None:
    bases = fill(tmp_path, 10)
    assert len(bases) == 4
    victim = tmp_path / f"{bases[1]:020d}.log"
    data = bytearray(victim.read_bytes())
    data[ONE + 70] ^= 0xFF  # inside the second batch of the second segment
    victim.write_bytes(bytes(data))
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=bases[1])
    assert [s.base_offset for s in log.segments] == bases[:2]
    assert log.log_end_offset == bases[1] + 2
    assert not (tmp_path / f"{bases[2]:020d}.log").exists()
    assert [h.base_offset for h in read_all(log)] == list(range(0, bases[1] + 2, 2))
    log.close()


def test_recovery_only_scans_after_the_recovery_point(tmp_path: Path) -> None:
    bases = fill(tmp_path, 10)
    first = tmp_path / f"{bases[0]:020d}.log"
    data = bytearray(first.read_bytes())
    data[ONE + 70] ^= 0xFF  # corrupt flushed data below the recovery point
    first.write_bytes(bytes(data))
    # Trusted: the segment is below the recovery point, so it is not read at all.
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=bases[2])
    assert log.load_result.truncated_bytes == 0
    assert log.log_end_offset == 20
    log.close()
    # Without a recovery point everything is validated and the corruption is found.
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=None)
    assert log.load_result.truncated_bytes > 0
    assert log.log_end_offset == 2
    log.close()


def test_deleted_and_corrupt_indexes_are_rebuilt(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=20 * ONE, index_interval_bytes=64)
    bases = fill(tmp_path, 30, config)
    assert bases == [0, 40]
    expected_entries = (tmp_path / f"{0:020d}.index").read_bytes()
    (tmp_path / f"{0:020d}.index").unlink()
    (tmp_path / f"{0:020d}.timeindex").write_bytes(b"\x00" * 5)
    (tmp_path / f"{40:020d}.index").write_bytes(b"\x00" * 3)
    log = open_log(tmp_path, config, recovery_point=60)
    for offset in range(0, 60, 3):
        (header,) = headers_of(log.read(offset, 1, read_committed=False).records)
        assert header.base_offset <= offset <= header.last_offset
    assert (tmp_path / f"{0:020d}.index").read_bytes() == expected_entries
    assert (tmp_path / f"{0:020d}.timeindex").stat().st_size % 12 == 0
    assert log.offset_for_timestamp(0) == (0, log.segments[0].max_timestamp)
    log.close()


def test_producer_state_survives_a_crash(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 2, producer_id=5, epoch=0, seq=0)
    append(log, 2, producer_id=5, epoch=0, seq=2)
    crash(log)
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=0)
    assert reopened.load_result.replayed_batches == 2
    dup = append(reopened, 2, producer_id=5, epoch=0, seq=2)
    assert dup.duplicate and dup.first_offset == 2
    assert append(reopened, 1, producer_id=5, epoch=0, seq=4).first_offset == 4
    reopened.close()


def test_transactions_and_txn_index_recovered(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 2, value_size=100, producer_id=1, epoch=0, seq=0, transactional=True)  # 0-1
    append(log, 2, value_size=100)  # 2-3
    append(log, 2, value_size=100, producer_id=2, epoch=0, seq=0, transactional=True)  # 4-5
    append_marker(log, 1, 0, abort=True)  # 6
    append(log, 2, value_size=100, producer_id=3, epoch=0, seq=0, transactional=True)  # 7-8, left open
    assert log.last_stable_offset == 4
    crash(log)
    for path in tmp_path.glob("*.txnindex"):
        path.unlink()  # lost with the crash: rebuilt by replay
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=0)
    assert reopened.last_stable_offset == 4  # txn of producer 2 is still open
    assert reopened.producer_state.ongoing_transactions() == {2: 4, 3: 7}
    append_marker(reopened, 2, 0, abort=False)
    append_marker(reopened, 3, 0, abort=False)
    result = reopened.read(0, 1 << 20, read_committed=True)
    assert result.aborted_transactions == (AbortedTxn(1, 0),)
    reopened.close()


def test_open_transaction_survives_a_clean_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 1)
    append(log, 1, producer_id=9, epoch=0, seq=0, transactional=True)
    append(log, 1)
    log.close()
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=3)
    assert reopened.load_result.replayed_batches == 0  # snapshot at the log end
    assert reopened.last_stable_offset == 1
    append_marker(reopened, 9, 0, abort=True)
    assert reopened.last_stable_offset == 4
    assert reopened.read(0, 1 << 20, read_committed=True).aborted_transactions == (AbortedTxn(9, 1),)
    reopened.close()


def test_stray_files_are_removed(tmp_path: Path) -> None:
    fill(tmp_path, 2)
    (tmp_path / f"{999:020d}.index").write_bytes(b"")  # an index without a log
    (tmp_path / f"{0:020d}.log.tmp").write_bytes(b"junk")
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=4)
    assert not (tmp_path / f"{999:020d}.index").exists()
    assert not (tmp_path / f"{0:020d}.log.tmp").exists()
    assert log.log_end_offset == 4
    log.close()


def test_leader_epochs_of_truncated_data_are_forgotten(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 1, leader_epoch=1)
    append(log, 1, leader_epoch=2)
    assert [(e.epoch, e.start_offset) for e in log.leader_epochs.entries] == [(1, 0), (2, 1)]
    last = log.segments[-1]
    crash(log)
    with open(last.log_path, "r+b") as f:
        f.truncate(last.size - 5)  # the epoch-2 batch never fully reached the disk
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=0)
    assert reopened.log_end_offset == 1
    assert [(e.epoch, e.start_offset) for e in reopened.leader_epochs.entries] == [(1, 0)]
    reopened.close()


def test_replay_leaves_the_epoch_history_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Replaying the log after a crash assigns only epochs newer than the checkpoint's latest
    (Kafka's segment recovery): older batches must not rewrite the durable history (before, the
    first epoch-0 batch dropped every later entry, and each batch rewrote the file again)."""
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 2, leader_epoch=0)
    append(log, 2, leader_epoch=1)
    history = [(e.epoch, e.start_offset) for e in log.leader_epochs.entries]
    assert history == [(0, 0), (1, 2)]
    crash(log)
    written = log.leader_epochs.path.stat().st_mtime_ns
    with caplog.at_level(logging.WARNING, logger="exactly.storage"):
        reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=0)  # replays every batch
    assert [(e.epoch, e.start_offset) for e in reopened.leader_epochs.entries] == history
    assert not [r for r in caplog.records if "non-monotonic" in r.getMessage()]
    assert reopened.leader_epochs.path.stat().st_mtime_ns == written
    reopened.close()


def test_replay_refills_a_lost_epoch_checkpoint_from_the_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 2, leader_epoch=0)
    append(log, 2, leader_epoch=3)
    crash(log)
    log.leader_epochs.path.unlink()
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=0)
    assert [(e.epoch, e.start_offset) for e in reopened.leader_epochs.entries] == [(0, 0), (3, 2)]
    reopened.close()


@pytest.mark.parametrize("recovery_point", [0, None])
def test_an_empty_segment_with_empty_indexes_is_left_as_opened(
    tmp_path: Path, recovery_point: int | None
) -> None:
    """A partition that never got a record: nothing to validate, and its empty index files are
    not rewritten (same inodes, same modification times); the log behaves as after a recovery."""
    open_log(tmp_path, SMALL_SEGMENTS).close()
    segment_files = sorted(p for p in tmp_path.iterdir() if p.suffix in (".index", ".timeindex"))
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in segment_files}
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=recovery_point)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in segment_files} == before
    assert log.log_end_offset == 0 and log.load_result.truncated_bytes == 0
    for _ in range(4):  # rolls: the reopened empty segment indexes and rolls as a recovered one
        append(log, 2, value_size=100)
    assert [h.base_offset for h in read_all(log)] == [0, 2, 4, 6]
    assert log.segments[0].offset_index.lookup(4)[0] >= 0
    log.close()
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=8)
    assert [h.base_offset for h in read_all(reopened)] == [0, 2, 4, 6]
    reopened.close()


def test_an_empty_segment_with_a_nonempty_index_is_recovered(tmp_path: Path) -> None:
    """Index entries for a log without batches are wrong: recovery empties the files."""
    open_log(tmp_path, SMALL_SEGMENTS).close()
    index = next(p for p in tmp_path.iterdir() if p.suffix == ".index")
    index.write_bytes(bytes(8))  # one entry (0, 0), a sane size
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=0)
    assert index.stat().st_size == 0
    assert log.log_end_offset == 0
    append(log, 2)
    assert [h.base_offset for h in read_all(log)] == [0]
    log.close()


@pytest.mark.parametrize("zeros", [10, 61, 4096, 1 << 20])
def test_a_zero_tail_recovers_to_the_last_valid_batch(tmp_path: Path, zeros: int) -> None:
    """A file longer than its batches with zeros after them (what a file system that extended the
    size but never wrote the data leaves, or a Kafka-style preallocated segment after kill -9)
    recovers to the last whole batch: the zeros are neither read as a batch nor kept."""
    fill(tmp_path, 10)
    log = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=20)
    append(log, 2, value_size=100)
    last = log.segments[-1]
    size_before = last.size
    crash(log)
    with open(last.log_path, "ab") as f:
        f.write(bytes(zeros))
    reopened = open_log(tmp_path, SMALL_SEGMENTS, recovery_point=20)
    assert reopened.load_result.truncated_bytes == zeros
    assert reopened.log_end_offset == 22
    assert reopened.segments[-1].size == last.log_path.stat().st_size == size_before
    assert [h.base_offset for h in read_all(reopened)] == list(range(0, 22, 2))
    assert append(reopened, 1).first_offset == 22
    reopened.close()


def _append_bulk_then_die(log_dir: Path, batches: int) -> None:
    """In a child process: append bulk batches (each reserves blocks past the end) and get
    SIGKILLed with the reservation outstanding: no flush, roll or close."""
    log = open_log(log_dir, LogConfig(segment_bytes=1 << 30), recovery_point=0)
    for _ in range(batches):
        append(log, 1, value_size=PREALLOCATE_MIN_WRITE)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and FALLOC_FL_KEEP_SIZE are Linux's")
def test_kill_9_with_blocks_reserved_past_the_end_loses_nothing_and_reads_no_zeros(tmp_path: Path) -> None:
    """Blocks reserved past the end (``file_write.BlockReserve``) do not change the file's size,
    so a broker killed with a reservation outstanding leaves a file whose size is what it wrote:
    recovery reads every batch written (the page cache survives kill -9), no zeros after them,
    and the next append continues the offsets."""
    child = multiprocessing.get_context("fork").Process(target=_append_bulk_then_die, args=(tmp_path, 3))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    segment_path = next(p for p in tmp_path.iterdir() if p.suffix == ".log")
    st = segment_path.stat()
    one = len(make_batch(1, value_size=PREALLOCATE_MIN_WRITE))
    assert st.st_size == 3 * one  # the reservation is not in the size
    reserved = st.st_blocks * 512 >= st.st_size + PREALLOCATE_AHEAD // 2  # (not on every file system)
    log = open_log(tmp_path, LogConfig(segment_bytes=1 << 30), recovery_point=0)
    assert log.load_result.truncated_bytes == 0
    assert log.log_end_offset == 3
    assert [h.base_offset for h in read_all(log)] == [0, 1, 2]
    assert append(log, 1).first_offset == 3
    log.close()  # frees what was reserved past the end
    after = segment_path.stat()
    assert after.st_size == 3 * one + len(make_batch(1))
    if reserved:
        assert after.st_blocks * 512 < after.st_size + PREALLOCATE_MIN_WRITE
