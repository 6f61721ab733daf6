"""acks=all produces parked until the ISR has their records (Kafka's DelayedProduce purgatory).

A parked produce is a future per partition plus one ``loop.call_later`` timer, the same shape as
the long-poll fetches of ``delayed_fetch``. The replica manager wakes a partition's parked
produces whenever its high watermark moves or its leadership changes; each wakened produce then
re-asks ``LeaderPartition.check_acks_all``, so wake-ups carry no meaning of their own and a spurious
one is harmless. The event loop is never blocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from exactly.replication.leader import AckOutcome, LeaderPartition
from exactly.types import TopicPartition


class DelayedProduces:
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}

    def wake(self, tp: TopicPartition) -> None:
        """Something that can complete ``tp``'s parked produces happened (HW or role change)."""
        for fut in self._waiters.pop(tp, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(
        self,
        tp: TopicPartition,
        leader: LeaderPartition,
        is_current: Callable[[], bool],
        required_offset: int,
        min_isr: int,
        timeout_s: float,
    ) -> ErrorCode:
        """Done when the HW reached ``required_offset`` (then NOT_ENOUGH_REPLICAS_AFTER_APPEND if the
        maximal ISR shrank below min.insync.replicas meanwhile), NOT_LEADER_OR_FOLLOWER once
        ``is_current()`` says ``leader`` no longer leads, REQUEST_TIMED_OUT after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if not is_current():
                return ErrorCode.not_leader_or_follower
            outcome = leader.check_acks_all(required_offset, min_isr)
            if outcome is AckOutcome.DONE:
                return ErrorCode.none
            if outcome is AckOutcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
                return ErrorCode.not_enough_replicas_after_append
            remaining = deadline - loop.time()
            if remaining <= 0:
                return ErrorCode.request_timed_out
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(tp, set()).add(fut)
            timer = loop.call_later(remaining, _wake, fut)
            try:
                await fut
            finally:
                timer.cancel()
                parked = self._waiters.get(tp)
                if parked is not None:
                    parked.discard(fut)
                    if not parked:
                        del self._waiters[tp]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
