"""Log compaction through real clients: a compacted topic written by an idempotent producer and
a transactional one (commits, aborts, tombstones); the broker's cleaner thread compacts it; a
consumer from offset 0 then sees the latest value of every key and never an aborted record, and
so does one after a restart."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.clients import consume, create_topic, producer, watermarks
from tests.support.metrics import metrics_url
from tests.support.txn_helpers import txn_producer

pytestmark = pytest.mark.timeout(120)

KEYS = 20
ROUNDS = 12


def log_bytes(b: Broker, topic: str) -> int:
    return sum(p.stat().st_size for p in Path(b.partition_dir(topic)).glob("*.log"))


def read_all(b: Broker, topic: str, *, isolation: str) -> list[Any]:
    _low, high = watermarks(b.bootstrap, topic)
    got = consume(b.bootstrap, topic, high, idle=1.0, **{"isolation.level": isolation})
    return got


def scrape(b: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(metrics_url(b), timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def latest(records: list[Any]) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for r in records:
        out[r.key] = r.value
    return out


def test_compacted_topic_keeps_latest_value_of_every_key_and_no_aborted_record(
    fresh_broker: Callable[..., Broker], unique_name: Callable[[str], str]
) -> None:
    b = fresh_broker(**{"log.cleaner.backoff.ms": "100", "metrics.port": "0"})
    topic = unique_name("compacted")
    create_topic(
        b.bootstrap,
        topic,
        config={
            "cleanup.policy": "compact",
            "segment.bytes": "4096",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",  # tombstones go at the pass after the one that marks them
        },
    )
    expected: dict[bytes, bytes | None] = {}
    tx = txn_producer(b.bootstrap, unique_name("tid"))
    tx.init_transactions(15)
    for round_ in range(3):  # committed and aborted transactions early in the log
        tx.begin_transaction()
        for k in range(KEYS):
            tx.produce(topic, key=b"k%02d" % k, value=b"aborted-%d" % round_)
        tx.abort_transaction(15)
        tx.begin_transaction()
        for k in range(0, KEYS, 2):
            value = b"txn-%d-%d" % (round_, k)
            tx.produce(topic, key=b"k%02d" % k, value=value)
            expected[b"k%02d" % k] = value
        tx.commit_transaction(15)
    p = producer(b.bootstrap, linger_ms=0)
    for round_ in range(ROUNDS):
        for k in range(KEYS):
            value = b"v-%d-%d-" % (round_, k) + b"." * 60
            p.produce(topic, key=b"k%02d" % k, value=value)
            expected[b"k%02d" % k] = value
        p.flush(10)
    for k in range(0, KEYS, 5):  # tombstones
        p.produce(topic, key=b"k%02d" % k, value=None)
        expected[b"k%02d" % k] = None
    p.flush(10)
    for k in range(KEYS):  # one more round, so the tombstones are in a closed segment
        if expected[b"k%02d" % k] is not None:
            value = b"last-%d" % k + b"." * 60
            p.produce(topic, key=b"k%02d" % k, value=value)
            expected[b"k%02d" % k] = value
    p.flush(10)
    _low, high = watermarks(b.bootstrap, topic)
    # The cleaner thread compacts the closed segments: the log shrinks to a fraction.
    wait_until(
        lambda: len(read_all(b, topic, isolation="read_uncommitted")) < high / 3,
        60,
        "the cleaner compacted the topic",
        interval=0.3,
        describe=lambda: f"{log_bytes(b, topic)} bytes in the log",
    )
    assert f"cleaned {topic}-0" in b.log_text()
    series = scrape(b)
    assert series[("exactly_log_cleaner_passes_total", ())] >= 1
    assert (
        series[("exactly_log_cleaner_bytes_read_total", ())]
        > series[("exactly_log_cleaner_bytes_written_total", ())]
    )
    assert series[("exactly_log_cleaner_uncleanable_partitions_count", ())] == 0
    assert series[("exactly_log_cleaner_max_owner_hop_seconds", ())] > 0  # its swaps were timed
    assert ("exactly_partition_dirty_ratio", (("partition", "0"), ("topic", topic))) in series
    for broker_state in ("compacted", "restarted"):
        seen = read_all(b, topic, isolation="read_uncommitted")
        values = [r.value for r in seen]
        assert not [v for v in values if v is not None and v.startswith(b"aborted")], broker_state
        offsets = [r.offset for r in seen]
        assert offsets == sorted(offsets) and offsets[-1] == high - 1  # order kept, nothing renumbered
        view = {k: v for k, v in latest(seen).items()}
        live = {k: v for k, v in expected.items() if v is not None}
        assert {k: v for k, v in view.items() if v is not None} == live, broker_state
        assert len(seen) < high / 3, broker_state
        committed = read_all(b, topic, isolation="read_committed")
        assert {k: v for k, v in latest(committed).items() if v is not None} == live
        b.restart()
    assert watermarks(b.bootstrap, topic)[1] == high


def test_internal_topics_are_compacted_and_coordinators_reload_from_them(
    fresh_broker: Callable[..., Broker], unique_name: Callable[[str], str]
) -> None:
    """Many offset commits and transactions over a few keys: the cleaner compacts
    ``__consumer_offsets`` and ``__transaction_state``; after a restart the group's offsets and the
    transactional id's state are what they were."""
    from confluent_kafka import TopicPartition as TP

    from tests.support.clients import consumer

    b = fresh_broker(
        **{
            "log.cleaner.backoff.ms": "100",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            "offsets.topic.segment.bytes": "4096",
            "transaction.state.log.segment.bytes": "4096",
            "log.cleaner.min.cleanable.ratio": "0.1",
        }
    )
    topic, group, tid = unique_name("data"), unique_name("g"), unique_name("tid")
    create_topic(b.bootstrap, topic)
    c = consumer(b.bootstrap, **{"group.id": group})
    for i in range(300):
        c.commit(offsets=[TP(topic, 0, i)], asynchronous=False)
    c.close()
    tx = txn_producer(b.bootstrap, tid)
    tx.init_transactions(15)
    txn_group = unique_name("tg")
    txn_consumer = consumer(b.bootstrap, **{"group.id": txn_group})
    metadata = txn_consumer.consumer_group_metadata()
    for i in range(40):
        tx.begin_transaction()
        tx.produce(topic, key=b"k", value=b"t%d" % i)
        # Transactional offset commits: transactional batches and markers in __consumer_offsets.
        tx.send_offsets_to_transaction([TP(topic, 0, 1000 + i)], metadata, 15)
        if i % 4 == 3:
            tx.abort_transaction(15)
        else:
            tx.commit_transaction(15)
    tx.flush(10)
    txn_consumer.close()
    for internal in ("__consumer_offsets", "__transaction_state"):
        wait_until(
            lambda internal=internal: f"cleaned {internal}-0" in b.log_text(),
            60,
            f"the cleaner compacted {internal}",
            interval=0.3,
        )
    wait_until(
        lambda: log_bytes(b, "__consumer_offsets") < 4 * 4096,
        60,
        "__consumer_offsets shrank",
        interval=0.3,
        describe=lambda: f"{log_bytes(b, '__consumer_offsets')} bytes",
    )
    b.restart()
    c = consumer(b.bootstrap, **{"group.id": group})
    try:
        (committed,) = c.committed([TP(topic, 0)], timeout=15)
        assert committed.offset == 299
    finally:
        c.close()
    c = consumer(b.bootstrap, **{"group.id": txn_group})
    try:
        (committed,) = c.committed([TP(topic, 0)], timeout=15)
        assert committed.offset == 1038  # the last committed transaction's; 1039 was aborted
    finally:
        c.close()
    # The transactional id's state survived compaction: a new producer fences the old one and goes on.
    tx2 = txn_producer(b.bootstrap, tid)
    tx2.init_transactions(15)
    tx2.begin_transaction()
    tx2.produce(topic, key=b"k", value=b"after")
    tx2.commit_transaction(15)
    values = [r.value for r in read_all(b, topic, isolation="read_committed")]
    assert values[-1] == b"after"
    assert not [v for v in values if v in {b"t%d" % i for i in range(3, 40, 4)}]


@pytest.mark.parametrize(
    "step",
    [
        "cleaned_flushed",
        "swap_indexes_renamed",
        "swap_committed",
        "old_segment_renamed",
        "new_log_renamed",
        # on the cleaner's thread (the swap's end runs off the event loop), replaced files not yet removed
        "swap_done",
    ],
)
def test_kill_9_at_each_swap_step_loses_nothing(
    fresh_broker: Callable[..., Broker], unique_name: Callable[[str], str], step: str
) -> None:
    b = fresh_broker(
        env={"EXACTLY_FAULT": f"cleaner-crash-at-{step}"},
        **{"log.cleaner.backoff.ms": "100", "log.cleaner.min.cleanable.ratio": "0.01"},
    )
    topic = unique_name("crash")
    create_topic(b.bootstrap, topic, config={"cleanup.policy": "compact", "segment.bytes": "2048"})
    expected: dict[bytes, bytes] = {}
    p = producer(b.bootstrap, linger_ms=0, **{"message.timeout.ms": 5000})
    acked = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    sent = 0
    for round_ in range(30):
        if b.returncode is not None:
            break
        batch = {b"k%02d" % k: b"v-%d-%d" % (round_, k) for k in range(10)}
        for key, value in batch.items():
            p.produce(topic, key=key, value=value, on_delivery=on_delivery)
        sent += len(batch)
        if p.flush(10) == 0 and acked == sent:
            expected.update(batch)  # everything acknowledged so far
    wait_until(lambda: b.returncode is not None, 60, f"the broker killed itself at {step}", interval=0.2)
    p.flush(1)
    b.env.pop("EXACTLY_FAULT")
    # Restarted with the cleaner off: what is on disk is recovery's work alone (a new pass would
    # write files of its own meanwhile).
    b.overrides["log.cleaner.enable"] = "false"
    b.restart()
    assert f"EXACTLY_FAULT=cleaner-crash-at-{step}" in b.log_text()
    seen = read_all(b, topic, isolation="read_committed")
    offsets = [r.offset for r in seen]
    assert offsets == sorted(set(offsets))
    view = latest(seen)
    for key, value in expected.items():  # every acknowledged key has its newest acknowledged value
        assert view[key] is not None
        assert int(view[key].split(b"-")[1]) >= int(value.split(b"-")[1]), key
    assert not [
        p
        for p in Path(b.partition_dir(topic)).iterdir()
        if p.name.endswith((".cleaned", ".swap", ".deleted"))
    ]


def test_read_committed_consumer_reading_while_the_cleaner_runs(
    fresh_broker: Callable[..., Broker], unique_name: Callable[[str], str]
) -> None:
    """Transactions (some aborted) keep coming while the cleaner compacts: a read_committed
    consumer polling all along sees offsets only increase, never an aborted record, and ends with
    the latest committed value of every key."""
    import threading

    from tests.support.clients import consumer

    b = fresh_broker(**{"log.cleaner.backoff.ms": "50", "log.cleaner.min.cleanable.ratio": "0.01"})
    topic = unique_name("live")
    create_topic(b.bootstrap, topic, config={"cleanup.policy": "compact", "segment.bytes": "2048"})
    expected: dict[bytes, bytes] = {}
    seen: list[Any] = []
    stop = threading.Event()

    def read() -> None:
        from confluent_kafka import TopicPartition as TP

        c = consumer(b.bootstrap, **{"isolation.level": "read_committed"})
        c.assign([TP(topic, 0, 0)])
        try:
            while not stop.is_set():
                for m in c.consume(num_messages=500, timeout=0.2):
                    assert m.error() is None, m.error()
                    seen.append((m.offset(), m.key(), m.value()))
        finally:
            c.close()

    reader = threading.Thread(target=read)
    reader.start()
    tx = txn_producer(b.bootstrap, unique_name("tid"))
    tx.init_transactions(15)
    try:
        for i in range(60):
            tx.begin_transaction()
            batch = {b"k%02d" % k: b"%s-%d-%d" % (b"a" if i % 3 == 2 else b"c", i, k) for k in range(8)}
            for key, value in batch.items():
                tx.produce(topic, key=key, value=value)
            if i % 3 == 2:
                tx.abort_transaction(15)
            else:
                tx.commit_transaction(15)
                expected.update(batch)
        _low, high = watermarks(b.bootstrap, topic)
        wait_until(lambda: f"cleaned {topic}-0" in b.log_text(), 60, "the cleaner ran", interval=0.2)
        wait_until(lambda: seen and seen[-1][0] >= high - 10, 30, "the reader reached the end", interval=0.2)
    finally:
        stop.set()
        reader.join(30)
    offsets = [o for o, _k, _v in seen]
    assert offsets == sorted(set(offsets))
    assert not [v for _o, _k, v in seen if v.startswith(b"a-")]
    assert {k: v for _o, k, v in seen} == expected
    # And a reader from 0 after compaction sees the same latest values.
    after = read_all(b, topic, isolation="read_committed")
    assert {r.key: r.value for r in after} == expected and len(after) < len(seen)


def test_a_cleaner_worker_dying_marks_the_partition_uncleanable_and_the_broker_serves_on(
    fresh_broker: Callable[..., Broker], unique_name: Callable[[str], str]
) -> None:
    """Every cleaner worker process exits abruptly mid-pass (``EXACTLY_FAULT``): the pass is
    retried once, then the partition is marked uncleanable with a log line; nothing is lost, no
    ``.cleaned`` file stays, and the broker keeps taking and serving writes."""
    b = fresh_broker(
        env={"EXACTLY_FAULT": "cleaner-worker-exit"},
        **{"log.cleaner.backoff.ms": "100", "log.cleaner.min.cleanable.ratio": "0.01", "metrics.port": "0"},
    )
    topic = unique_name("dying")
    create_topic(b.bootstrap, topic, config={"cleanup.policy": "compact", "segment.bytes": "2048"})
    p = producer(b.bootstrap, linger_ms=0)
    expected: dict[bytes, bytes] = {}
    for round_ in range(20):
        for k in range(10):
            key, value = b"k%02d" % k, b"v-%d-%d" % (round_, k)
            p.produce(topic, key=key, value=value)
            expected[key] = value
        p.flush(10)
    wait_until(
        lambda: scrape(b)[("exactly_log_cleaner_uncleanable_partitions_count", ())] == 1,
        60,
        "the partition marked uncleanable",
        interval=0.3,
    )
    text = b.log_text()
    assert "will be retried" in text and "marking it uncleanable" in text
    p.produce(topic, key=b"k00", value=b"after")
    assert p.flush(10) == 0
    expected[b"k00"] = b"after"
    seen = read_all(b, topic, isolation="read_committed")
    assert [r.offset for r in seen] == list(range(len(seen))) and latest(seen) == expected
    assert not [q for q in Path(b.partition_dir(topic)).iterdir() if q.name.endswith(".cleaned")]
