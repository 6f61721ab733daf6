"""Transactions and read_committed with aiokafka 0.14 (InitProducerId v0, so fencing shows up as
INVALID_PRODUCER_EPOCH, which aiokafka raises as ProducerFenced; send_offsets_to_transaction takes
a bare group id - no KIP-447 group metadata)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as aerr
from aiokafka.structs import OffsetAndMetadata

from exactly.testing.wait import wait_until_async
from tests.support.broker import Broker
from tests.support.clients import create_topic, produce_values
from tests.support.txn_helpers import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    log_entries,
    txn_broker_config,
    wire_offset_fetch,
)
from tests.support.wire import WireClient

pytestmark = pytest.mark.timeout(60)

MAX_TXN_TIMEOUT_MS = 120_000
FENCED = (aerr.ProducerFenced, aerr.InvalidProducerEpoch)


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return txn_broker_config(**{"transaction.max.timeout.ms": str(MAX_TXN_TIMEOUT_MS)})


@pytest.fixture
def ab(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture
def tid(unique_name: Callable[[str], str]) -> str:
    return unique_name("aiotx")


def producer(bootstrap: str, tid: str, **conf: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, linger_ms=5, **conf)


async def send_all(p: AIOKafkaProducer, items: list[tuple[str, int, bytes]]) -> list[tuple[int, int]]:
    futures = [await p.send(t, value=v, partition=part) for t, part, v in items]
    return [(md.partition, md.offset) for md in [await f for f in futures]]


async def read_to_end(
    bootstrap: str, topic: str, partitions: tuple[int, ...], isolation: str, timeout: float = 20
) -> list[tuple[int, int, bytes]]:
    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + timeout
        while True:
            positions = {tp: await c.position(tp) for tp in tps}
            if all(positions[tp] >= ends[tp] for tp in tps):
                return got
            assert time.monotonic() < deadline, f"positions {positions} never reached {ends}"
            for tp, recs in (await c.getmany(*tps, timeout_ms=100)).items():
                got += [(tp.partition, r.offset, r.value) for r in recs]
    finally:
        await c.stop()


async def end_offsets(
    bootstrap: str, topic: str, partitions: tuple[int, ...], isolation: str
) -> dict[int, int]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    await c.start()
    try:
        got = await c.end_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: off for tp, off in got.items()}
    finally:
        await c.stop()


# ---------------------------------------------------------------------------- 1 + 2
def test_commit_abort_and_open_transactions_across_topics(
    ab: Broker, unique_name: Callable[[str], str], tid: str
) -> None:
    topics = [unique_name("aioa"), unique_name("aiob")]
    for t in topics:
        create_topic(ab.bootstrap, t, partitions=2)
    tps = [(t, part) for t in topics for part in (0, 1)]

    def items(tag: str) -> list[tuple[str, int, bytes]]:
        return [(t, part, f"{tag}-{t}-{part}".encode()) for t, part in tps]

    async def main() -> None:
        p = producer(ab.bootstrap, tid)
        await p.start()
        try:
            async with p.transaction():
                await send_all(p, items("c1"))
            await p.begin_transaction()
            await send_all(p, items("a2"))
            await p.abort_transaction()
            await p.begin_transaction()
            await send_all(p, items("o3"))  # open while we look
            for t in topics:
                # c1 at 0, COMMIT 1, a2 at 2, ABORT 3, o3 at 4 (open)
                assert await end_offsets(ab.bootstrap, t, (0, 1), READ_COMMITTED) == {0: 4, 1: 4}
                assert await end_offsets(ab.bootstrap, t, (0, 1), READ_UNCOMMITTED) == {0: 5, 1: 5}
                rc = await read_to_end(ab.bootstrap, t, (0, 1), READ_COMMITTED)
                assert sorted(rc) == [(part, 0, f"c1-{t}-{part}".encode()) for part in (0, 1)]
                ru = await read_to_end(ab.bootstrap, t, (0, 1), READ_UNCOMMITTED)
                assert sorted((part, off) for part, off, _ in ru) == [
                    (part, o) for part in (0, 1) for o in (0, 2, 4)
                ]
            await p.commit_transaction()
            for t in topics:
                rc = await read_to_end(ab.bootstrap, t, (0, 1), READ_COMMITTED)
                assert sorted(rc) == [
                    (part, off, f"{tag}-{t}-{part}".encode())
                    for part in (0, 1)
                    for off, tag in ((0, "c1"), (4, "o3"))
                ]
                assert await end_offsets(ab.bootstrap, t, (0, 1), READ_COMMITTED) == {0: 6, 1: 6}
                with WireClient(ab.bootstrap) as wc:
                    assert [e.kind for e in log_entries(wc, t, 1)] == [
                        "data",
                        "COMMIT",
                        "data",
                        "ABORT",
                        "data",
                        "COMMIT",
                    ]
        finally:
            await p.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------------- 3. copier
def test_consume_transform_produce_with_send_offsets(
    ab: Broker, unique_name: Callable[[str], str], tid: str
) -> None:
    src, dst, group = unique_name("aioin"), unique_name("aioout"), unique_name("aiog")
    create_topic(ab.bootstrap, src, partitions=2)
    create_topic(ab.bootstrap, dst, partitions=2)
    for part in (0, 1):
        produce_values(ab.bootstrap, src, [f"in-{part}-{i}".encode() for i in range(8)], partition=part)

    def fetch() -> dict[int, tuple[int, int]]:
        with WireClient(ab.bootstrap) as wc:
            return wire_offset_fetch(wc, group, src, (0, 1), require_stable=True)

    async def group_consumer() -> AIOKafkaConsumer:
        c = AIOKafkaConsumer(
            src,
            bootstrap_servers=ab.bootstrap,
            group_id=group,
            isolation_level=READ_COMMITTED,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await c.start()
        return c

    async def read(c: AIOKafkaConsumer, n: int) -> list[Any]:
        out: list[Any] = []
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            for recs in (await c.getmany(timeout_ms=100, max_records=n - len(out))).values():
                out += recs
        assert len(out) == n
        return out

    def next_offsets(recs: list[Any]) -> dict[TopicPartition, OffsetAndMetadata]:
        nxt: dict[TopicPartition, OffsetAndMetadata] = {}
        for r in recs:
            nxt[TopicPartition(src, r.partition)] = OffsetAndMetadata(r.offset + 1, "")
        return nxt

    async def main() -> list[Any]:
        p = producer(ab.bootstrap, tid)
        await p.start()
        try:
            c = await group_consumer()
            batch1 = await read(c, 6)
            async with p.transaction():
                await send_all(p, [(dst, r.partition, b"out-" + r.value) for r in batch1])
                await p.send_offsets_to_transaction(next_offsets(batch1), group)
            after1 = {tp.partition: om.offset for tp, om in next_offsets(batch1).items()}
            assert fetch() == {part: (0, after1.get(part, -1)) for part in (0, 1)}
            batch2 = await read(c, 4)
            await p.begin_transaction()
            await send_all(p, [(dst, r.partition, b"out-" + r.value) for r in batch2])
            await p.send_offsets_to_transaction(next_offsets(batch2), group)
            await p.abort_transaction()
            assert fetch() == {part: (0, after1.get(part, -1)) for part in (0, 1)}, (
                "aborted offsets committed"
            )
            await c.stop()

            c = await group_consumer()  # the restart resumes at the committed offsets
            rest = await read(c, 16 - len(batch1))
            firsts: dict[int, int] = {}
            for r in rest:
                firsts.setdefault(r.partition, r.offset)
            assert firsts == {part: after1.get(part, 0) for part in (0, 1)}
            async with p.transaction():
                await send_all(p, [(dst, r.partition, b"out-" + r.value) for r in rest])
                await p.send_offsets_to_transaction(next_offsets(rest), group)
            await c.stop()
            assert fetch() == {0: (0, 8), 1: (0, 8)}
            return batch2
        finally:
            await p.stop()

    batch2 = asyncio.run(main())
    expected = Counter(f"out-in-{part}-{i}".encode() for part in (0, 1) for i in range(8))
    rc = asyncio.run(read_to_end(ab.bootstrap, dst, (0, 1), READ_COMMITTED))
    assert Counter(v for _, _, v in rc) == expected
    ru = asyncio.run(read_to_end(ab.bootstrap, dst, (0, 1), READ_UNCOMMITTED))
    assert Counter(v for _, _, v in ru) - expected == Counter(b"out-" + r.value for r in batch2)


# ---------------------------------------------------------------------------- 4. fencing
def test_zombie_fenced_on_produce(ab: Broker, topic: str, tid: str) -> None:
    create_topic(ab.bootstrap, topic, partitions=1)

    async def main() -> None:
        zombie, successor = producer(ab.bootstrap, tid), producer(ab.bootstrap, tid)
        await zombie.start()
        try:
            await zombie.begin_transaction()
            await send_all(zombie, [(topic, 0, b"zombie-0")])
            await successor.start()  # InitProducerId: bumps the epoch, aborts the zombie's transaction
            with pytest.raises(FENCED):
                await send_all(zombie, [(topic, 0, b"zombie-1")])
            with pytest.raises(FENCED):
                await zombie.commit_transaction()
            async with successor.transaction():
                await send_all(successor, [(topic, 0, b"successor")])
        finally:
            await zombie.stop()
            await successor.stop()
        assert [v for *_, v in await read_to_end(ab.bootstrap, topic, (0,), READ_COMMITTED)] == [b"successor"]
        assert b"zombie-1" not in [
            v for *_, v in await read_to_end(ab.bootstrap, topic, (0,), READ_UNCOMMITTED)
        ]

    asyncio.run(main())


def test_zombie_fenced_at_commit(ab: Broker, topic: str, tid: str) -> None:
    create_topic(ab.bootstrap, topic, partitions=2)

    async def main() -> None:
        zombie, successor = producer(ab.bootstrap, tid), producer(ab.bootstrap, tid)
        await zombie.start()
        try:
            await zombie.begin_transaction()
            await send_all(zombie, [(topic, 0, b"z0"), (topic, 1, b"z1")])
            await successor.start()
            with pytest.raises(FENCED):
                await zombie.commit_transaction()
        finally:
            await zombie.stop()
            await successor.stop()
        assert await read_to_end(ab.bootstrap, topic, (0, 1), READ_COMMITTED) == []
        assert sorted(v for *_, v in await read_to_end(ab.bootstrap, topic, (0, 1), READ_UNCOMMITTED)) == [
            b"z0",
            b"z1",
        ]
        assert await end_offsets(ab.bootstrap, topic, (0, 1), READ_COMMITTED) == {0: 2, 1: 2}

    asyncio.run(main())


# ---------------------------------------------------------------------------- 7. max timeout
def test_transaction_timeout_above_the_maximum_is_rejected(ab: Broker, tid: str) -> None:
    async def main() -> None:
        p = producer(ab.bootstrap, tid, transaction_timeout_ms=MAX_TXN_TIMEOUT_MS + 1)
        try:
            with pytest.raises(aerr.InvalidTransactionTimeout):
                await asyncio.wait_for(p.start(), 15)
        finally:
            await p.stop()
        ok = producer(ab.bootstrap, tid + "-ok", transaction_timeout_ms=MAX_TXN_TIMEOUT_MS)
        await ok.start()
        await ok.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------------- 6. timeout
def test_timed_out_transaction_is_aborted_and_the_late_commit_fails(ab: Broker, topic: str, tid: str) -> None:
    create_topic(ab.bootstrap, topic, partitions=1)

    def kinds() -> list[str]:
        with WireClient(ab.bootstrap) as wc:
            return [e.kind for e in log_entries(wc, topic, 0)]

    async def main() -> None:
        p = producer(ab.bootstrap, tid, transaction_timeout_ms=2000)
        await p.start()
        try:
            await p.begin_transaction()
            await send_all(p, [(topic, 0, b"slow-0"), (topic, 0, b"slow-1")])
            assert await end_offsets(ab.bootstrap, topic, (0,), READ_COMMITTED) == {0: 0}
            await wait_until_async(
                lambda: kinds() == ["data", "data", "ABORT"],
                10,
                "the coordinator's abort of the timed-out transaction",
                interval=0.1,
                describe=kinds,
            )
            assert await end_offsets(ab.bootstrap, topic, (0,), READ_COMMITTED) == {0: 3}
            assert await read_to_end(ab.bootstrap, topic, (0,), READ_COMMITTED) == []
            ru = await read_to_end(ab.bootstrap, topic, (0,), READ_UNCOMMITTED)
            assert [v for *_, v in ru] == [b"slow-0", b"slow-1"]
            with pytest.raises(FENCED):
                await p.commit_transaction()
        finally:
            await p.stop()

    asyncio.run(main())
