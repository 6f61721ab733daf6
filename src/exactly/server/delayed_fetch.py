"""Delayed fetches (Kafka's DelayedFetch purgatory): long-polling Fetch requests park here until
one of their partitions gets data or their max_wait_ms runs out.

Single broker, so the only event that can complete a parked fetch early is an append to one of
its partitions (Kafka also completes on a high-watermark move, which here is the same event:
the high watermark follows the log end at once). The broker calls ``notify`` after every append;
the Fetch handler re-reads its partitions when ``wait`` returns, whatever woke it, so a spurious
wake-up costs one read and no correctness. The cluster's delayed produce (acks=all waiting on
the ISR) belongs beside this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from exactly.types import TopicPartition


class AppendWaiters:
    """Parked fetches by partition.

    Owns ``_waiters``: for each partition, the futures of the fetches parked on it; a fetch
    parked on several partitions has one future in each set. Lifecycle of an entry: added by
    ``wait``, completed by ``notify`` or by the fetch's timer, and removed by ``wait`` itself
    when it returns (woken, timed out, or cancelled because its connection closed), so nothing
    outlives its fetch. One instance per broker (``Broker.waiters``), for the broker's life.

    A parked fetch is a bare future plus one ``loop.call_at`` timer: ``asyncio.wait_for`` would
    add a Task and a second future per wait, which showed up in the 1,000 msg/s latency profile
    (every record wakes the consumer's parked Fetch). ``notify`` runs after every append, so it
    returns before hashing anything when no fetch is parked (the usual case while producing)."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}

    async def wait(self, tps: Iterable[TopicPartition], timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        keys = list(tps)
        waiters = self._waiters
        for tp in keys:
            parked = waiters.get(tp)
            if parked is None:
                waiters[tp] = {fut}
            else:
                parked.add(fut)
        timer = loop.call_at(loop.time() + timeout_s, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            for tp in keys:
                parked = waiters.get(tp)
                if parked is not None:
                    parked.discard(fut)
                    if not parked:
                        del waiters[tp]

    def notify(self, tp: TopicPartition) -> None:
        if not self._waiters:
            return
        parked = self._waiters.get(tp)
        if not parked:
            return
        for fut in parked:
            if not fut.done():
                fut.set_result(None)


def _wake(fut: asyncio.Future[None]) -> None:
    """Timer callback of a parked fetch: its max_wait is over."""
    if not fut.done():
        fut.set_result(None)
