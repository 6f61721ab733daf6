"""AppendWaiters (fetch long-poll parking with a bare future and a loop timer): an append to any
of the parked partitions wakes the fetch, max_wait wakes it otherwise, and nothing is left behind
after a wake-up, a timeout or a cancelled fetch (a closed connection)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from exactly.server.delayed_fetch import AppendWaiters, ParkedFetch
from exactly.types import TopicPartition

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
# the waiter sets' keys (``delayed_fetch._Key``)
KA, KB = ("t", 0), ("t", 1)


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
        assert len(w._waiters[KA]) == 3
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
        assert set(w._waiters) == {KA} and set(w._log_end) == {KA}
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


def test_a_parked_fetch_answers_inside_the_append_that_completes_it() -> None:
    """``park``: the leader's append fires the callback in the notify call itself (no task, no
    loop turn), and the fired entry has left every set and its timer before the callback runs,
    so the callback may park again."""

    async def main() -> None:
        w = AppendWaiters()
        fired: list[str] = []

        def fire() -> None:
            fired.append("fired")
            assert w._log_end == {}  # detached first
            if len(fired) == 1:
                w.park([A, B], 30.0, fire, up_to_log_end=True)  # too few bytes: park again

        w.park([A, B], 30.0, fire, up_to_log_end=True)
        w.notify_high_watermark(A)  # a consumer's event: not this fetch's
        assert fired == []
        w.notify_appended(B)
        assert fired == ["fired"]  # inside the call
        assert set(w._log_end) == {KA, KB}  # parked again
        w.notify_appended(A)
        assert fired == ["fired", "fired"]
        assert w._log_end == {}
        # their deadlines may stay in the heap until due, but as fired entries (skipped)
        assert all(entry[2].done() for entry in w._deadlines)

    asyncio.run(main())


def test_a_role_change_fires_a_parked_fetch_on_the_next_loop_turn() -> None:
    """``notify`` (role changes, epoch bumps) fires it as a woken task would run: after the
    caller's whole change, never in the middle of it."""

    async def main() -> None:
        w = AppendWaiters()
        fired: list[int] = []
        w.park([A], 30.0, lambda: fired.append(1), up_to_log_end=True)
        w.notify(A)
        w.notify(A)  # twice before it runs: fired once, scheduled once
        assert fired == []
        assert len(asyncio.get_running_loop()._ready) == 1  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        assert fired == [1]
        assert w._log_end == {}

    asyncio.run(main())


def test_a_parked_fetch_fires_at_its_max_wait_and_a_cancelled_one_never() -> None:
    async def main() -> None:
        w = AppendWaiters()
        done = asyncio.get_running_loop().create_future()
        w.park([A], 0.02, lambda: done.set_result(None), up_to_log_end=True)
        gone = w.park([A, C], 0.02, lambda: done.set_exception(AssertionError("fired")), up_to_log_end=False)
        gone.cancel()
        assert set(w._waiters) == set() and set(w._log_end) == {KA}
        await asyncio.wait_for(done, 5.0)
        await asyncio.sleep(0.05)
        assert w._log_end == {} and w._waiters == {}

    asyncio.run(main())


def test_an_append_prepares_every_parked_follower_fetch_before_sending_any() -> None:
    """The first answer written wakes its follower, which may take the leader's core: both
    followers' answers are read and encoded first, then sent back to back."""

    async def main() -> None:
        w = AppendWaiters()
        steps: list[str] = []

        def fetch(name: str) -> Callable[[], Callable[[], None] | None]:
            def fire() -> Callable[[], None]:
                steps.append(f"prepare {name}")
                return lambda: steps.append(f"send {name}")

            return fire

        w.park([A], 30.0, fetch("f1"), up_to_log_end=True)
        w.park([A], 30.0, fetch("f2"), up_to_log_end=True)
        w.notify_appended(A)
        assert sorted(steps[:2]) == ["prepare f1", "prepare f2"]
        assert sorted(steps[2:]) == ["send f1", "send f2"]
        assert w._log_end == {}

    asyncio.run(main())


def test_parked_fetches_share_one_timer_and_each_fires_at_its_own_max_wait() -> None:
    """``park`` keeps one loop timer, armed for the earliest deadline: a fetch parked later with
    a shorter max_wait re-arms it, and each fires at its own max_wait, in deadline order."""

    async def main() -> None:
        w = AppendWaiters()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        fired: dict[str, float] = {}
        done = loop.create_future()

        def fire(name: str) -> Callable[[], None]:
            def record() -> None:
                fired[name] = loop.time() - t0
                if len(fired) == 3:
                    done.set_result(None)

            return record

        w.park([A], 0.15, fire("slow"), up_to_log_end=False)
        w.park([B], 0.05, fire("fast"), up_to_log_end=False)  # earlier: the timer moves up
        w.park([C], 0.10, fire("middle"), up_to_log_end=False)
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(live) == 1 and live[0].when() == min(entry[0] for entry in w._deadlines)
        await asyncio.wait_for(done, 5.0)
        assert list(fired) == ["fast", "middle", "slow"]
        assert fired["fast"] >= 0.045 and fired["middle"] >= 0.095 and fired["slow"] >= 0.145
        assert w._waiters == {} and w._deadlines == []

    asyncio.run(main())


def test_woken_fetches_leave_a_bounded_deadline_heap_and_no_timer_per_fetch() -> None:
    """At latency-1k each record parks a Fetch and wakes it: the woken fetches' deadline entries
    are compacted away (the heap stays O(parked fetches)), one timer stays armed, and a fetch
    still parked among them fires at its max_wait."""

    async def main() -> None:
        w = AppendWaiters()
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        w.park([C], 0.05, lambda: done.set_result(None), up_to_log_end=False)
        woken = 0

        def fire() -> None:
            nonlocal woken
            woken += 1

        for _ in range(1000):
            w.park([A], 30.0, fire, up_to_log_end=False)
            w.notify_high_watermark(A)
        assert woken == 1000
        assert len(w._deadlines) <= 2 * 64 + 1
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(live) == 1
        await asyncio.wait_for(done, 5.0)
        assert w._waiters == {}

    asyncio.run(main())


def test_fetches_that_park_again_at_their_max_wait_all_fire_again() -> None:
    """A fetch whose max_wait ends parks again when its own deadline is not over yet (the fast
    path's re-read): 100 of them re-parking from inside one expiry (which compacts the heap on
    the way) each fire a second time."""

    async def main() -> None:
        w = AppendWaiters()
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        fired: dict[int, int] = {}

        def fetch(i: int) -> Callable[[], None]:
            def fire() -> None:
                fired[i] = fired.get(i, 0) + 1
                if fired[i] == 1:
                    w.park([A], 0.02, fetch(i), up_to_log_end=False)
                elif sum(fired.values()) == 200:
                    done.set_result(None)

            return fire

        for i in range(100):
            w.park([A], 0.02, fetch(i), up_to_log_end=False)
        await asyncio.wait_for(done, 5.0)
        assert set(fired.values()) == {2}
        assert w._waiters == {} and all(entry[2].done() for entry in w._deadlines)

    asyncio.run(main())


def test_a_parked_fetch_fired_by_its_set_result_leaves_first_and_fires_once() -> None:
    """``ParkedFetch.set_result`` (the timer's and ``fire_soon``'s way in, ``prepare`` unfolded
    into it): the fetch has left every set before ``fire`` runs, its answer is sent, and a second
    ``set_result`` (a stale timer entry, a second wake-up) does nothing."""

    async def main() -> None:
        w = AppendWaiters()
        events: list[str] = []

        def fire() -> Callable[[], None]:
            assert w._waiters == {}  # detached first
            events.append("fired")
            return lambda: events.append("sent")

        parked = w.park([A, B], 30.0, fire, up_to_log_end=False)
        assert set(w._waiters) == {KA, KB} and not parked.done()
        parked.set_result(None)
        assert events == ["fired", "sent"] and parked.done()
        parked.set_result(None)
        w.notify(A)
        await asyncio.sleep(0)
        assert events == ["fired", "sent"]
        cancelled = w.park([A], 30.0, fire, up_to_log_end=False)
        cancelled.cancel()
        cancelled.set_result(None)
        assert events == ["fired", "sent"] and w._waiters == {}

    asyncio.run(main())


def test_the_notifying_append_s_batch_is_held_for_fire_and_dropped_after() -> None:
    """``notify(tp, tail)`` hands the batch to a consumer fetch it wakes (``ParkedFetch.tail``),
    read while ``fire`` runs and dropped once it returns (a stale deadline entry keeps no frame
    alive); a second append before the wake-up drops it (the fetch then reads the log), and so do
    a cancel and a notify without a batch; a follower's fetch (log-end kind) never gets one."""

    async def main() -> None:
        w = AppendWaiters()
        seen: list[object] = []
        parked_by_name: dict[str, ParkedFetch] = {}

        def fire_of(name: str) -> Callable[[], None]:
            def fire() -> None:
                seen.append((name, parked_by_name[name].tail))

            return fire  # type: ignore[return-value]

        def park(name: str, tp: TopicPartition, *, up_to_log_end: bool = False) -> ParkedFetch:
            parked = w.park([tp], 30.0, fire_of(name), up_to_log_end=up_to_log_end)
            parked_by_name[name] = parked
            return parked

        one, two = (object(), 1, 2, bytearray(b"x"), 0, 1), (object(), 2, 3, bytearray(b"y"), 0, 1)
        first = park("first", A)
        follower = park("follower", A, up_to_log_end=True)
        w.notify(A, one)  # type: ignore[arg-type]
        assert first.tail is one and follower.tail is None
        await asyncio.sleep(0)
        assert seen == [("first", one), ("follower", None)]
        assert first.tail is None and first.done()
        seen.clear()

        second = park("second", A)
        w.notify(A, one)  # type: ignore[arg-type]
        w.notify(A, two)  # type: ignore[arg-type]  # a second append in the same turn
        assert second.tail is None
        await asyncio.sleep(0)
        assert seen == [("second", None)]
        seen.clear()

        park("third", A)
        w.notify(A)  # the generic path's append: no batch
        await asyncio.sleep(0)
        assert seen == [("third", None)]
        seen.clear()

        fourth = park("fourth", A)
        w.notify(A, one)  # type: ignore[arg-type]
        fourth.cancel()
        assert fourth.tail is None
        await asyncio.sleep(0)
        assert seen == [] and w._waiters == {} and w._log_end == {}

    asyncio.run(main())
