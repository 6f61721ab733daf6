"""DelayedProduces: acks=all produces parked until the HW covers them, without blocking the loop."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.leader import LeaderPartition
from exactly.server.delayed_produce import DelayedProduces, Parked
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)


def leader() -> LeaderPartition:
    return LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 0, (1, 2), 1),
        zk_version=0,
        replicas=(1, 2),
        leader_log_end_offset=0,
        high_watermark=0,
        now_ms=0,
    )


def test_parked_until_the_follower_reaches_the_offset() -> None:
    async def scenario() -> ErrorCode:
        delayed = DelayedProduces()
        lp = leader()
        lp.on_leader_append(5, now_ms=1)
        waiting = asyncio.ensure_future(delayed.wait(TP, lp, lambda: True, 5, 2, timeout_s=10))
        await asyncio.sleep(0)
        assert not waiting.done()
        lp.on_follower_fetch(2, 3, 0, now_ms=2)  # follower at 3: HW 3, not enough
        delayed.wake(TP)
        await asyncio.sleep(0)
        assert not waiting.done()
        lp.on_follower_fetch(2, 5, 0, now_ms=3)
        delayed.wake(TP)
        return await waiting

    assert asyncio.run(scenario()) == ErrorCode.none


def test_leadership_moved_and_timeout() -> None:
    async def scenario() -> tuple[ErrorCode, ErrorCode]:
        delayed = DelayedProduces()
        lp = leader()
        lp.on_leader_append(5, now_ms=1)
        current = True
        moved = asyncio.ensure_future(delayed.wait(TP, lp, lambda: current, 5, 2, timeout_s=10))
        await asyncio.sleep(0)
        current = False
        delayed.wake(TP)
        timed_out = await delayed.wait(TP, lp, lambda: True, 5, 2, timeout_s=0.01)
        return await moved, timed_out

    assert asyncio.run(scenario()) == (ErrorCode.not_leader_or_follower, ErrorCode.request_timed_out)


def test_a_wake_answers_the_produces_it_completes_and_leaves_the_others_parked() -> None:
    async def scenario() -> tuple[ErrorCode, ErrorCode]:
        delayed = DelayedProduces()
        lp = leader()
        lp.on_leader_append(5, now_ms=1)
        first = asyncio.ensure_future(delayed.wait(TP, lp, lambda: True, 3, 2, timeout_s=10))
        second = asyncio.ensure_future(delayed.wait(TP, lp, lambda: True, 5, 2, timeout_s=10))
        await asyncio.sleep(0)
        lp.on_follower_fetch(2, 3, 0, now_ms=2)  # HW 3: the first is done, the second is not
        delayed.wake(TP)
        await asyncio.sleep(0)
        assert not second.done()
        lp.on_follower_fetch(2, 5, 0, now_ms=3)
        delayed.wake(TP)
        return await first, await second

    assert asyncio.run(scenario()) == (ErrorCode.none, ErrorCode.none)


def test_a_cancelled_produce_leaves_nothing_parked() -> None:
    async def scenario() -> ErrorCode:
        delayed = DelayedProduces()
        lp = leader()
        lp.on_leader_append(5, now_ms=1)
        gone = asyncio.ensure_future(delayed.wait(TP, lp, lambda: True, 5, 2, timeout_s=10))
        await asyncio.sleep(0)
        gone.cancel()  # its connection closed
        await asyncio.gather(gone, return_exceptions=True)
        lp.on_follower_fetch(2, 5, 0, now_ms=2)
        delayed.wake(TP)  # nothing parked: no error, nothing resolved twice
        return await delayed.wait(TP, lp, lambda: True, 5, 2, timeout_s=10)  # done at once

    assert asyncio.run(scenario()) == ErrorCode.none


def test_park_completes_inside_the_wake_and_discard_forgets() -> None:
    """``park``'s callback runs inside the ``wake`` that completes it (no loop hop), once; a
    discarded entry is never completed; an answer known at once is returned, not called back."""

    async def scenario() -> None:
        delayed = DelayedProduces()
        lp = leader()
        lp.on_leader_append(5, now_ms=1)
        done: list[tuple[str, ErrorCode]] = []
        first = delayed.park(TP, lp, lambda: True, 5, 2, 10, lambda code: done.append(("first", code)))
        second = delayed.park(TP, lp, lambda: True, 5, 2, 10, lambda code: done.append(("second", code)))
        assert isinstance(first, Parked) and isinstance(second, Parked)
        delayed.discard(second)
        lp.on_follower_fetch(2, 5, 0, now_ms=2)
        delayed.wake(TP)
        assert done == [("first", ErrorCode.none)]
        delayed.wake(TP)
        assert done == [("first", ErrorCode.none)]
        assert (
            delayed.park(TP, lp, lambda: True, 5, 2, 10, lambda code: done.append(("x", code)))
            == ErrorCode.none
        )
        expiring = delayed.park(TP, lp, lambda: True, 6, 2, 0.01, lambda code: done.append(("late", code)))
        assert isinstance(expiring, Parked)
        await asyncio.sleep(0.05)
        assert done[-1] == ("late", ErrorCode.request_timed_out)

    asyncio.run(scenario())
