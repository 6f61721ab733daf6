"""AppendWaiters (fetch long-poll parking with a bare future and a loop timer): an append to any
of the parked partitions wakes the fetch, max_wait wakes it otherwise, and nothing is left behind
after a wake-up, a timeout or a cancelled fetch (a closed connection)."""

from __future__ import annotations

import asyncio
import time

from exactly.server.delayed_fetch import AppendWaiters
from exactly.types import TopicPartition

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def test_notify_wakes_the_parked_fetch() -> None:
    async def main() -> float:
        w = AppendWaiters()
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, w.notify, C)  # not parked on: no effect
        loop.call_later(0.05, w.notify, B)
        t0 = time.monotonic()
        await w.wait([A, B], 5.0)
        assert w._waiters == {}
        return time.monotonic() - t0

    assert 0.04 <= asyncio.run(main()) < 2.0


def test_timeout_wakes_and_cleans_up() -> None:
    async def main() -> float:
        w = AppendWaiters()
        t0 = time.monotonic()
        await asyncio.gather(w.wait([A], 0.05), w.wait([A, B], 0.08))
        assert w._waiters == {}
        w.notify(A)  # nothing parked: a no-op
        return time.monotonic() - t0

    assert 0.07 <= asyncio.run(main()) < 2.0


def test_one_append_wakes_every_fetch_parked_on_it() -> None:
    async def main() -> None:
        w = AppendWaiters()
        tasks = [asyncio.create_task(w.wait([A], 5.0)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert len(w._waiters[A]) == 3
        w.notify(A)
        await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
        assert w._waiters == {}

    asyncio.run(main())


def test_cancelled_fetch_leaves_nothing_behind() -> None:
    async def main() -> None:
        w = AppendWaiters()
        task = asyncio.create_task(w.wait([A, B], 5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert w._waiters == {}
        assert not asyncio.get_running_loop()._scheduled or all(  # type: ignore[attr-defined]
            h.cancelled()
            for h in asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
        )

    asyncio.run(main())


def test_an_append_wakes_follower_fetches_and_a_high_watermark_move_consumer_fetches() -> None:
    """On a cluster leader each event wakes only the fetches it can complete (Kafka's
    DelayedFetch bounds: the log end for a follower, the high watermark for a consumer)."""

    async def main() -> None:
        w = AppendWaiters()
        consumer = asyncio.create_task(w.wait([A], 30.0))
        follower = asyncio.create_task(w.wait([A], 30.0, up_to_log_end=True))
        await asyncio.sleep(0)  # both parked
        assert set(w._waiters) == {A} and set(w._log_end) == {A}
        w.notify_appended(A)
        await asyncio.wait_for(follower, 5.0)
        assert not consumer.done()
        assert w._log_end == {}
        again = asyncio.create_task(w.wait([A], 30.0, up_to_log_end=True))
        await asyncio.sleep(0)
        w.notify_high_watermark(A)
        await asyncio.wait_for(consumer, 5.0)
        assert not again.done()
        assert w._waiters == {}
        w.notify(A)  # a role change wakes both kinds
        await asyncio.wait_for(again, 5.0)
        assert w._waiters == {} and w._log_end == {}

    asyncio.run(main())
