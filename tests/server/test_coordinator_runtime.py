"""CoordinatorRuntime with a scripted coordinator and an in-memory internal topic: writes are
appended before their completion runs (depth-first), answers wait until every write of the drive
is done, a failed append reaches the completion as an error, parked requests are answered by
token from a later operation, effects go to the side-effect handler, and loading replays batches
and markers in log order before ``load_complete``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import pytest
from kio.schema.errors import ErrorCode

from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Record, Reply, RequestToken, Write
from exactly.coordinator.txn.config import TxnCoordinatorConfig
from exactly.coordinator.txn.coordinator import TransactionCoordinator
from exactly.records.control import ControlType
from exactly.server.coordinator_runtime import CoordinatorRuntime, LoadStats
from exactly.server.internal_topics import AppendFailed, InternalTopics, ReplayedBatch
from exactly.types import ProducerId, TopicPartition

TOPIC = "__test_state"


class FakeTopic:
    """The two calls the runtime makes on InternalTopics, over an in-memory log."""

    def __init__(self, *, replicated: bool = False) -> None:
        self.log: list[tuple[int, Record, int]] = []  # (partition, record, producer id)
        self.fail: ErrorCode | None = None
        self.batches: list[ReplayedBatch] = []
        self.events: list[str] = []
        self.replicated = replicated
        self.acks: asyncio.Event | None = None  # replicated appends wait for it when set

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
        transactional: bool = False,
    ) -> int:
        assert topic == TOPIC and transactional == (producer_id >= 0)
        if self.fail is not None:
            raise AppendFailed(self.fail, "injected")
        base = len(self.log)
        self.log.extend((partition, r, producer_id) for r in records)
        self.events.append(f"append {records[0][0]!r}")
        return base

    async def append_replicated(
        self, topic: str, partition: int, records: Sequence[Record], **kw: Any
    ) -> int:
        base = self.append(topic, partition, records, **kw)
        if self.acks is not None:
            await self.acks.wait()
        self.events.append(f"acked {records[0][0]!r}")
        return base

    def replay(self, topic: str, partitions: Iterable[int] | None = None) -> Iterator[ReplayedBatch]:
        assert topic == TOPIC
        wanted = None if partitions is None else set(partitions)
        yield from (b for b in self.batches if wanted is None or b.partition in wanted)


class Shard:
    """Records what the runtime calls; requests are built by the tests."""

    def __init__(self, topic: FakeTopic) -> None:
        self.topic = topic
        self.replayed: list[tuple[Any, ...]] = []
        self.deadline: int | None = None
        self.parked: RequestToken | None = None

    def replay(self, key: bytes, value: bytes | None, *, offset: int, producer_id: int) -> None:
        if key == b"bad":
            raise ValueError("undecodable")
        self.replayed.append(("record", key, value, offset, producer_id))

    def replay_end_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        self.replayed.append(("marker", producer_id, commit, partition))

    def load_complete(self, now_ms: int) -> CoordinatorResult[Any]:
        self.replayed.append(("loaded",))
        return CoordinatorResult()

    def unload(self, now_ms: int) -> CoordinatorResult[Any]:
        self.replayed.clear()
        parked, self.parked = self.parked, None
        return CoordinatorResult(replies=() if parked is None else (Reply(parked, "not_coordinator"),))

    def next_deadline(self) -> int | None:
        return self.deadline

    def poll(self, now_ms: int) -> CoordinatorResult[Any]:
        return CoordinatorResult()

    def write(self, key: bytes, then: CoordinatorResult[Any] | None = None, **kw: Any) -> Write:
        def complete(outcome: AppendOutcome) -> CoordinatorResult[Any]:
            self.topic.events.append(f"complete {key!r} {outcome.error.name} @{outcome.base_offset}")
            if not outcome.ok:
                return CoordinatorResult(response=f"failed {outcome.error.name}")
            return then if then is not None else CoordinatorResult()

        return Write(partition=0, records=((key, b"v"),), complete=complete, **kw)


def runtime(
    side_effect: Any = None, *, replicated: bool = False, **kw: Any
) -> tuple[CoordinatorRuntime, Shard, FakeTopic]:
    topic = FakeTopic(replicated=replicated)
    shard = Shard(topic)
    rt = CoordinatorRuntime("test", TOPIC, cast(InternalTopics, topic), shard, side_effect=side_effect, **kw)
    return rt, shard, topic


def test_writes_complete_depth_first_and_the_answer_comes_last() -> None:
    rt, shard, topic = runtime()
    inner = CoordinatorResult(response="done", writes=(shard.write(b"a2"),))
    result: CoordinatorResult[str] = CoordinatorResult(writes=(shard.write(b"a", inner), shard.write(b"b")))
    assert rt.drive(result) == "done"
    assert topic.events == [
        "append b'a'",
        "complete b'a' none @0",
        "append b'a2'",  # the completion's write runs before the sibling
        "complete b'a2' none @1",
        "append b'b'",
        "complete b'b' none @2",
    ]


def test_failed_append_reaches_the_completion_and_nothing_is_logged() -> None:
    rt, shard, topic = runtime()
    topic.fail = ErrorCode.kafka_storage_error
    assert rt.drive(CoordinatorResult(writes=(shard.write(b"a"),))) == "failed kafka_storage_error"
    assert topic.log == []


def test_transactional_write_carries_its_producer() -> None:
    rt, shard, topic = runtime()
    rt.drive(CoordinatorResult(writes=(shard.write(b"t", producer_id=7, producer_epoch=1),)))
    assert topic.log == [(0, (b"t", b"v"), 7)]


def test_parked_request_is_answered_by_a_later_operation() -> None:
    async def main() -> None:
        rt, shard, _topic = runtime()

        def park(token: RequestToken) -> CoordinatorResult[Any]:
            shard.parked = token
            return CoordinatorResult()

        parked = rt.call(park)
        assert not parked.done()
        # Another request completes the parked one and answers itself, after its own write.
        own = rt.call(
            lambda token: CoordinatorResult(
                writes=(
                    shard.write(
                        b"w", CoordinatorResult(replies=(Reply(shard.parked, "p"), Reply(token, "me")))
                    ),
                )
            )
        )
        assert (await parked, await own) == ("p", "me")
        assert rt._waiting == {}

    asyncio.run(main())


def test_effects_go_to_the_side_effect_handler_and_its_result_is_driven() -> None:
    handled: list[object] = []

    def side_effect(effect: object) -> CoordinatorResult[Any] | None:
        handled.append(effect)
        return None if effect == "deferred" else CoordinatorResult(writes=(shard.write(b"after"),))

    rt, shard, topic = runtime(side_effect)
    rt.drive(CoordinatorResult(response="ok", effects=("markers", "deferred")))
    assert handled == ["markers", "deferred"]
    assert [e for e in topic.events if e.startswith("append")] == ["append b'after'"]


def test_an_effect_without_a_handler_is_a_bug() -> None:
    rt, _shard, _topic = runtime()
    with pytest.raises(TypeError):
        rt.drive(CoordinatorResult(effects=("markers",)))


def batch(
    partition: int, *records: tuple[int, bytes], producer_id: int = -1, control: ControlType | None = None
) -> ReplayedBatch:
    return ReplayedBatch(
        partition,
        records[0][0] if records else 0,
        producer_id,
        producer_id >= 0,
        control,
        tuple((offset, key, b"v") for offset, key in records),
    )


def test_load_replays_records_and_markers_in_log_order_then_completes() -> None:
    rt, shard, topic = runtime()
    topic.batches = [
        batch(0, (0, b"a"), (1, b"b")),
        batch(0, (2, b"t"), producer_id=9),
        batch(0, producer_id=9, control=ControlType.COMMIT),
    ]
    assert not rt.loaded
    stats = rt.load()
    assert rt.loaded and (stats.batches, stats.records) == (3, 3)
    assert shard.replayed == [
        ("record", b"a", b"v", 0, -1),
        ("record", b"b", b"v", 1, -1),
        ("record", b"t", b"v", 2, 9),
        ("marker", 9, True, 0),
        ("loaded",),
    ]


def test_a_bad_record_fails_the_load_unless_skipping_is_allowed() -> None:
    rt, shard, topic = runtime()
    topic.batches = [batch(0, (0, b"bad"), (1, b"ok"))]
    with pytest.raises(ValueError):
        rt.load()
    assert not rt.loaded
    rt, shard, topic = runtime(skip_bad_records=True)
    topic.batches = [batch(0, (0, b"bad"), (1, b"ok"))]
    rt.load()
    assert rt.loaded and shard.replayed == [("record", b"ok", b"v", 1, -1), ("loaded",)]


def test_unload_answers_parked_requests_and_a_reload_replays_again() -> None:
    async def main() -> None:
        rt, shard, topic = runtime()
        topic.batches = [batch(0, (0, b"a"))]
        rt.load()

        def park(token: RequestToken) -> CoordinatorResult[Any]:
            shard.parked = token
            return CoordinatorResult()

        parked = rt.call(park)
        rt.unload()
        assert not rt.loaded and await parked == "not_coordinator" and shard.replayed == []
        rt.load()
        assert rt.loaded and shard.replayed == [("record", b"a", b"v", 0, -1), ("loaded",)]

    asyncio.run(main())


# ---- cluster mode: owned partitions, acks=all appends under one lock ---------------------------


def partition_batch(partition: int, key: bytes) -> ReplayedBatch:
    return ReplayedBatch(partition, 0, -1, False, None, ((0, key, b"v"),))


def test_replicated_runtime_owns_nothing_until_reloaded_and_replays_only_owned_partitions() -> None:
    async def scenario() -> None:
        rt, shard, topic = runtime(replicated=True)
        topic.batches = [partition_batch(0, b"p0"), partition_batch(1, b"p1"), partition_batch(2, b"p2")]
        assert rt.owner_error(0) == ErrorCode.not_coordinator
        await rt.reload(lambda: {0: None, 2: None})
        assert [r[1] for r in shard.replayed if r[0] == "record"] == [b"p0", b"p2"]
        assert rt.owner_error(0) == ErrorCode.none
        assert rt.owner_error(1) == ErrorCode.not_coordinator
        assert await rt.reload(dict) == LoadStats(0, 0)  # resigned everything
        # the unload's load is ended, empty: a shard's view over all partitions is not left
        # answering COORDINATOR_LOAD_IN_PROGRESS on a broker that leads none of them
        assert shard.replayed == [("loaded",)]
        assert await rt.reload(dict) is None  # nothing changed
        assert rt.owner_error(0) == ErrorCode.not_coordinator and not rt.loaded

    asyncio.run(scenario())


def test_replicated_answer_waits_for_the_isr_and_operations_do_not_interleave() -> None:
    """A second operation's coordinator call runs only after the first one's write was
    acknowledged and completed (no interleaving between an append and its completion)."""

    async def scenario() -> None:
        rt, shard, topic = runtime(replicated=True)
        await rt.reload(lambda: {0: None})
        topic.acks = asyncio.Event()

        def op(key: bytes) -> Any:
            def run(_token: RequestToken) -> CoordinatorResult[str]:
                topic.events.append(f"op {key!r}")
                return CoordinatorResult(
                    writes=(shard.write(key, CoordinatorResult(response=f"done {key!r}")),)
                )

            return run

        first = rt.call(op(b"a"))
        second = rt.call(op(b"b"))
        await asyncio.sleep(0.01)
        assert not first.done() and topic.events == ["op b'a'", "append b'a'"]
        topic.acks.set()
        assert await first == "done b'a'" and await second == "done b'b'"
        assert topic.events == [
            "op b'a'",
            "append b'a'",
            "acked b'a'",
            "complete b'a' none @0",
            "op b'b'",
            "append b'b'",
            "acked b'b'",
            "complete b'b' none @1",
        ]

    asyncio.run(scenario())


def test_replicated_failed_append_reaches_the_completion() -> None:
    async def scenario() -> None:
        rt, shard, topic = runtime(replicated=True)
        await rt.reload(lambda: {0: None})
        topic.fail = ErrorCode.not_enough_replicas
        answer = await rt.execute(lambda: CoordinatorResult(writes=(shard.write(b"x"),)))
        assert answer == "failed not_enough_replicas"

    asyncio.run(scenario())


@pytest.mark.parametrize("entry", ["execute", "run_async"])
def test_replicated_operation_completes_when_its_caller_is_cancelled(entry: str) -> None:
    """A request handler is cancelled when its client disconnects; the append it started must
    still reach its completion (else the coordinator keeps a pending transition for good: the
    cluster chaos suite's transactions stuck in Prepare* with CONCURRENT_TRANSACTIONS forever)."""

    async def scenario() -> None:
        rt, shard, topic = runtime(replicated=True)
        await rt.reload(lambda: {0: None})
        topic.acks = asyncio.Event()
        result: CoordinatorResult[str] = CoordinatorResult(writes=(shard.write(b"a"),))
        if entry == "execute":
            caller = asyncio.ensure_future(rt.execute(lambda: result))
        else:
            caller = asyncio.ensure_future(rt.run_async(lambda _token: result))
        await asyncio.sleep(0.01)
        assert topic.events == ["append b'a'"]
        caller.cancel()  # the client went away while the write waits for the ISR
        with pytest.raises(asyncio.CancelledError):
            await caller
        topic.acks.set()
        # the next operation runs after the first one's completion, under the same lock
        assert await rt.execute(lambda: CoordinatorResult(response="next")) == "next"
        assert topic.events == ["append b'a'", "acked b'a'", "complete b'a' none @0"]

    asyncio.run(scenario())


def test_reload_answers_parked_requests_not_coordinator() -> None:
    async def scenario() -> None:
        rt, shard, _topic = runtime(replicated=True)
        await rt.reload(lambda: {0: None})

        def park(token: RequestToken) -> CoordinatorResult[Any]:
            shard.parked = token
            return CoordinatorResult()

        parked = rt.call(park)
        await asyncio.sleep(0)
        await rt.reload(lambda: {1: None})
        assert await parked == "not_coordinator"

    asyncio.run(scenario())


def test_reload_follows_a_partition_lost_and_led_again_between_two_reloads() -> None:
    """Leadership changes are handed over as partition -> leadership (the replica manager's
    ``LeaderPartition``). A partition lost and led again before the runtime got to the first
    change keeps the same partition set, but not the same leadership: what was loaded misses
    the writes of the leader in between, so it must be replayed again. An epoch bump of the same
    leadership (the same object) changes nothing."""

    class Leadership:
        def __init__(self, epoch: int) -> None:
            self.leader_epoch = epoch

    async def scenario() -> None:
        rt, shard, topic = runtime(replicated=True)
        topic.batches = [partition_batch(0, b"first")]
        first = Leadership(3)
        await rt.reload(lambda: {0: first})
        first.leader_epoch = 4  # same leader, bumped epoch (an ISR change)
        assert await rt.reload(lambda: {0: first}) is None
        # another broker led partition 0 meanwhile and wrote; this broker follows, then leads
        # again -- both changes seen by one reload
        topic.batches = [partition_batch(0, b"first"), partition_batch(0, b"by the other leader")]
        shard.replayed.clear()
        assert await rt.reload(lambda: {0: Leadership(6)}) == LoadStats(2, 2)
        assert [r[1] for r in shard.replayed if r[0] == "record"] == [b"first", b"by the other leader"]

    asyncio.run(scenario())


def test_a_txn_coordinator_that_resigned_every_partition_lists_no_transactions_without_error() -> None:
    """ListTransactions on a broker whose ``__transaction_state`` partitions all moved away (a
    preferred leader came back) answers NONE and an empty list, as Kafka's does, rather than
    COORDINATOR_LOAD_IN_PROGRESS for as long as the broker leads none of them."""

    async def scenario() -> None:
        coordinator = TransactionCoordinator(lambda: ProducerId(1))
        topic = FakeTopic(replicated=True)
        rt = CoordinatorRuntime("txn", TOPIC, cast(InternalTopics, topic), coordinator)

        def load(owned: frozenset[int]) -> None:  # what TxnRuntime.on_leadership's ``changed`` does
            coordinator.begin_load(partitions=owned)

        await rt.reload(lambda: {0: None}, load)
        assert coordinator.list_transactions(now_ms=0).error == ErrorCode.none
        await rt.reload(dict, load)
        assert coordinator.list_transactions(now_ms=0).error == ErrorCode.none
        assert coordinator.owner_error("t") == ErrorCode.not_coordinator

    asyncio.run(scenario())


def test_a_txn_request_queued_behind_a_resigning_reload_gets_not_coordinator() -> None:
    """The hard-bounce copier's INVALID_PRODUCER_ID_MAPPING, deterministically. A request checks
    ownership when it arrives (``owner_error``) and then waits for the operation lock; here an
    AddPartitionsToTxn holds the lock (its append waits for the ISR), the broker loses
    ``__transaction_state-0`` (its reload queues for the lock), and an AddOffsetsToTxn arrives,
    passes the ownership check and queues behind the reload. Once it runs, the coordinator holds
    no partition: it must answer NOT_COORDINATOR (Kafka's ``getTransactionState``), which the
    client follows to the new coordinator -- not INVALID_PRODUCER_ID_MAPPING from an empty map."""

    async def scenario() -> None:
        coordinator = TransactionCoordinator(
            lambda: ProducerId(7), config=TxnCoordinatorConfig(transaction_state_partitions=1)
        )
        topic = FakeTopic(replicated=True)
        rt = CoordinatorRuntime("txn", TOPIC, cast(InternalTopics, topic), coordinator)

        def load(owned: frozenset[int]) -> None:  # what TxnRuntime.on_leadership's ``changed`` does
            coordinator.begin_load(partitions=owned)

        await rt.reload(lambda: {0: None}, load)
        init = await rt.execute(lambda: coordinator.init_producer_id("copier", 60_000, now_ms=0))
        assert init is not None and init.error == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        topic.acks = asyncio.Event()
        adding = asyncio.ensure_future(
            rt.execute(
                lambda: coordinator.add_partitions_to_txn(
                    "copier", pid, epoch, [TopicPartition("out", 0)], now_ms=0
                )
            )
        )
        await asyncio.sleep(0.01)
        resigning = asyncio.ensure_future(rt.reload(dict, load))
        await asyncio.sleep(0.01)
        assert rt.owner_error(0) == ErrorCode.none  # what the AddOffsetsToTxn handler sees
        offsets = asyncio.ensure_future(
            rt.execute(lambda: coordinator.add_offsets_to_txn("copier", pid, epoch, "group", now_ms=0))
        )
        await asyncio.sleep(0.01)
        topic.acks.set()
        added = await adding
        assert added is not None and added.error == ErrorCode.none
        assert await resigning == LoadStats(0, 0)
        answer = await offsets
        assert answer is not None and answer.error == ErrorCode.not_coordinator
        ended = await rt.execute(lambda: coordinator.end_txn("copier", pid, epoch, False, now_ms=0))
        assert ended is not None and ended.error == ErrorCode.not_coordinator

    asyncio.run(scenario())


def test_a_runtime_without_timers_starts_no_timer_task_and_keeps_its_periodic_jobs() -> None:
    """``timers=False`` (rf3hop-s21): no task polls the shard, so nothing wakes the loop every
    IDLE_POLL_S; the periodic jobs still run. With timers the poll task is there."""

    async def scenario() -> None:
        for timers in (True, False):
            rt, _shard, _topic = runtime(timers=timers)
            ran = asyncio.Event()
            rt.every("job", 0.001, ran.set)
            tasks = rt.start_tasks()
            try:
                names = sorted(t.get_name() for t in tasks)
                assert names == (["job", "test-timers"] if timers else ["job"])
                await asyncio.wait_for(ran.wait(), 5)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


def test_the_transaction_coordinator_keeps_no_timers() -> None:
    """What the transaction runtime's ``timers=False`` rests on: the shard never has a deadline
    and its poll does nothing, whatever state it holds (its timeouts are periodic scans)."""
    coordinator = TransactionCoordinator(lambda: ProducerId(1))
    coordinator.load_complete(0)
    assert coordinator.next_deadline() is None
    result = coordinator.poll(10**12)
    assert result == CoordinatorResult()


def test_a_timer_armed_by_any_result_carried_out_wakes_the_sleeping_timer_loop() -> None:
    """The timer loop sleeps until the shard's next deadline (IDLE_POLL_S at most, rf3hop-s21),
    so every result the runtime carries out must wake it when it armed an earlier timer: a
    request (``run``), a load's completion (``drive`` of ``load_complete``) and, replicated,
    ``_drive_replicated``. Without that wake-up such a timer would fire up to IDLE_POLL_S late."""

    async def settle(rt: CoordinatorRuntime) -> None:
        for _ in range(5):  # the loop reaches its wait
            await asyncio.sleep(0)
        assert rt._sleep_until is not None and rt._wake is not None and not rt._wake.is_set()

    async def scenario(replicated: bool) -> None:
        rt, shard, _topic = runtime(replicated=replicated)
        tasks = rt.start_tasks()
        try:
            await settle(rt)
            assert rt._sleep_until is not None
            shard.deadline = rt._sleep_until - 1  # earlier than the loop's wake-up
            if replicated:
                await rt._drive_replicated(CoordinatorResult())
            else:
                rt.drive(CoordinatorResult())
            assert rt._wake is not None and rt._wake.is_set()
            shard.deadline = None
            await settle(rt)
            shard.deadline = rt._sleep_until - 1
            if not replicated:
                rt.run(lambda token: CoordinatorResult())
                assert rt._wake.is_set()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario(False))
    asyncio.run(scenario(True))
