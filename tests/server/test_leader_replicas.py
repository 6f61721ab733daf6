"""LeaderReplicas: a follower fetch that moves the HW answers the parked produces inside that call,
before the consumers' parked fetches are even woken; a produce whose leadership ended is answered
NOT_LEADER_OR_FOLLOWER by the role change's wake."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.leader import LeaderPartition
from exactly.server.leader_replicas import LeaderReplicas
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)


@dataclass
class _Log:
    tp: TopicPartition = TP
    log_end_offset: int = 0
    high_watermark: int = 0

    def update_high_watermark(self, hw: int) -> None:
        self.high_watermark = hw


@dataclass
class _Waiters:
    events: list[str]

    def notify_high_watermark(self, tp: TopicPartition) -> None:
        self.events.append("consumers woken")

    def notify_appended(self, tp: TopicPartition) -> None:
        self.events.append("followers woken")


@dataclass
class _Logs:
    plog: _Log

    def get_partition(self, tp: TopicPartition) -> _Log | None:
        return self.plog if tp == self.plog.tp else None


@dataclass
class _Broker:
    events: list[str] = field(default_factory=list)
    plog: _Log = field(default_factory=_Log)

    def __post_init__(self) -> None:
        self.logs = _Logs(self.plog)
        self.waiters = _Waiters(self.events)


def _leading() -> tuple[LeaderReplicas, _Broker, LeaderPartition]:
    broker = _Broker()
    leading = LeaderReplicas(broker, 1, lambda tp, leader, update: None)  # type: ignore[arg-type]
    leader = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 0, (1, 2, 3), 1),
        zk_version=0,
        replicas=(1, 2, 3),
        leader_log_end_offset=0,
        high_watermark=0,
        now_ms=0,
    )
    leading.leaders[TP] = leader
    return leading, broker, leader


def test_the_fetch_that_moves_the_hw_answers_the_produce_before_waking_consumers() -> None:
    async def scenario() -> list[str]:
        leading, broker, leader = _leading()
        broker.plog.log_end_offset = 3
        leading.after_leader_append(broker.plog)  # type: ignore[arg-type]
        parked = leading.park_for_acks(
            TP, leader, 3, 2, 10, lambda code: broker.events.append(f"produce answered {code.name}")
        )
        assert parked is not ErrorCode.none
        leading.on_follower_fetch(broker.plog, 2, 3, 0)  # type: ignore[arg-type]
        assert broker.events == ["followers woken"]  # broker 3 still holds the HW back
        leading.on_follower_fetch(broker.plog, 3, 3, 0)  # type: ignore[arg-type]
        assert broker.plog.high_watermark == 3
        return broker.events

    assert asyncio.run(scenario()) == ["followers woken", "produce answered none", "consumers woken"]


def test_a_produce_whose_leadership_ended_is_answered_not_leader() -> None:
    async def scenario() -> list[Any]:
        leading, broker, leader = _leading()
        broker.plog.log_end_offset = 3
        leading.after_leader_append(broker.plog)  # type: ignore[arg-type]
        answers: list[Any] = []
        leading.park_for_acks(TP, leader, 3, 2, 10, answers.append)
        del leading.leaders[TP]
        leading.wake_acks(TP)
        return answers

    assert asyncio.run(scenario()) == [ErrorCode.not_leader_or_follower]
