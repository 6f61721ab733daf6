"""DeleteRecords (API 21) through the real broker: every version on the wire, confluent-kafka's and
kafka-python's admin clients, kcat reading from the new log start, kill -9 after a deletion, and
a group consumer whose committed offset fell below the new start."""

from __future__ import annotations

import datetime
import importlib
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from tests.support.broker import Broker
from tests.support.clients import admin, consume, consumer, create_topic, produce_values, watermarks
from tests.support.txn_helpers import produce_flush, read_to_end, txn_producer, wire_list_offset
from tests.support.wire import (
    WireClient,
    fetch_records,
    fetch_request,
    list_offset,
    partition_response,
    produce_request,
    simple_batch,
)
from tests.support.wire import create_topic as wire_create_topic

pytestmark = pytest.mark.timeout(90)

SEGMENTED = {"segment.bytes": "1024"}


def delete_records(
    client: WireClient, topic: str, offsets: dict[int, int], version: int = 2
) -> dict[int, Any]:
    """One DeleteRecords request -> {partition: result} (error_code, low_watermark)."""
    mod: Any = importlib.import_module(f"kio.schema.delete_records.v{version}.request")
    request = mod.DeleteRecordsRequest(
        topics=(
            mod.DeleteRecordsTopic(
                name=TopicName(topic),
                partitions=tuple(
                    mod.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o))
                    for p, o in offsets.items()
                ),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
    )
    (t,) = client.send(request).topics
    assert t.name == topic
    return {int(p.partition_index): p for p in t.partitions}


def segment_bases(partition_dir: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in partition_dir.glob("*.log"))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_wire_versions_and_errors(broker: Broker, topic: str, version: int) -> None:
    with WireClient(broker.bootstrap) as c:
        assert wire_create_topic(c, topic, partitions=2).error_code == 0
        assert wire_create_topic(c, topic + "-c", configs={"cleanup.policy": "compact"}).error_code == 0
        for chunk in (range(4), range(4, 10)):  # two batches: 0-3 and 4-9
            batch = simple_batch([f"v{i}".encode() for i in chunk])
            assert partition_response(c.send(produce_request(topic, 0, batch))).error_code == 0

        result = delete_records(c, topic, {0: 6, 1: 0, 7: 1}, version)
        assert (result[0].error_code, int(result[0].low_watermark)) == (ErrorCode.none, 6)
        assert (result[1].error_code, int(result[1].low_watermark)) == (ErrorCode.none, 0)
        assert (result[7].error_code, int(result[7].low_watermark)) == (
            ErrorCode.unknown_topic_or_partition,
            -1,
        )
        assert list_offset(c, topic, 0, -2) == (0, 6)  # ListOffsets EARLIEST: the new start
        # The start lies inside the second batch: a fetch there returns that batch whole.
        assert [r.offset for r in fetch_records(c, topic, offset=6)] == [6, 7, 8, 9]
        (t,) = c.send(fetch_request(topic, 0, 5)).responses
        (p,) = t.partitions
        # Kafka writes unknown (-1) offsets on an error partition (ReplicaManager.createLogReadResult)
        assert p.error_code == ErrorCode.offset_out_of_range and int(p.log_start_offset) == -1

        beyond = delete_records(c, topic, {0: 11}, version)[0]
        assert (beyond.error_code, int(beyond.low_watermark)) == (ErrorCode.offset_out_of_range, -1)
        back = delete_records(c, topic, {0: 2}, version)[0]  # never backwards
        assert (back.error_code, int(back.low_watermark)) == (ErrorCode.none, 6)
        to_hw = delete_records(c, topic, {0: -1}, version)[0]  # -1: the high watermark
        assert (to_hw.error_code, int(to_hw.low_watermark)) == (ErrorCode.none, 10)
        assert list_offset(c, topic, 0, -2) == (0, 10)
        assert list_offset(c, topic, 0, -1) == (0, 10)

        compacted = delete_records(c, topic + "-c", {0: 0}, version)[0]
        assert compacted.error_code == ErrorCode.policy_violation
        internal = delete_records(c, "__consumer_offsets", {0: 0}, version)[0]
        assert internal.error_code == ErrorCode.invalid_topic_exception
        unknown = delete_records(c, topic + "-none", {0: 0}, version)[0]
        assert unknown.error_code == ErrorCode.unknown_topic_or_partition


def test_confluent_admin_delete_records(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, config=SEGMENTED)
    create_topic(broker.bootstrap, topic + "-c", config={"cleanup.policy": "compact"})
    values = [b"%04d" % i + b"." * 40 for i in range(200)]
    produce_values(broker.bootstrap, topic, values, linger_ms=0, batch_num_messages=10)
    bases = segment_bases(broker.partition_dir(topic))
    assert len(bases) > 3, bases

    client = admin(broker.bootstrap)
    futures = client.delete_records([TopicPartition(topic, 0, 120)], request_timeout=15)
    (deleted,) = [f.result(15) for f in futures.values()]
    assert deleted.low_watermark == 120
    assert watermarks(broker.bootstrap, topic) == (120, 200)
    remaining = segment_bases(broker.partition_dir(topic))
    assert remaining == [b for b in bases if b >= max(b for b in bases if b <= 120)]
    got = consume(broker.bootstrap, topic, 80)
    assert [g.offset for g in got] == list(range(120, 200))
    assert [g.value for g in got] == values[120:]

    for tp, expected in (
        (TopicPartition(topic, 0, 201), KafkaError.OFFSET_OUT_OF_RANGE),
        (TopicPartition(topic + "-c", 0, 0), KafkaError.POLICY_VIOLATION),
    ):
        future = client.delete_records([tp], request_timeout=15)[tp]
        with pytest.raises(KafkaException) as info:
            future.result(15)
        assert info.value.args[0].code() == expected
    end = TopicPartition(topic, 0, -1)  # OFFSET_END: everything up to the high watermark
    assert client.delete_records([end], request_timeout=15)[end].result(15).low_watermark == 200
    assert watermarks(broker.bootstrap, topic) == (200, 200)


def test_kafka_python_admin_delete_records(broker: Broker, topic: str) -> None:
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import OffsetOutOfRangeError

    create_topic(broker.bootstrap, topic, partitions=2)
    produce_values(broker.bootstrap, topic, [b"a%d" % i for i in range(40)], partition=1)
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15_000)
    try:
        result = client.delete_records({KTopicPartition(topic, 1): 30})
        (entry,) = result.values()
        assert entry["error_code"] == 0 and entry["low_watermark"] == 30
        with pytest.raises(OffsetOutOfRangeError):
            client.delete_records({KTopicPartition(topic, 1): 41})
    finally:
        client.close()
    assert watermarks(broker.bootstrap, topic, partition=1) == (30, 40)
    assert [g.offset for g in consume(broker.bootstrap, topic, 10, partitions=(1,))] == list(range(30, 40))


def test_kcat_reads_from_the_new_log_start(kcat: str, broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [b"k%d" % i for i in range(50)])
    with WireClient(broker.bootstrap) as c:
        assert int(delete_records(c, topic, {0: 37})[0].low_watermark) == 37

    def run(*args: str) -> str:
        proc = subprocess.run(
            [kcat, "-b", broker.bootstrap, "-m", "10", *args],
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout.decode()

    rows = run("-C", "-t", topic, "-o", "beginning", "-e", "-f", "%o %s\n").split("\n")
    assert [r for r in rows if r] == [f"{i} k{i}" for i in range(37, 50)]
    assert f"{topic} [0] offset 37" in run("-Q", "-t", f"{topic}:0:-2")  # earliest
    # An absolute offset below the start is out of range: kcat resets (to the start, earliest).
    rows = run("-C", "-t", topic, "-o", "5", "-e", "-X", "auto.offset.reset=earliest", "-f", "%o\n").split()
    assert rows == [str(i) for i in range(37, 50)]


def test_delete_records_survives_kill_9(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker()
    create_topic(b.bootstrap, topic, config=SEGMENTED)
    values = [b"%04d" % i + b"." * 40 for i in range(300)]
    produce_values(b.bootstrap, topic, values, linger_ms=0, batch_num_messages=10)
    client = admin(b.bootstrap)
    tp = TopicPartition(topic, 0, 170)
    assert client.delete_records([tp], request_timeout=15)[tp].result(15).low_watermark == 170
    kept = segment_bases(b.partition_dir(topic))
    b.kill()
    b.restart()

    assert segment_bases(b.partition_dir(topic)) == kept
    assert watermarks(b.bootstrap, topic) == (170, 300)
    with WireClient(b.bootstrap) as c:
        assert list_offset(c, topic, 0, -2) == (0, 170)
        (t,) = c.send(fetch_request(topic, 0, 169)).responses
        assert t.partitions[0].error_code == ErrorCode.offset_out_of_range
    got = consume(b.bootstrap, topic, 130)
    assert [g.value for g in got] == values[170:]
    assert produce_values(b.bootstrap, topic, [b"after"]) == [300]


@pytest.mark.parametrize("reset", ["earliest", "latest", "error"])
def test_group_consumer_below_the_new_start_resets(gb: Broker, topic: str, group: str, reset: str) -> None:
    create_topic(gb.bootstrap, topic)
    produce_values(gb.bootstrap, topic, [b"m%d" % i for i in range(50)])
    committer = consumer(gb.bootstrap, group_id=group)
    committer.commit(offsets=[TopicPartition(topic, 0, 10)], asynchronous=False)
    committer.close()
    with WireClient(gb.bootstrap) as c:
        assert int(delete_records(c, topic, {0: 30})[0].low_watermark) == 30

    c = consumer(gb.bootstrap, group_id=group, auto_offset_reset=reset)
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        next_new = time.monotonic()
        while time.monotonic() < deadline:
            if reset == "latest" and time.monotonic() >= next_new:
                # Whenever the reset happens, records produced after it are what a consumer
                # reset to the high watermark reads; the old ones (m0..m49) never come.
                produce_values(gb.bootstrap, topic, [b"new"])
                next_new = time.monotonic() + 1
            msg = c.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if reset == "error":
                assert err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET, err
                return
            assert err is None, err
            if reset == "earliest":
                assert (msg.offset(), msg.value()) == (30, b"m30")
            else:
                assert msg.offset() >= 50 and msg.value() == b"new"
            return
        pytest.fail(f"no message or error within 30 s (auto.offset.reset={reset})")
    finally:
        c.close()


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_delete_records_inside_an_open_transaction(broker: Broker, topic: str, outcome: str) -> None:
    """Kafka allows it (the bound is the high watermark, not the LSO): the transaction stays open,
    the LSO is clamped to the new start, and its outcome still decides what read_committed sees."""
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [b"plain0", b"plain1"])  # 0-1
    p = txn_producer(broker.bootstrap, f"{topic}-txn")
    p.init_transactions(15)
    p.begin_transaction()
    produce_flush(p, [(topic, 0, b"t%d" % i) for i in range(10)])  # 2-11, undecided
    with WireClient(broker.bootstrap) as c:
        assert int(delete_records(c, topic, {0: 7})[0].low_watermark) == 7
        assert wire_list_offset(c, topic, 0, -1, isolation_level=1)[2] == 7  # LSO clamped to start
        assert wire_list_offset(c, topic, 0, -2, isolation_level=1)[2] == 7
    if outcome == "commit":
        p.commit_transaction(15)
    else:
        p.abort_transaction(15)
    produce_values(broker.bootstrap, topic, [b"after"])
    got = read_to_end(broker.bootstrap, topic, [0], "read_committed")
    if outcome == "commit":
        assert [(g.offset, g.value) for g in got] == [(i, b"t%d" % (i - 2)) for i in range(7, 12)] + [
            (13, b"after")
        ]
    else:
        assert [(g.offset, g.value) for g in got] == [(13, b"after")]
