"""Transactions and read_committed with confluent-kafka (librdkafka 2.x).

Atomic commit/abort across topics and partitions, what read_committed and read_uncommitted
consumers see, where the markers sit, the last stable offset (LSO) holding consumers back at an open
transaction, offsets committed inside transactions (consume-transform-produce), zombie fencing by
transactional.id, the coordinator aborting a timed-out transaction, and transaction.max.timeout.ms.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from exactly.testing.wait import next_millisecond
from tests.support.broker import Broker
from tests.support.clients import QUIET, create_topic, produce_values
from tests.support.txn_helpers import (
    RDKAFKA_LOGGER,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    UNSTABLE_OFFSET_COMMIT,
    end_offsets,
    kafka_error,
    log_entries,
    plain_consumer,
    produce_flush,
    read_to_end,
    txn_broker_config,
    txn_producer,
    values,
    wait_until,
    wire_fetch,
    wire_list_offset,
    wire_offset_fetch,
)
from tests.support.wire import WireClient

pytestmark = pytest.mark.timeout(60)

MAX_TXN_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return txn_broker_config(**{"transaction.max.timeout.ms": str(MAX_TXN_TIMEOUT_MS)})


@pytest.fixture
def tb(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture
def tid(unique_name: Callable[[str], str]) -> str:
    return unique_name("tx")


@pytest.fixture(autouse=True)
def _collect_clients() -> Iterator[None]:
    """confluent Producers have no close(): destroy this test's (fenced ones sit in exception
    tracebacks) before the module broker goes away, or they keep reconnecting and logging."""
    yield
    gc.collect()


def _marker_layout(bootstrap: str, topic: str, partition: int) -> list[tuple[int, str]]:
    """[(offset, 'data' | 'COMMIT' | 'ABORT')] of a partition's whole log."""
    with WireClient(bootstrap) as wc:
        return [(e.offset, e.kind) for e in log_entries(wc, topic, partition)]


# ---------------------------------------------------------------------------- 1. commit / abort
def test_commit_and_abort_across_two_topics_and_partitions(
    tb: Broker, unique_name: Callable[[str], str], tid: str
) -> None:
    topics = [unique_name("txa"), unique_name("txb")]
    for t in topics:
        create_topic(tb.bootstrap, t, partitions=2)
    tps = [(t, p) for t in topics for p in (0, 1)]

    p = txn_producer(tb.bootstrap, tid)
    p.init_transactions(15)

    def txn_items(tag: str, n: int) -> list[tuple[str, int, bytes]]:
        return [(t, part, f"{tag}-{t}-{part}-{i}".encode()) for t, part in tps for i in range(n)]

    committed1, aborted2, open3 = txn_items("c1", 3), txn_items("a2", 2), txn_items("o3", 2)
    p.begin_transaction()
    produce_flush(p, committed1)
    p.commit_transaction(15)
    p.begin_transaction()
    produce_flush(p, aborted2)
    p.abort_transaction(15)
    p.begin_transaction()
    produce_flush(p, open3)  # stays open while we read

    def seen(isolation: str) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
        out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        for t in topics:
            for r in read_to_end(tb.bootstrap, t, (0, 1), isolation):
                assert r.value is not None, f"a record without value (a control record?) was delivered: {r}"
                out.setdefault((t, r.partition), []).append((r.offset, r.value))
        return out

    def vals(items: list[tuple[str, int, bytes]], t: str, part: int) -> list[bytes]:
        return [v for tt, pp, v in items if (tt, pp) == (t, part)]

    # while txn 3 is open: read_committed = txn 1 only; read_uncommitted = all three
    rc, ru = seen(READ_COMMITTED), seen(READ_UNCOMMITTED)
    for t, part in tps:
        assert [v for _, v in rc.get((t, part), [])] == vals(committed1, t, part), (t, part)
        assert [v for _, v in ru[(t, part)]] == vals(committed1, t, part) + vals(aborted2, t, part) + vals(
            open3, t, part
        ), (t, part)
        # layout: c1 at 0-2, COMMIT at 3, a2 at 4-5, ABORT at 6, o3 at 7-8 (open)
        assert [o for o, _ in ru[(t, part)]] == [0, 1, 2, 4, 5, 7, 8], (t, part)
        assert end_offsets(tb.bootstrap, t, [part], READ_COMMITTED) == {part: 7}, (
            "LSO = first offset of txn 3"
        )
        assert end_offsets(tb.bootstrap, t, [part], READ_UNCOMMITTED) == {part: 9}

    p.commit_transaction(15)

    rc = seen(READ_COMMITTED)
    ru = seen(READ_UNCOMMITTED)
    for t, part in tps:
        assert [v for _, v in rc[(t, part)]] == vals(committed1, t, part) + vals(open3, t, part), (t, part)
        assert [o for o, _ in rc[(t, part)]] == [0, 1, 2, 7, 8], (
            "gaps where the markers and aborted records are"
        )
        assert [o for o, _ in ru[(t, part)]] == [0, 1, 2, 4, 5, 7, 8], "gaps only where the markers are"
        # the gaps are the control batches, each with the right type
        assert _marker_layout(tb.bootstrap, t, part) == [
            (0, "data"), (1, "data"), (2, "data"), (3, "COMMIT"),
            (4, "data"), (5, "data"), (6, "ABORT"),
            (7, "data"), (8, "data"), (9, "COMMIT"),
        ], (t, part)  # fmt: skip
        assert end_offsets(tb.bootstrap, t, [part], READ_COMMITTED) == {part: 10}
        assert end_offsets(tb.bootstrap, t, [part], READ_UNCOMMITTED) == {part: 10}
    p.flush(5)


# ---------------------------------------------------------------------------- 2. LSO
def test_read_committed_blocks_at_open_transaction_and_resumes_after_commit(
    tb: Broker, topic: str, tid: str
) -> None:
    create_topic(tb.bootstrap, topic, partitions=1)
    early = txn_producer(tb.bootstrap, tid + "-early")
    early.init_transactions(15)
    early.begin_transaction()
    produce_flush(early, [(topic, 0, b"early-0"), (topic, 0, b"early-1")])  # offsets 0, 1
    early.commit_transaction(15)  # COMMIT at 2

    hanging = txn_producer(tb.bootstrap, tid + "-open")
    hanging.init_transactions(15)
    hanging.begin_transaction()
    assert produce_flush(hanging, [(topic, 0, b"open-0"), (topic, 0, b"open-1")]) == [(0, 3), (0, 4)]
    produce_values(tb.bootstrap, topic, [b"plain-0", b"plain-1"])  # non-transactional, offsets 5, 6
    early.begin_transaction()
    produce_flush(early, [(topic, 0, b"late-0")])  # offset 7, COMMIT at 8: committed, yet behind the LSO
    early.commit_transaction(15)

    # the LSO is the first offset of the open transaction, whatever committed after it
    assert end_offsets(tb.bootstrap, topic, [0], READ_COMMITTED) == {0: 3}
    assert end_offsets(tb.bootstrap, topic, [0], READ_UNCOMMITTED) == {0: 9}
    with WireClient(tb.bootstrap) as wc:
        assert wire_list_offset(wc, topic, 0, -1, isolation_level=1)[::2] == (0, 3)
        assert wire_list_offset(wc, topic, 0, -1, isolation_level=0)[::2] == (0, 9)
        fetched = wire_fetch(wc, topic, 0, 0, isolation_level=1)
        assert (fetched.high_watermark, fetched.last_stable_offset) == (9, 3)
    assert values(read_to_end(tb.bootstrap, topic, [0], READ_COMMITTED)) == [b"early-0", b"early-1"]
    assert values(read_to_end(tb.bootstrap, topic, [0], READ_UNCOMMITTED)) == [
        b"early-0", b"early-1", b"open-0", b"open-1", b"plain-0", b"plain-1", b"late-0",
    ]  # fmt: skip

    # a live read_committed consumer is held at the LSO, then gets everything right after the commit
    c = plain_consumer(tb.bootstrap, READ_COMMITTED)
    got: list[tuple[int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for m in c.consume(100, 0.1):
                assert m.error() is None, m.error()
                got.append((int(m.offset() or 0), m.value()))
        assert got == [(0, b"early-0"), (1, b"early-1")], "read_committed went past the open transaction"
        assert c.position([TopicPartition(topic, 0)])[0].offset == 3

        committed_at = time.monotonic()
        hanging.commit_transaction(15)
        while len(got) < 7 and time.monotonic() - committed_at < 10:
            for m in c.consume(100, 0.05):
                assert m.error() is None, m.error()
                got.append((int(m.offset() or 0), m.value()))
        lag = time.monotonic() - committed_at
        print(f"read_committed consumer resumed {lag * 1000:.0f} ms after the commit")
        assert got[2:] == [(3, b"open-0"), (4, b"open-1"), (5, b"plain-0"), (6, b"plain-1"), (7, b"late-0")]
        assert lag < 3.0
    finally:
        c.close()
    # COMMIT of the hanging transaction at 9: LSO = HW = 10
    assert end_offsets(tb.bootstrap, topic, [0], READ_COMMITTED) == {0: 10}
    assert end_offsets(tb.bootstrap, topic, [0], READ_UNCOMMITTED) == {0: 10}


def test_offsets_for_times_under_read_committed_stop_at_the_lso(tb: Broker, topic: str, tid: str) -> None:
    """Kafka filters a timestamp lookup whose answer is at or past the LSO (``offset <
    lastFetchableOffset`` in Partition.fetchOffsetForTimestamp): read_committed gets -1 (no offset)."""
    create_topic(tb.bootstrap, topic, partitions=1)
    produce_values(tb.bootstrap, topic, [b"before"])  # offset 0
    t_open = next_millisecond()  # later than "before"'s timestamp, taken before that flush
    p = txn_producer(tb.bootstrap, tid)
    p.init_transactions(15)
    p.begin_transaction()
    produce_flush(p, [(topic, 0, b"open")])  # offset 1, open
    try:
        with WireClient(tb.bootstrap) as wc:
            assert wire_list_offset(wc, topic, 0, t_open, isolation_level=0)[::2] == (0, 1)
            error, _ts, offset = wire_list_offset(wc, topic, 0, t_open, isolation_level=1)
            assert (error, offset) == (0, -1), (
                f"read_committed timestamp lookup answered offset {offset} >= LSO 1"
            )
        c = plain_consumer(tb.bootstrap, READ_COMMITTED)
        try:
            (tp,) = c.offsets_for_times([TopicPartition(topic, 0, t_open)], timeout=10)
            assert tp.offset == -1
        finally:
            c.close()
    finally:
        p.abort_transaction(15)


# ---------------------------------------------------------------------------- 3. copier
def _group_consumer(bootstrap: str, group: str, **conf: Any) -> Consumer:
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": READ_COMMITTED,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 300,
        "fetch.wait.max.ms": 100,
        **QUIET,
        "logger": RDKAFKA_LOGGER,
    }
    base.update(conf)
    return Consumer(base)


def _consume_batch(c: Consumer, n: int, timeout: float = 15) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        for m in c.consume(n - len(out), 0.1):
            assert m.error() is None, m.error()
            out.append(m)
    assert len(out) == n, f"read {len(out)} of {n} records"
    return out


def _next_offsets(msgs: list[Any], topic: str) -> list[TopicPartition]:
    nxt: dict[int, int] = {}
    for m in msgs:
        nxt[int(m.partition())] = int(m.offset()) + 1
    return [TopicPartition(topic, part, off) for part, off in sorted(nxt.items())]


def test_consume_transform_produce_offsets_follow_the_transaction(
    tb: Broker, unique_name: Callable[[str], str], tid: str
) -> None:
    src, dst, group = unique_name("in"), unique_name("out"), unique_name("copy")
    create_topic(tb.bootstrap, src, partitions=2)
    create_topic(tb.bootstrap, dst, partitions=2)
    inputs = {part: [f"v-{part}-{i}".encode() for i in range(20)] for part in (0, 1)}
    for part, vs in inputs.items():
        produce_values(tb.bootstrap, src, vs, partition=part)

    def transform(m: Any) -> tuple[str, int, bytes]:
        return dst, int(m.partition()), b"out-" + m.value()

    def offsets_now(stable: bool) -> dict[int, tuple[int, int]]:
        with WireClient(tb.bootstrap) as wc:
            return wire_offset_fetch(wc, group, src, (0, 1), require_stable=stable)

    # copier 1: one committed batch, then one aborted batch
    c = _group_consumer(tb.bootstrap, group)
    p = txn_producer(tb.bootstrap, tid)
    p.init_transactions(15)
    c.subscribe([src])
    batch1 = _consume_batch(c, 12)
    p.begin_transaction()
    produce_flush(p, [transform(m) for m in batch1])
    p.send_offsets_to_transaction(_next_offsets(batch1, src), c.consumer_group_metadata(), 15)
    after1 = {tp.partition: tp.offset for tp in _next_offsets(batch1, src)}
    # pending: OffsetFetch(require_stable) says UNSTABLE_OFFSET_COMMIT for the partitions with pending
    # transactional offsets; without require_stable the pending offsets are simply not there yet
    assert offsets_now(stable=True) == {
        part: (UNSTABLE_OFFSET_COMMIT if part in after1 else 0, -1) for part in (0, 1)
    }, "OffsetFetch(require_stable) during the transaction"
    assert offsets_now(stable=False) == {0: (0, -1), 1: (0, -1)}, "pending offsets visible before commit"
    p.commit_transaction(15)
    assert offsets_now(stable=True) == {part: (0, off) for part, off in after1.items()} | {
        part: (0, -1) for part in (0, 1) if part not in after1
    }

    batch2 = _consume_batch(c, 10)
    p.begin_transaction()
    produce_flush(p, [transform(m) for m in batch2])
    p.send_offsets_to_transaction(_next_offsets(batch2, src), c.consumer_group_metadata(), 15)
    p.abort_transaction(15)
    assert offsets_now(stable=True) == {part: (0, after1.get(part, -1)) for part in (0, 1)}, (
        "offsets of an aborted transaction were committed"
    )
    c.close()

    # copier 2 (a restart): resumes exactly at the committed offsets and copies the rest
    c = _group_consumer(tb.bootstrap, group)
    p2 = txn_producer(tb.bootstrap, tid)
    p2.init_transactions(15)
    c.subscribe([src])
    rest = _consume_batch(c, 40 - len(batch1))
    first_offsets = {}
    for m in rest:
        first_offsets.setdefault(int(m.partition()), int(m.offset()))
    assert first_offsets == {part: after1.get(part, 0) for part in (0, 1)}
    p2.begin_transaction()
    produce_flush(p2, [transform(m) for m in rest])
    p2.send_offsets_to_transaction(_next_offsets(rest, src), c.consumer_group_metadata(), 15)
    p2.commit_transaction(15)
    c.close()
    assert offsets_now(stable=True) == {0: (0, 20), 1: (0, 20)}

    out_rc = Counter(values(read_to_end(tb.bootstrap, dst, (0, 1), READ_COMMITTED)))
    expected = Counter(b"out-" + v for vs in inputs.values() for v in vs)
    assert out_rc == expected, "output under read_committed is not each input exactly once"
    out_ru = Counter(values(read_to_end(tb.bootstrap, dst, (0, 1), READ_UNCOMMITTED)))
    assert out_ru - expected == Counter(b"out-" + m.value() for m in batch2), "aborted copies missing"


# ---------------------------------------------------------------------------- 4. fencing
def _is_fenced(err: KafkaError) -> bool:
    return err.fatal() and err.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )


def test_zombie_fenced_on_produce(tb: Broker, topic: str, tid: str) -> None:
    create_topic(tb.bootstrap, topic, partitions=2)
    client_errors: list[KafkaError] = []
    zombie = txn_producer(tb.bootstrap, tid, error_cb=client_errors.append)  # fatal errors land here
    zombie.init_transactions(15)
    zombie.begin_transaction()
    produce_flush(zombie, [(topic, 0, b"zombie-0")])

    successor = txn_producer(tb.bootstrap, tid)
    successor.init_transactions(15)  # bumps the epoch, aborts the zombie's open transaction

    errors: list[KafkaError] = []
    zombie.produce(topic, value=b"zombie-1", partition=0, on_delivery=lambda e, m: errors.append(e))
    zombie.produce(topic, value=b"zombie-2", partition=1, on_delivery=lambda e, m: errors.append(e))
    try:
        zombie.flush(15)
    except (KafkaException, SystemError) as exc:  # confluent-kafka raises the fatal error from flush
        cause = exc if isinstance(exc, KafkaException) else exc.__cause__
        client_errors.append(kafka_error(cause))  # type: ignore[arg-type]
    assert any(_is_fenced(e) for e in client_errors), f"no fatal fenced error: {client_errors}"
    assert all(e is not None for e in errors), f"zombie writes were accepted: {errors}"
    with pytest.raises(KafkaException) as info:
        zombie.commit_transaction(15)
    err = kafka_error(info.value)
    assert _is_fenced(err), f"commit of a fenced producer: {err!r} (fatal={err.fatal()})"

    successor.begin_transaction()
    produce_flush(successor, [(topic, 0, b"successor-0"), (topic, 1, b"successor-1")])
    successor.commit_transaction(15)
    assert Counter(values(read_to_end(tb.bootstrap, topic, (0, 1), READ_COMMITTED))) == Counter(
        [b"successor-0", b"successor-1"]
    )
    layout = _marker_layout(tb.bootstrap, topic, 0)
    assert layout[:2] == [(0, "data"), (1, "ABORT")], f"zombie's open transaction not aborted: {layout}"
    uncommitted = values(read_to_end(tb.bootstrap, topic, (0, 1), READ_UNCOMMITTED))
    assert b"zombie-1" not in uncommitted and b"zombie-2" not in uncommitted, "fenced produce was written"


def test_zombie_fenced_at_commit(tb: Broker, topic: str, tid: str) -> None:
    create_topic(tb.bootstrap, topic, partitions=2)
    zombie = txn_producer(tb.bootstrap, tid)
    zombie.init_transactions(15)
    zombie.begin_transaction()
    produce_flush(zombie, [(topic, 0, b"zombie-0"), (topic, 1, b"zombie-1")])

    successor = txn_producer(tb.bootstrap, tid)
    successor.init_transactions(15)
    with pytest.raises(KafkaException) as info:
        zombie.commit_transaction(15)
    err = kafka_error(info.value)
    assert _is_fenced(err), f"commit of a fenced producer: {err!r} (fatal={err.fatal()})"

    assert values(read_to_end(tb.bootstrap, topic, (0, 1), READ_COMMITTED)) == []
    assert Counter(values(read_to_end(tb.bootstrap, topic, (0, 1), READ_UNCOMMITTED))) == Counter(
        [b"zombie-0", b"zombie-1"]
    )
    for part in (0, 1):
        assert _marker_layout(tb.bootstrap, topic, part) == [(0, "data"), (1, "ABORT")]
    assert end_offsets(tb.bootstrap, topic, (0, 1), READ_COMMITTED) == {0: 2, 1: 2}
    successor.begin_transaction()
    produce_flush(successor, [(topic, 0, b"ok")])
    successor.commit_transaction(15)
    assert values(read_to_end(tb.bootstrap, topic, (0, 1), READ_COMMITTED)) == [b"ok"]


# ---------------------------------------------------------------------------- 6. timeout
def test_timed_out_transaction_is_aborted_and_its_producer_fenced(tb: Broker, topic: str, tid: str) -> None:
    create_topic(tb.bootstrap, topic, partitions=2)
    p = txn_producer(tb.bootstrap, tid, **{"transaction.timeout.ms": 2000})
    p.init_transactions(15)
    p.begin_transaction()
    started = time.monotonic()
    produce_flush(p, [(topic, 0, b"slow-0"), (topic, 1, b"slow-1")])
    assert end_offsets(tb.bootstrap, topic, (0, 1), READ_COMMITTED) == {0: 0, 1: 0}

    def aborted() -> bool:
        return all(_marker_layout(tb.bootstrap, topic, part)[-1:] == [(1, "ABORT")] for part in (0, 1))

    wait_until(aborted, 10, "ABORT markers of the timed-out transaction")
    print(f"timed-out transaction aborted {time.monotonic() - started:.1f} s after its first write")
    assert time.monotonic() - started >= 1.9, "aborted before transaction.timeout.ms"
    assert end_offsets(tb.bootstrap, topic, (0, 1), READ_COMMITTED) == {0: 2, 1: 2}, "LSO did not advance"
    assert values(read_to_end(tb.bootstrap, topic, (0, 1), READ_COMMITTED)) == []
    assert Counter(values(read_to_end(tb.bootstrap, topic, (0, 1), READ_UNCOMMITTED))) == Counter(
        [b"slow-0", b"slow-1"]
    )
    with pytest.raises(KafkaException) as info:
        p.commit_transaction(15)
    err = kafka_error(info.value)
    assert _is_fenced(err) or err.code() == KafkaError.INVALID_TXN_STATE, f"late commit: {err!r}"
    assert values(read_to_end(tb.bootstrap, topic, (0, 1), READ_COMMITTED)) == []


# ---------------------------------------------------------------------------- 7. max timeout
def test_transaction_timeout_above_the_broker_maximum_is_rejected(tb: Broker, tid: str) -> None:
    p = txn_producer(tb.bootstrap, tid, **{"transaction.timeout.ms": MAX_TXN_TIMEOUT_MS + 1})
    with pytest.raises(KafkaException) as info:
        p.init_transactions(15)
    err = kafka_error(info.value)
    assert err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, repr(err)

    ok = txn_producer(tb.bootstrap, tid + "-max", **{"transaction.timeout.ms": MAX_TXN_TIMEOUT_MS})
    ok.init_transactions(15)  # exactly the maximum is allowed


def test_concurrent_read_committed_consumer_sees_only_committed_transactions(
    tb: Broker, topic: str, tid: str
) -> None:
    """Transactions commit and abort while a read_committed consumer reads along."""
    create_topic(tb.bootstrap, topic, partitions=2)
    seen: list[bytes] = []
    positions: dict[int, int] = {}  # the reader's position per partition after its last poll
    stop = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        c = plain_consumer(tb.bootstrap, READ_COMMITTED)
        try:
            c.assign([TopicPartition(topic, part, OFFSET_BEGINNING) for part in (0, 1)])
            while not stop.is_set():
                for m in c.consume(100, 0.05):
                    if m.error() is not None:
                        raise AssertionError(m.error())
                    seen.append(m.value())
                for tp in c.position([TopicPartition(topic, part) for part in (0, 1)]):
                    positions[tp.partition] = tp.offset
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            c.close()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    p = txn_producer(tb.bootstrap, tid)
    p.init_transactions(15)
    expected: list[bytes] = []
    for n in range(12):
        items = [(topic, i % 2, f"t{n}-{i}".encode()) for i in range(4)]
        p.begin_transaction()
        produce_flush(p, items)
        if n % 3 == 1:
            p.abort_transaction(15)
        else:
            p.commit_transaction(15)
            expected += [v for _, _, v in items]
    # every transaction is complete, so the LSO is the log end: a reader positioned there has
    # been handed everything it will ever get (and anything it should not have seen)
    ends = end_offsets(tb.bootstrap, topic, [0, 1], READ_COMMITTED)
    wait_until(
        lambda: all(positions.get(part, -1) >= end for part, end in ends.items()) or bool(failures),
        10,
        f"concurrent reader at the end offsets {ends}",
        describe=lambda: positions,
    )
    stop.set()
    th.join(10)
    assert not failures, failures
    assert Counter(seen) == Counter(expected)
