"""``IsrWriter``: a write lost with the ZooKeeper session is an expected outcome (a WARNING, no
traceback), anything else an ERROR with its traceback; neither is adopted by the leader."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.leader import LeaderPartition
from exactly.server.isr_writer import IsrWriter
from exactly.types import TopicPartition

TP = TopicPartition("isr", 0)
NOW = 1_700_000_000_000


class BrokenZk(ClusterZk):
    """A session whose ISR write fails for a reason that is not ZooKeeper's."""

    def update_isr(self, tp: TopicPartition, new: LeaderAndIsr, expected_zk_version: int) -> int | None:
        raise RuntimeError("not a ZooKeeper outcome")


def write_shrink(zk: ClusterZk) -> LeaderPartition:
    """Leader 1 with ISR {1, 2}; follower 2 lags past replica.lag.time.max.ms -> one shrink write."""
    leader = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(leader=1, leader_epoch=3, isr=(1, 2), controller_epoch=1),
        zk_version=5,
        replicas=(1, 2),
        leader_log_end_offset=10,
        high_watermark=0,
        now_ms=NOW,
        max_lag_ms=1_000,
    )
    update = leader.maybe_shrink_isr(NOW + 5_000)
    assert update is not None and update.isr == (1,)

    async def run() -> None:
        tasks: list[asyncio.Task[None]] = []

        def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
            tasks.append(asyncio.get_running_loop().create_task(coro, name=name))

        def published(tp: TopicPartition, leader: LeaderPartition) -> None:
            raise AssertionError("a failed write publishes nothing")

        writer = IsrWriter(zk, {TP: leader}, max_lag_ms=1_000, spawn=spawn, publish_high_watermark=published)
        writer.write(TP, leader, update)
        await asyncio.gather(*tasks)

    asyncio.run(run())
    return leader


def isr_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "ISR write" in r.getMessage()]


def test_write_lost_with_the_session_is_a_warning_without_traceback(
    cluster_zk: Callable[[], ClusterZk], caplog: pytest.LogCaptureFixture
) -> None:
    zk = cluster_zk()
    zk.client.stop()  # the session is gone: every call now fails as after a LOST
    caplog.set_level(logging.INFO, logger="exactly.replica_manager")
    leader = write_shrink(zk)
    (record,) = isr_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.exc_info is None and "session is lost" in record.getMessage()
    assert leader.isr == (1, 2)  # not adopted
    assert leader.maybe_shrink_isr(NOW + 6_000) is not None  # and the leader may propose again


def test_unexpected_failure_is_an_error_with_its_traceback(
    zk_connect: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exactly.replica_manager")
    leader = write_shrink(BrokenZk(zk_connect))  # never started: the write raises before any call
    (record,) = isr_records(caplog)
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert leader.isr == (1, 2)
