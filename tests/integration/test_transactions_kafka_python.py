"""Transactions and read_committed with kafka-python 3.0 (transactional KafkaProducer, KafkaConsumer
with isolation_level, send_offsets_to_transaction with consumer group metadata)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import errors as kerr
from kafka.structs import OffsetAndMetadata, TopicPartition

from tests.support.broker import Broker
from tests.support.clients import create_topic, produce_values
from tests.support.txn_helpers import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    UNSTABLE_OFFSET_COMMIT,
    log_entries,
    txn_broker_config,
    wait_until,
    wire_offset_fetch,
)
from tests.support.wire import WireClient

pytestmark = pytest.mark.timeout(60)

MAX_TXN_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return txn_broker_config(**{"transaction.max.timeout.ms": str(MAX_TXN_TIMEOUT_MS)})


@pytest.fixture
def kb(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture
def tid(unique_name: Callable[[str], str]) -> str:
    return unique_name("kptx")


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """``closing(client)`` closes the client at teardown (quickly: fenced producers must not hang)."""
    clients: list[Any] = []
    yield lambda c: clients.append(c) or c
    for c in reversed(clients):
        try:
            c.close(timeout=2) if isinstance(c, KafkaProducer) else c.close()
        except Exception:
            pass


def producer(bootstrap: str, tid: str, **conf: Any) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=tid, linger_ms=5, max_block_ms=15_000, **conf
    )


def send_all(p: KafkaProducer, items: list[tuple[str, int, bytes]]) -> list[tuple[int, int]]:
    futures = [p.send(t, value=v, partition=part) for t, part, v in items]
    p.flush(15)
    return [(md.partition, md.offset) for md in (f.get(10) for f in futures)]


def consumer(bootstrap: str, isolation: str, **conf: Any) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        **conf,
    )


def end_offsets(bootstrap: str, topic: str, partitions: tuple[int, ...], isolation: str) -> dict[int, int]:
    c = consumer(bootstrap, isolation)
    try:
        got = c.end_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: off for tp, off in got.items()}
    finally:
        c.close()


def read_to_end(
    bootstrap: str, topic: str, partitions: tuple[int, ...], isolation: str, timeout: float = 20
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) from the start until the position reaches the end offsets."""
    c = consumer(bootstrap, isolation)
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = c.end_offsets(tps)
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + timeout
        while not all(c.position(tp) >= ends[tp] for tp in tps):
            assert time.monotonic() < deadline, (
                f"position {[c.position(tp) for tp in tps]} never reached {ends}"
            )
            for tp, recs in c.poll(timeout_ms=100).items():
                got += [(tp.partition, r.offset, r.value) for r in recs]
        return got
    finally:
        c.close()


# ---------------------------------------------------------------------------- 1 + 2
def test_commit_abort_and_open_transactions_across_topics(
    kb: Broker, unique_name: Callable[[str], str], tid: str, closing: Callable[[Any], Any]
) -> None:
    topics = [unique_name("kpa"), unique_name("kpb")]
    for t in topics:
        create_topic(kb.bootstrap, t, partitions=2)
    tps = [(t, part) for t in topics for part in (0, 1)]
    p = closing(producer(kb.bootstrap, tid))
    p.init_transactions()

    def items(tag: str, n: int) -> list[tuple[str, int, bytes]]:
        return [(t, part, f"{tag}-{t}-{part}-{i}".encode()) for t, part in tps for i in range(n)]

    c1, a2, o3 = items("c1", 2), items("a2", 2), items("o3", 1)
    p.begin_transaction()
    send_all(p, c1)
    p.commit_transaction()
    p.begin_transaction()
    send_all(p, a2)
    p.abort_transaction()
    p.begin_transaction()
    send_all(p, o3)

    def by_tp(rows: list[tuple[int, int, bytes]], t: str) -> dict[int, list[tuple[int, bytes]]]:
        out: dict[int, list[tuple[int, bytes]]] = {}
        for part, off, v in rows:
            out.setdefault(part, []).append((off, v))
        return out

    for t in topics:
        # c1 at 0-1, COMMIT 2, a2 at 3-4, ABORT 5, o3 at 6 (open)
        assert end_offsets(kb.bootstrap, t, (0, 1), READ_COMMITTED) == {0: 6, 1: 6}
        assert end_offsets(kb.bootstrap, t, (0, 1), READ_UNCOMMITTED) == {0: 7, 1: 7}
        rc = by_tp(read_to_end(kb.bootstrap, t, (0, 1), READ_COMMITTED), t)
        ru = by_tp(read_to_end(kb.bootstrap, t, (0, 1), READ_UNCOMMITTED), t)
        for part in (0, 1):
            assert rc[part] == [(0, f"c1-{t}-{part}-0".encode()), (1, f"c1-{t}-{part}-1".encode())]
            assert [o for o, _ in ru[part]] == [0, 1, 3, 4, 6]
    p.commit_transaction()
    for t in topics:
        rc = by_tp(read_to_end(kb.bootstrap, t, (0, 1), READ_COMMITTED), t)
        for part in (0, 1):
            assert rc[part] == [
                (0, f"c1-{t}-{part}-0".encode()), (1, f"c1-{t}-{part}-1".encode()), (6, f"o3-{t}-{part}-0".encode()),
            ]  # fmt: skip
        with WireClient(kb.bootstrap) as wc:
            assert [e.kind for e in log_entries(wc, t, 0)] == [
                "data",
                "data",
                "COMMIT",
                "data",
                "data",
                "ABORT",
                "data",
                "COMMIT",
            ]
        assert end_offsets(kb.bootstrap, t, (0, 1), READ_COMMITTED) == {0: 8, 1: 8}


def test_read_committed_consumer_waits_for_the_open_transaction(
    kb: Broker, topic: str, tid: str, closing: Callable[[Any], Any]
) -> None:
    create_topic(kb.bootstrap, topic, partitions=1)
    p = closing(producer(kb.bootstrap, tid))
    p.init_transactions()
    p.begin_transaction()
    send_all(p, [(topic, 0, b"t0"), (topic, 0, b"t1")])
    produce_values(kb.bootstrap, topic, [b"plain"])  # offset 2, behind the open transaction

    c = closing(consumer(kb.bootstrap, READ_COMMITTED))
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    assert c.end_offsets([tp]) == {tp: 0}
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert not c.poll(timeout_ms=100), "read_committed returned records past the LSO"
    p.commit_transaction()
    got: list[bytes] = []
    committed_at = time.monotonic()
    while len(got) < 3 and time.monotonic() - committed_at < 10:
        for recs in c.poll(timeout_ms=100).values():
            got += [r.value for r in recs]
    assert got == [b"t0", b"t1", b"plain"]
    assert time.monotonic() - committed_at < 3
    assert c.end_offsets([tp]) == {tp: 4}


# ---------------------------------------------------------------------------- 3. copier
def test_consume_transform_produce_with_group_metadata(
    kb: Broker, unique_name: Callable[[str], str], tid: str, closing: Callable[[Any], Any]
) -> None:
    src, dst, group = unique_name("kpin"), unique_name("kpout"), unique_name("kpg")
    create_topic(kb.bootstrap, src, partitions=2)
    create_topic(kb.bootstrap, dst, partitions=2)
    for part in (0, 1):
        produce_values(kb.bootstrap, src, [f"in-{part}-{i}".encode() for i in range(10)], partition=part)

    def group_consumer() -> KafkaConsumer:
        c = closing(
            consumer(
                kb.bootstrap,
                READ_COMMITTED,
                group_id=group,
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
            )
        )
        # kafka-python's group leader assigns from its cached metadata; under load the join can beat
        # the first metadata response ("No partition metadata for topic"), leaving the member with no
        # partitions until some later metadata refresh. Load the topic's metadata before subscribing.
        assert c.partitions_for_topic(src) == {0, 1}
        c.subscribe([src])
        return c

    def poll_batch(c: KafkaConsumer, n: int) -> list[Any]:
        out: list[Any] = []
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=100, max_records=n - len(out)).values():
                out += recs
        assert len(out) == n, f"read {len(out)} of {n}"
        return out

    def next_offsets(recs: list[Any]) -> dict[TopicPartition, OffsetAndMetadata]:
        nxt: dict[TopicPartition, OffsetAndMetadata] = {}
        for r in recs:
            nxt[TopicPartition(src, r.partition)] = OffsetAndMetadata(r.offset + 1, "", -1)
        return nxt

    def fetch(stable: bool) -> dict[int, tuple[int, int]]:
        with WireClient(kb.bootstrap) as wc:
            return wire_offset_fetch(wc, group, src, (0, 1), require_stable=stable)

    c = group_consumer()
    p = closing(producer(kb.bootstrap, tid))
    p.init_transactions()
    batch1 = poll_batch(c, 8)
    p.begin_transaction()
    send_all(p, [(dst, r.partition, b"out-" + r.value) for r in batch1])
    p.send_offsets_to_transaction(next_offsets(batch1), c.group_metadata())
    pending = {tp.partition for tp in next_offsets(batch1)}
    assert fetch(stable=True) == {
        part: (UNSTABLE_OFFSET_COMMIT if part in pending else 0, -1) for part in (0, 1)
    }
    p.commit_transaction()
    after1 = {tp.partition: om.offset for tp, om in next_offsets(batch1).items()}
    assert fetch(stable=True) == {part: (0, after1.get(part, -1)) for part in (0, 1)}

    batch2 = poll_batch(c, 6)
    p.begin_transaction()
    send_all(p, [(dst, r.partition, b"out-" + r.value) for r in batch2])
    p.send_offsets_to_transaction(next_offsets(batch2), c.group_metadata())
    p.abort_transaction()
    assert fetch(stable=True) == {part: (0, after1.get(part, -1)) for part in (0, 1)}, (
        "aborted offsets visible"
    )
    c.close()

    c2 = group_consumer()
    rest = poll_batch(c2, 20 - len(batch1))
    firsts: dict[int, int] = {}
    for r in rest:
        firsts.setdefault(r.partition, r.offset)
    assert firsts == {part: after1.get(part, 0) for part in (0, 1)}, (
        "restart did not resume at the committed offsets"
    )
    p.begin_transaction()
    send_all(p, [(dst, r.partition, b"out-" + r.value) for r in rest])
    p.send_offsets_to_transaction(next_offsets(rest), c2.group_metadata())
    p.commit_transaction()
    assert fetch(stable=True) == {0: (0, 10), 1: (0, 10)}

    expected = Counter(f"out-in-{part}-{i}".encode() for part in (0, 1) for i in range(10))
    assert Counter(v for _, _, v in read_to_end(kb.bootstrap, dst, (0, 1), READ_COMMITTED)) == expected
    everything = Counter(v for _, _, v in read_to_end(kb.bootstrap, dst, (0, 1), READ_UNCOMMITTED))
    assert everything - expected == Counter(b"out-" + r.value for r in batch2)


# ---------------------------------------------------------------------------- 4. fencing
FENCED = (kerr.ProducerFencedError, kerr.InvalidProducerEpochError)


def assert_fenced(call: Callable[[], Any]) -> None:
    """kafka-python raises the fenced error itself, or a KafkaError naming it once in a fatal state
    ("Cannot execute transactional method because we are in an error state: [Error 90] ...")."""
    with pytest.raises(kerr.KafkaError) as info:
        call()
    assert isinstance(info.value, FENCED) or "ProducerFenced" in str(info.value), repr(info.value)


def test_zombie_fenced_on_produce(kb: Broker, topic: str, tid: str, closing: Callable[[Any], Any]) -> None:
    create_topic(kb.bootstrap, topic, partitions=1)
    zombie = closing(producer(kb.bootstrap, tid))
    zombie.init_transactions()
    zombie.begin_transaction()
    send_all(zombie, [(topic, 0, b"zombie-0")])
    successor = closing(producer(kb.bootstrap, tid))
    successor.init_transactions()

    fut = zombie.send(topic, value=b"zombie-1", partition=0)
    zombie.flush(10)
    with pytest.raises(FENCED):
        fut.get(10)

    # kafka-python takes produce's INVALID_PRODUCER_EPOCH as recoverable and tries an epoch bump
    # (InitProducerId with its old producer id/epoch), which the coordinator refuses: PRODUCER_FENCED.
    # While that bump is in flight commit_transaction refuses with "Invalid transition"; wait it out.
    def commit_refused() -> kerr.KafkaError | None:
        try:
            zombie.commit_transaction()
        except kerr.KafkaError as exc:
            return None if "BUMPING_PRODUCER_EPOCH" in str(exc) else exc
        pytest.fail("the fenced producer committed")

    exc = wait_until(commit_refused, 10, "commit_transaction refused for good, not for the epoch bump")
    assert isinstance(exc, FENCED) or "ProducerFenced" in str(exc), repr(exc)
    successor.begin_transaction()
    send_all(successor, [(topic, 0, b"successor")])
    successor.commit_transaction()
    assert [v for _, _, v in read_to_end(kb.bootstrap, topic, (0,), READ_COMMITTED)] == [b"successor"]
    assert b"zombie-1" not in [v for _, _, v in read_to_end(kb.bootstrap, topic, (0,), READ_UNCOMMITTED)]


def test_zombie_fenced_at_commit(kb: Broker, topic: str, tid: str, closing: Callable[[Any], Any]) -> None:
    create_topic(kb.bootstrap, topic, partitions=2)
    zombie = closing(producer(kb.bootstrap, tid))
    zombie.init_transactions()
    zombie.begin_transaction()
    send_all(zombie, [(topic, 0, b"z0"), (topic, 1, b"z1")])
    successor = closing(producer(kb.bootstrap, tid))
    successor.init_transactions()
    assert_fenced(zombie.commit_transaction)
    assert read_to_end(kb.bootstrap, topic, (0, 1), READ_COMMITTED) == []
    assert sorted(v for _, _, v in read_to_end(kb.bootstrap, topic, (0, 1), READ_UNCOMMITTED)) == [
        b"z0",
        b"z1",
    ]
    assert end_offsets(kb.bootstrap, topic, (0, 1), READ_COMMITTED) == {0: 2, 1: 2}


# ---------------------------------------------------------------------------- 7. max timeout
def test_transaction_timeout_above_the_maximum_is_rejected(
    kb: Broker, tid: str, closing: Callable[[Any], Any]
) -> None:
    p = closing(producer(kb.bootstrap, tid, transaction_timeout_ms=MAX_TXN_TIMEOUT_MS + 1))
    # kafka-python wraps the error code: "Unexpected error in InitProducerIdResponse: [Error 50] ..."
    with pytest.raises(kerr.KafkaError, match="InvalidTransactionTimeout"):
        p.init_transactions()
    ok = closing(producer(kb.bootstrap, tid + "-ok", transaction_timeout_ms=MAX_TXN_TIMEOUT_MS))
    ok.init_transactions()


# ---------------------------------------------------------------------------- 6. timeout
def test_timed_out_transaction_is_aborted_and_the_late_commit_fails(
    kb: Broker, topic: str, tid: str, closing: Callable[[Any], Any]
) -> None:
    create_topic(kb.bootstrap, topic, partitions=1)
    p = closing(producer(kb.bootstrap, tid, transaction_timeout_ms=2000))
    p.init_transactions()
    p.begin_transaction()
    send_all(p, [(topic, 0, b"slow-0"), (topic, 0, b"slow-1")])
    assert end_offsets(kb.bootstrap, topic, (0,), READ_COMMITTED) == {0: 0}

    def kinds() -> list[str]:
        with WireClient(kb.bootstrap) as wc:
            return [e.kind for e in log_entries(wc, topic, 0)]

    wait_until(
        lambda: kinds() == ["data", "data", "ABORT"], 10, "coordinator abort of the timed-out transaction"
    )
    assert end_offsets(kb.bootstrap, topic, (0,), READ_COMMITTED) == {0: 3}
    assert read_to_end(kb.bootstrap, topic, (0,), READ_COMMITTED) == []
    assert [v for *_, v in read_to_end(kb.bootstrap, topic, (0,), READ_UNCOMMITTED)] == [b"slow-0", b"slow-1"]
    assert_fenced(p.commit_transaction)
