"""Delayed fetches (Kafka's DelayedFetch purgatory): long-polling Fetch requests park here until
one of their partitions gets data or their max_wait_ms runs out.

On a single broker the only event that can complete a parked fetch early is an append to one of
its partitions (the high watermark follows the log end at once). On a cluster leader an append
moves the log end (what a follower reads up to) and a follower's fetch moves the high watermark
(what a consumer reads up to): each wakes only the fetches it can complete. The Fetch handler
re-reads its partitions when ``wait`` returns, whatever woke it, so a spurious wake-up costs one
read and no correctness. The cluster's delayed produce (acks=all waiting on the ISR) is
``delayed_produce``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from exactly.types import TopicPartition


class AppendWaiters:
    """Parked fetches by partition, in two kinds by the offset their read is bound by.

    A consumer's fetch reads up to the high watermark (or the last stable offset, which only
    moves with it); a follower's reads up to the log end. Kafka's DelayedFetch completes once the
    bytes below that bound reach MinBytes, so on a cluster leader an append alone cannot complete
    a consumer's fetch and a high-watermark move alone cannot complete a follower's:
    ``notify_appended`` and ``notify_high_watermark`` wake only the kind the event can complete.
    Waking the other kind would cost a re-read and a re-park on the leader's loop per produce for
    nothing (two followers and a consumer: three spurious wake-ups per acks=all produce at RF 3).
    ``notify`` wakes both (a single broker's append moves both bounds; a role change answers
    every parked fetch NOT_LEADER_OR_FOLLOWER).

    Owns ``_waiters`` (high-watermark bound) and ``_log_end`` (log-end bound): for each partition,
    the futures of the fetches parked on it; a fetch parked on several partitions has one future
    in each set. Lifecycle of an entry: added by ``wait``, completed by a notify or by the
    fetch's timer, and removed by ``wait`` itself when it returns (woken, timed out, or
    cancelled because its connection closed), so nothing outlives its fetch. One instance per
    broker (``Broker.waiters``), for the broker's life. Spurious wake-ups are harmless: the Fetch
    handler re-reads whatever woke it.

    A parked fetch is a bare future plus one ``loop.call_at`` timer: ``asyncio.wait_for`` would
    add a Task and a second future per wait, which showed up in the 1,000 msg/s latency profile
    (every record wakes the consumer's parked Fetch). The notifies run after every append, so
    they return before hashing anything when no fetch is parked (the usual case while
    producing)."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}
        self._log_end: dict[TopicPartition, set[asyncio.Future[None]]] = {}

    async def wait(
        self, tps: Iterable[TopicPartition], timeout_s: float, *, up_to_log_end: bool = False
    ) -> None:
        """Park until a notify for one of ``tps`` that can complete this kind of read (a
        follower's, bound by the log end, with ``up_to_log_end``) or ``timeout_s``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        keys = list(tps)
        waiters = self._log_end if up_to_log_end else self._waiters
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
        """Both bounds may have moved (or the partition's role changed)."""
        if self._waiters:  # after every single-broker append: no call when nobody waits
            _wake_all(self._waiters, tp)
        if self._log_end:
            _wake_all(self._log_end, tp)

    def notify_appended(self, tp: TopicPartition) -> None:
        """The log end moved, the high watermark did not (a cluster leader's append)."""
        _wake_all(self._log_end, tp)

    def notify_high_watermark(self, tp: TopicPartition) -> None:
        """The high watermark moved, the log end did not (a follower's fetch advanced it)."""
        _wake_all(self._waiters, tp)


def _wake_all(waiters: dict[TopicPartition, set[asyncio.Future[None]]], tp: TopicPartition) -> None:
    if not waiters:
        return
    parked = waiters.get(tp)
    if not parked:
        return
    for fut in parked:
        if not fut.done():
            fut.set_result(None)


def _wake(fut: asyncio.Future[None]) -> None:
    """Timer callback of a parked fetch: its max_wait is over."""
    if not fut.done():
        fut.set_result(None)
