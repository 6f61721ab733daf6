"""GroupRuntime in cluster mode over an in-memory ``__consumer_offsets`` whose acks=all appends wait
for the test: a TxnOffsetCommit waiting for its acks is already unstable to OffsetFetch, and a
transaction marker is applied to the group coordinator only after that commit completed (under
the runtime's operation lock), as in the log, where the commit's record precedes the marker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from kio.schema.errors import ErrorCode

from exactly.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group.api import (
    CommitPartition,
    CommitTopic,
    FetchGroup,
    FetchTopic,
    OffsetFetchRequestData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.result import Record
from exactly.server.coordinator_runtime import CoordinatorRuntime
from exactly.server.group_runtime import GroupRuntime
from exactly.server.internal_topics import InternalTopics, ReplayedBatch
from exactly.topics import CONSUMER_OFFSETS_TOPIC

GROUP = "copier"
PID = 7000


class ReplicatedOffsetsTopic:
    """The calls the runtime makes on InternalTopics; appends wait for ``acks`` when it is set."""

    replicated = True

    def __init__(self) -> None:
        self.log: list[tuple[int, Record, int]] = []
        self.acks: asyncio.Event | None = None

    async def append_replicated(
        self, topic: str, partition: int, records: Sequence[Record], *, producer_id: int = -1, **_kw: Any
    ) -> int:
        base = len(self.log)
        self.log.extend((partition, r, producer_id) for r in records)
        if self.acks is not None:
            await self.acks.wait()
        return base

    def replay(self, topic: str, partitions: Iterable[int] | None = None) -> Iterator[ReplayedBatch]:
        return iter(())


def group_runtime() -> tuple[GroupRuntime, ReplicatedOffsetsTopic]:
    """A GroupRuntime without a broker: ``apply_marker`` and requests need only these two parts."""
    topic = ReplicatedOffsetsTopic()
    coordinator = GroupCoordinator(GroupCoordinatorConfig(initial_rebalance_delay_ms=0))
    groups = object.__new__(GroupRuntime)
    groups.coordinator = coordinator
    groups.runtime = CoordinatorRuntime(
        "groups", CONSUMER_OFFSETS_TOPIC, cast(InternalTopics, topic), coordinator, skip_bad_records=True
    )
    return groups, topic


def txn_offset_commit(groups: GroupRuntime, offset: int) -> asyncio.Future[Any]:
    request = TxnOffsetCommitRequestData(
        transactional_id="tx",
        group_id=GROUP,
        producer_id=PID,
        producer_epoch=0,
        topics=(CommitTopic("in", (CommitPartition(partition_index=0, committed_offset=offset),)),),
    )
    coordinator = groups.coordinator
    return groups.call(lambda token: coordinator.txn_offset_commit(request, 1_000, token))


def stable_fetch(groups: GroupRuntime) -> int | ErrorCode:
    response = groups.coordinator.offset_fetch(
        OffsetFetchRequestData(groups=(FetchGroup(GROUP, (FetchTopic("in", (0,)),)),), require_stable=True)
    )
    [partition] = response.groups[0].topics[0].partitions
    return partition.committed_offset if partition.error_code == ErrorCode.none else partition.error_code


def test_marker_waits_for_the_txn_offset_commit_in_flight_and_an_abort_stays_aborted() -> None:
    async def scenario() -> None:
        groups, topic = group_runtime()
        partition = groups.coordinator.partition_for(GROUP)
        await groups.runtime.reload(
            lambda: {p: None for p in range(groups.coordinator.config.num_partitions)}
        )
        topic.acks = asyncio.Event()
        commit = txn_offset_commit(groups, 150)
        while not topic.log:  # the commit's record is appended, its acks are awaited
            await asyncio.sleep(0)
        assert stable_fetch(groups) == ErrorCode.unstable_offset_commit
        # Its client gave up and aborted: the ABORT marker was appended after the commit's record.
        abort = asyncio.create_task(groups.apply_marker(partition, PID, commit=False))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not abort.done()  # applied only after the commit completed, as in the log
        topic.acks.set()
        await abort
        response = await commit
        assert {p.error_code for t in response.topics for p in t.partitions} == {ErrorCode.none}
        assert not groups.coordinator.offsets.has_pending(GROUP)
        assert stable_fetch(groups) == -1
        # The producer's next transaction commits only its own offset.
        await txn_offset_commit(groups, 300)
        await groups.apply_marker(partition, PID, commit=True)
        assert stable_fetch(groups) == 300

    asyncio.run(scenario())
