"""``PartitionLog.last_stable_offset`` is a plain attribute (the consumer Fetch fast path reads it
per request) kept equal to the value computed from what it depends on -- min(first unstable
offset, high watermark), at least the log start -- after every kind of change: plain and
transactional appends (generic and ``append_plain``), commit and abort markers, high watermark
updates, truncation, retention and DeleteRecords moving the log start, and a reopen.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from exactly.records.batch import BatchHeader
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from tests.storage.helpers import NOW, append, append_marker, make_batch, open_log


def _same(log: PartitionLog) -> int:
    assert "last_stable_offset" in vars(log)
    assert log.last_stable_offset == log.computed_last_stable_offset()
    return log.last_stable_offset


def _plain(log: PartitionLog, count: int) -> None:
    batch = make_batch(count, value_size=50)
    fields = dataclasses.astuple(BatchHeader.parse(batch))[:13]  # as the Produce fast path unpacks
    assert log.append_plain(batch, fields, NOW) is not None


def test_lso_attribute_equals_the_computed_value_after_every_change(tmp_path: Path) -> None:
    log = open_log(tmp_path / "a", LogConfig(segment_bytes=600, retention_bytes=-1))
    assert _same(log) == 0
    _plain(log, 2)  # 0-1
    assert _same(log) == 2
    append(log, 2, producer_id=1, epoch=0, seq=0, transactional=True)  # 2-3 txn A opens
    assert _same(log) == 2
    _plain(log, 1)  # 4: the fast path's append behind an open transaction
    assert _same(log) == 2 and log.high_watermark == 5
    append(log, 2, producer_id=2, epoch=0, seq=0, transactional=True, advance_hw=False)  # 5-6 txn B
    assert _same(log) == 2
    append_marker(log, 1, 0, abort=True)  # 7: A aborted, B still open
    assert _same(log) == 5
    append(log, 1, advance_hw=False)  # 8, above the high watermark
    log.update_high_watermark(4)
    assert _same(log) == 4  # bounded by the high watermark now
    log.update_high_watermark(log.log_end_offset)
    assert _same(log) == 5
    append_marker(log, 2, 0, abort=False)  # 9: B committed
    assert _same(log) == 10
    append(log, 2, producer_id=3, epoch=0, seq=0, transactional=True)  # 10-11 txn C opens
    assert _same(log) == 10
    log.truncate_to(10)  # C's batch goes: nothing open any more
    assert _same(log) == 10 and log.high_watermark == 10
    append(log, 2, producer_id=3, epoch=0, seq=0, transactional=True)  # 10-11 C again
    for _ in range(3):
        _plain(log, 3)  # 12-20, rolling segments
    assert _same(log) == 10
    assert log.increment_log_start_offset(13)  # DeleteRecords past the open transaction
    assert _same(log) == 13  # clamped to the log start
    log.config = dataclasses.replace(log.config, retention_bytes=1)
    log.apply_retention(NOW)  # retention moves the log start to the first kept segment
    assert log.log_start_offset > 13
    assert _same(log) == log.log_start_offset
    log.close()
    reopened = PartitionLog.open(
        tmp_path / "a",
        log.tp,
        LogConfig(segment_bytes=600),
        recovery_point=0,
        now_ms=NOW,
        log_start_offset=log.log_start_offset,
    )
    assert _same(reopened) == reopened.log_start_offset  # C is still open after recovery
    append_marker(reopened, 3, 0, abort=True)
    assert _same(reopened) == reopened.log_end_offset
    reopened.close()
