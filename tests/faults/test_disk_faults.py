"""Disk faults the recovery tests in tests/integration/test_recovery.py do not cover:

* a full disk (ENOSPC) under the producer: the append fails with an error to the producer
  (KAFKA_STORAGE_ERROR), nothing acknowledged is lost or torn, the broker keeps serving, and once
  space is back the retried batch lands right after the last acknowledged one;
* a corrupt or torn tail of ``__transaction_state`` after a crash: the broker starts, committed
  transactions stay committed (exactly once), aborted ones stay invisible, the LSO reaches the
  end, and the transactional.id works again;
* truncated or garbled (not deleted) offset/time index files.

ENOSPC comes from a real filesystem: the data dir is a small tmpfs (``mount -t tmpfs -o size=``,
needs root/CAP_SYS_ADMIN), grown with ``mount -o remount,size=`` to free space. Where mounting is
not allowed the test falls back to RLIMIT_FSIZE on the broker process (``prlimit --fsize``):
writes past the limit fail with EFBIG instead of ENOSPC (Python ignores SIGXFSZ), which exercises
the same error path; the limit cannot be lifted in flight, so that variant skips the "space is
back" step. ``EXACTLY_DISK_FULL_MODE=rlimit`` forces the fallback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from exactly.records.builder import Record, build_batch
from tests.conftest import BrokerFactory
from tests.support.broker import Broker
from tests.support.clients import consume, consumer, create_topic, producer
from tests.support.txn_helpers import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    end_offsets,
    fresh_config,
    produce_flush,
    read_to_end,
    txn_producer,
    values,
)
from tests.support.wire import (
    WireClient,
    fetch_records,
    init_producer_id,
    partition_response,
    produce_request,
)
from tests.support.wire import create_topic as wire_create_topic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KAFKA_STORAGE_ERROR = 56


# ------------------------------------------------------------------ ENOSPC
class SmallDisk:
    """A data dir that fills up: a tmpfs of ``size_mb`` (or RLIMIT_FSIZE as a fallback)."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.mode = "tmpfs"
        path.mkdir(parents=True, exist_ok=True)
        if os.environ.get("EXACTLY_DISK_FULL_MODE") == "rlimit":  # to test the fallback where mount works
            self.mode = "rlimit"
            return
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            self.mode = "rlimit"

    def grow(self, size_mb: int) -> bool:
        if self.mode != "tmpfs":
            return False
        r = subprocess.run(["mount", "-o", f"remount,size={size_mb}m", str(self.path)], capture_output=True)
        return r.returncode == 0

    def unmount(self) -> None:
        if self.mode == "tmpfs":
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


class LimitedBroker(Broker):
    """A broker whose file writes stop at ``fsize`` bytes per file (RLIMIT_FSIZE via prlimit)."""

    fsize: int = 0

    def command(self, port: int = 0) -> list[str]:
        cmd = super().command(port)
        if self.fsize and shutil.which("prlimit"):
            return ["prlimit", f"--fsize={self.fsize}", *cmd]
        return cmd


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "small", 3)
    try:
        yield disk
    finally:
        disk.unmount()


def test_disk_full_fails_the_append_and_loses_nothing_acknowledged(
    small_disk: SmallDisk, tmp_path: Path, topic: str
) -> None:
    b = LimitedBroker(
        small_disk.path / "data",
        tmp_path / "broker.log",
        name="small-disk",
        overrides={"log.segment.bytes": str(64 * 1024 * 1024)},
    )
    if small_disk.mode == "rlimit":
        b.fsize = 2 * 1024 * 1024
    try:
        b.start()
        payload = b"z" * 1000
        acked: list[tuple[int, int]] = []  # (base offset, first sequence)
        failed: tuple[bytes, int] | None = None
        with WireClient(b.bootstrap) as c:
            assert wire_create_topic(c, topic).error_code == 0
            pid, epoch = init_producer_id(c)
            seq = 0
            for _ in range(400):
                batch = build_batch(
                    [Record(value=b"%06d" % (seq + i) + payload) for i in range(20)],
                    producer_id=pid,
                    producer_epoch=epoch,
                    base_sequence=seq,
                    base_timestamp=int(time.time() * 1000),
                )
                part = partition_response(c.send(produce_request(topic, 0, batch)))
                if int(part.error_code) != 0:
                    failed = (batch, int(part.error_code))
                    break
                acked.append((int(part.base_offset), seq))
                seq += 20
            assert failed is not None, f"the {small_disk.mode} disk never filled up"
            assert failed[1] == KAFKA_STORAGE_ERROR, f"error {failed[1]}, expected KAFKA_STORAGE_ERROR"
            assert b.running, "the broker died on a full disk"
            assert [o for o, _ in acked] == [20 * i for i in range(len(acked))]
            n_acked = 20 * len(acked)
            got = [r.value for r in fetch_records(c, topic)]
            assert len(got) == n_acked, f"{len(got)} records readable, {n_acked} acknowledged"
            assert all(v is not None and v[:6] == b"%06d" % i for i, v in enumerate(got)), (
                "acked data damaged"
            )

            if small_disk.grow(64):  # space is back: the retried batch lands right after
                part = partition_response(c.send(produce_request(topic, 0, failed[0])))
                assert int(part.error_code) == 0 and int(part.base_offset) == n_acked
                n_acked += 20
        b.kill()
        b.start()
        with WireClient(b.bootstrap) as c:
            got = [r.value for r in fetch_records(c, topic)]
        assert len(got) == n_acked and all(v is not None and v[:6] == b"%06d" % i for i, v in enumerate(got))
    finally:
        b.close()


# ------------------------------------------------------------------ __transaction_state tail
def _txn_state_logs(b: Broker) -> list[Path]:
    """Active segments of the __transaction_state partitions that hold records."""
    out = []
    for d in sorted(b.data_dir.glob("__transaction_state-*")):
        logs = sorted(d.glob("*.log"))
        if logs and logs[-1].stat().st_size > 0:
            out.append(logs[-1])
    return out


def _garbage_tail(seg: Path) -> None:
    with seg.open("ab") as f:
        f.write(os.urandom(300))


def _torn_last_batch(seg: Path) -> None:
    size = seg.stat().st_size
    os.truncate(seg, size - 7)  # the last record (CompleteCommit) loses its end


@pytest.mark.parametrize(
    "damage", [_garbage_tail, _torn_last_batch], ids=["garbage-tail", "torn-last-record"]
)
def test_corrupt_transaction_state_tail_keeps_transactions_exactly_once(
    fresh_broker: BrokerFactory, topic: str, unique_name: Callable[[str], str], damage: Callable[[Path], None]
) -> None:
    b = fresh_broker(**fresh_config())
    create_topic(b.bootstrap, topic, partitions=2)
    tid = unique_name("tx-state")
    p = txn_producer(b.bootstrap, tid)
    p.init_transactions(15)
    committed: list[bytes] = []
    for i in range(4):
        p.begin_transaction()
        vals = [f"t{i}-{j}".encode() for j in range(3)]
        produce_flush(p, [(topic, j % 2, v) for j, v in enumerate(vals)])
        if i == 2:
            p.abort_transaction(15)
        else:
            p.commit_transaction(15)
            committed += vals
    b.kill()
    segs = _txn_state_logs(b)
    assert segs, "no __transaction_state data on disk"
    for seg in segs:
        damage(seg)
    b.start()
    assert sorted(values(read_to_end(b.bootstrap, topic, (0, 1), READ_COMMITTED))) == sorted(committed)
    hw = end_offsets(b.bootstrap, topic, (0, 1), READ_UNCOMMITTED)
    assert end_offsets(b.bootstrap, topic, (0, 1), READ_COMMITTED) == hw, "LSO stuck after recovery"
    p2 = txn_producer(b.bootstrap, tid)
    p2.init_transactions(15)
    p2.begin_transaction()
    produce_flush(p2, [(topic, 0, b"after")])
    p2.commit_transaction(15)
    assert sorted(values(read_to_end(b.bootstrap, topic, (0, 1), READ_COMMITTED))) == sorted(
        [*committed, b"after"]
    )
    b.kill()  # and the repaired log recovers again
    b.start()
    assert sorted(values(read_to_end(b.bootstrap, topic, (0, 1), READ_COMMITTED))) == sorted(
        [*committed, b"after"]
    )


# ------------------------------------------------------------------ truncated / garbled indexes
def _half(f: Path) -> None:
    os.truncate(f, f.stat().st_size // 2)


def _odd(f: Path) -> None:
    if f.stat().st_size > 3:
        os.truncate(f, f.stat().st_size - 3)


def _garble(f: Path) -> None:
    f.write_bytes(os.urandom(f.stat().st_size))


@pytest.mark.parametrize("damage", [_half, _odd, _garble], ids=["half", "odd-size", "garbled"])
def test_truncated_or_garbled_indexes_are_rebuilt(
    fresh_broker: BrokerFactory, topic: str, damage: Callable[[Path], None]
) -> None:
    b: Broker = fresh_broker(**{"log.segment.bytes": "16384", "log.index.interval.bytes": "256"})
    create_topic(b.bootstrap, topic)
    base = int(time.time() * 1000) - 1_000_000
    p = producer(b.bootstrap, linger_ms=0)
    n = 500
    for i in range(n):
        p.produce(topic, value=b"%05d" % i + b"." * 60, partition=0, timestamp=base + 10 * i)
        if i % 10 == 9:
            p.flush(10)
    assert p.flush(10) == 0
    b.kill()
    files = [f for f in b.partition_dir(topic).iterdir() if f.suffix in (".index", ".timeindex")]
    assert files
    for f in files:
        damage(f)
    b.start()
    for start in (0, 1, 137, 250, 499):
        got = consume(b.bootstrap, topic, 2, start=start, idle=3)
        assert got and got[0].offset == start, f"read from {start}: {[g.offset for g in got]}"
        assert got[0].value is not None and got[0].value.startswith(b"%05d" % start)
    c: Any = consumer(b.bootstrap)
    try:
        for i in (0, 99, 333, 499):
            (res,) = c.offsets_for_times([TopicPartition(topic, 0, base + 10 * i)], timeout=10)
            assert res.offset == i, f"offsets_for_times for record {i} -> {res.offset}"
    finally:
        c.close()
