"""Crash recovery through the broker: kill -9 mid-produce, torn segment tails, lost indexes,
corrupt producer snapshots. After each, everything acknowledged is readable and the broker
keeps working."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from exactly.records.builder import Record, build_batch
from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.clients import consume, consumer, create_topic, produce_values, producer, watermarks
from tests.support.wire import (
    WireClient,
    fetch_records,
    init_producer_id,
    log_end_offset,
    partition_response,
    produce_request,
)

pytestmark = pytest.mark.timeout(120)


def active_segment(partition_dir: Path) -> Path:
    logs = sorted(partition_dir.glob("*.log"))
    assert logs, f"no segments in {partition_dir}: {sorted(os.listdir(partition_dir))}"
    return logs[-1]


def read_all_values(bootstrap: str, topic: str) -> list[bytes | None]:
    """Every record of partition 0, up to the high watermark."""
    low, high = watermarks(bootstrap, topic)
    assert low == 0
    got = consume(bootstrap, topic, high, timeout=60)
    assert [g.offset for g in got] == list(range(high)), "offsets are not dense from 0"
    return [g.value for g in got]


@pytest.mark.slow
def test_kill9_during_long_produce_keeps_every_acked_record(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker(**{"log.segment.bytes": str(256 * 1024)})
    create_topic(b.bootstrap, topic)
    p = producer(b.bootstrap, **{"linger.ms": 1, "message.timeout.ms": 10_000, "batch.num.messages": 200})
    acked: list[int] = []
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            acked.append(int(msg.value()))

    def run() -> None:
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=b"%08d" % i, partition=0, on_delivery=on_delivery)
                i += 1
            except BufferError:
                p.poll(0.01)
            if i % 50 == 0:
                p.poll(0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: len(acked) >= 20_000, 30, "20000 records acknowledged before the kill")
    b.kill()  # mid-stream: batches are in flight
    stop.set()
    t.join(10)
    p.purge(in_queue=True, in_flight=True)
    p.poll(0.5)
    p.flush(1)
    acked_now = set(acked)
    assert len(acked_now) >= 1000, f"only {len(acked_now)} acked before the crash"

    b.start()
    values = read_all_values(b.bootstrap, topic)
    numbers = [int(v or b"-1") for v in values]
    missing = acked_now - set(numbers)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:10]}"
    assert len(numbers) == len(set(numbers)), "duplicates after recovery"
    assert numbers == sorted(numbers), "order changed after recovery"
    # and the recovered log takes new writes at the right offset
    assert produce_values(b.bootstrap, topic, [b"after-crash"]) == [len(numbers)]


def _torn_tail_setup(fresh_broker: Any, topic: str) -> tuple[Broker, Path]:
    b: Broker = fresh_broker()
    create_topic(b.bootstrap, topic)
    p = producer(b.bootstrap, linger_ms=100)
    for chunk in range(10):  # ten batches of ten
        for i in range(10):
            p.produce(topic, value=f"v{chunk * 10 + i}".encode(), partition=0)
        assert p.flush(10) == 0
    b.kill()
    return b, active_segment(b.partition_dir(topic))


def _half_batch() -> bytes:
    batch = build_batch([Record(value=b"z" * 500)], base_offset=100, base_timestamp=int(time.time() * 1000))
    return batch[: len(batch) // 2]


def _bad_crc_batch() -> bytes:
    batch = bytearray(
        build_batch([Record(value=b"y" * 100)], base_offset=100, base_timestamp=int(time.time() * 1000))
    )
    batch[-1] ^= 0xFF
    return bytes(batch)


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(lambda: os.urandom(333), id="garbage"),
        pytest.param(_half_batch, id="half-batch"),
        pytest.param(_bad_crc_batch, id="bad-crc-batch"),
        pytest.param(lambda: b"\x00" * 4096, id="zeros"),
    ],
)
def test_torn_tail_is_truncated(fresh_broker: Any, topic: str, tail: Any) -> None:
    b, segment = _torn_tail_setup(fresh_broker, topic)
    with segment.open("ab") as f:
        f.write(tail())
    b.start()
    assert watermarks(b.bootstrap, topic) == (0, 100)
    assert read_all_values(b.bootstrap, topic) == [f"v{i}".encode() for i in range(100)]
    assert produce_values(b.bootstrap, topic, [b"new-1", b"new-2"]) == [100, 101]
    values = read_all_values(b.bootstrap, topic)
    assert values[-3:] == [b"v99", b"new-1", b"new-2"]
    b.kill()  # and once more: the repaired segment recovers cleanly
    b.start()
    assert read_all_values(b.bootstrap, topic)[-1] == b"new-2"


@pytest.mark.parametrize("shutdown", ["clean", "kill-9"])
def test_deleted_indexes_are_rebuilt(fresh_broker: Any, topic: str, shutdown: str) -> None:
    b: Broker = fresh_broker(**{"log.segment.bytes": "16384", "log.index.interval.bytes": "256"})
    create_topic(b.bootstrap, topic)
    base = int(time.time() * 1000) - 1_000_000
    p = producer(b.bootstrap, linger_ms=0)
    n = 600
    for i in range(n):
        p.produce(topic, value=b"%05d" % i + b"." * 60, partition=0, timestamp=base + 10 * i)
        if i % 10 == 9:
            p.flush(10)
    assert p.flush(10) == 0
    pdir = b.partition_dir(topic)
    assert len(list(pdir.glob("*.log"))) > 2, "expected several segments"
    if shutdown == "clean":
        assert b.stop() == 0
    else:
        b.kill()
    removed = [f for f in pdir.iterdir() if f.suffix in (".index", ".timeindex")]
    assert removed, f"no index files in {sorted(os.listdir(pdir))}"
    for f in removed:
        f.unlink()
    b.start()

    for start in (0, 1, 137, 299, 300, 455, 599):
        got = consume(b.bootstrap, topic, 3, start=start, idle=3)
        assert got, f"nothing read from offset {start}"
        assert got[0].offset == start
        assert got[0].value is not None and got[0].value.startswith(b"%05d" % start)
    c = consumer(b.bootstrap)
    try:
        for i in (0, 1, 250, 333, 599):
            (res,) = c.offsets_for_times([TopicPartition(topic, 0, base + 10 * i)], timeout=10)
            assert res.offset == i, f"offsets_for_times({base + 10 * i}) -> {res.offset}, expected {i}"
            (res,) = c.offsets_for_times([TopicPartition(topic, 0, base + 10 * i - 5)], timeout=10)
            assert res.offset == i
    finally:
        c.close()


def _idempotent_batches(b: Broker, topic: str) -> tuple[int, int, list[bytes]]:
    with WireClient(b.bootstrap) as c:
        from tests.support.wire import create_topic as wire_create

        assert wire_create(c, topic).error_code == 0
        pid, epoch = init_producer_id(c)
        batches = [
            build_batch(
                [Record(value=f"s{3 * i + j}".encode()) for j in range(3)],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=3 * i,
                base_timestamp=int(time.time() * 1000),
            )
            for i in range(6)
        ]
        for i, x in enumerate(batches):
            part = partition_response(c.send(produce_request(topic, 0, x)))
            assert part.error_code == 0 and int(part.base_offset) == 3 * i
    return pid, epoch, batches


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_producer_snapshot_falls_back_to_log_replay(
    fresh_broker: Any, topic: str, damage: str
) -> None:
    b: Broker = fresh_broker()
    pid, epoch, batches = _idempotent_batches(b, topic)
    assert b.stop() == 0  # a clean shutdown writes producer snapshots
    snapshots = list(b.partition_dir(topic).glob("*.snapshot"))
    assert snapshots, (
        f"no producer snapshot after clean shutdown: {sorted(os.listdir(b.partition_dir(topic)))}"
    )
    for snap in snapshots:
        data = snap.read_bytes()
        if damage == "garbage":
            snap.write_bytes(os.urandom(max(len(data), 64)))
        elif damage == "truncated":
            snap.write_bytes(data[: len(data) // 2])
        else:
            snap.write_bytes(b"")
    b.start()
    with WireClient(b.bootstrap) as c:
        assert log_end_offset(c, topic) == 18
        for i in (1, 3, 5):  # still deduplicated: state rebuilt from the log
            part = partition_response(c.send(produce_request(topic, 0, batches[i])))
            assert part.error_code == 0 and int(part.base_offset) == 3 * i
        assert log_end_offset(c, topic) == 18
        gap = build_batch([Record(value=b"gap")], producer_id=pid, producer_epoch=epoch, base_sequence=20)
        assert partition_response(c.send(produce_request(topic, 0, gap))).error_code == 45
        nxt = build_batch([Record(value=b"next")], producer_id=pid, producer_epoch=epoch, base_sequence=18)
        part = partition_response(c.send(produce_request(topic, 0, nxt)))
        assert part.error_code == 0 and int(part.base_offset) == 18
        assert [r.value for r in fetch_records(c, topic)][-2:] == [b"s17", b"next"]


def test_restart_keeps_topics_configs_and_data(fresh_broker: Any, topic: str) -> None:
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    from tests.support.clients import admin

    b: Broker = fresh_broker()
    create_topic(b.bootstrap, topic, partitions=3, config={"retention.ms": "86400000"})
    for part in range(3):
        produce_values(b.bootstrap, topic, [f"p{part}-{i}".encode() for i in range(5)], partition=part)
    for how in ("clean", "kill-9"):
        if how == "clean":
            assert b.stop() == 0
        else:
            b.kill()
        b.start()
        a = admin(b.bootstrap)
        md = a.list_topics(timeout=10)
        assert sorted(md.topics[topic].partitions) == [0, 1, 2], how
        res = ConfigResource(ResourceType.TOPIC, topic)
        configs = a.describe_configs([res], request_timeout=10)[res].result(10)
        assert configs["retention.ms"].value == "86400000", how
        got = consume(b.bootstrap, topic, 15, partitions=(0, 1, 2))
        for part in range(3):
            values = [g.value for g in got if g.partition == part]
            assert values == [f"p{part}-{i}".encode() for i in range(5)], how
