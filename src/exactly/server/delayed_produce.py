"""acks=all produces parked until the ISR has their records (Kafka's DelayedProduce purgatory).

A parked produce is a future per partition plus one ``loop.call_later`` timer, the same shape as
the long-poll fetches of ``delayed_fetch``. The replica manager wakes a partition's parked
produces whenever its high watermark moves or its leadership changes. The waker itself decides
(Kafka's ``tryComplete`` run by whoever moved the HW): each parked produce re-asks
``LeaderPartition.check_acks_all`` (and whether its leader still leads) there and then, and only
the produces that are done get their future resolved, with their final error code; the others
stay parked as they are. So a HW move that completes one of five in-flight produces costs four
comparisons, not four task wake-ups that each re-check, re-park and re-arm a timer, and a
completed produce's answer is one task step away from the HW move. Wake-ups carry no meaning of
their own: a spurious one is a few comparisons. The event loop is never blocked.

Invariants: every parked entry's future is in exactly one partition's list until it is resolved
(by a wake, its timer, or its waiter being cancelled), and ``wait`` removes its entry whatever
ends it, so nothing outlives its produce.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from exactly.replication.leader import AckOutcome, LeaderPartition
from exactly.types import TopicPartition


@dataclass(frozen=True, slots=True, eq=False)  # identity: ``remove`` finds this entry
class _Parked:
    leader: LeaderPartition
    is_current: Callable[[], bool]
    required_offset: int
    min_isr: int
    future: asyncio.Future[ErrorCode]

    def outcome(self) -> ErrorCode | None:
        """The produce's answer if it is done now, else None (keep waiting)."""
        if not self.is_current():
            return ErrorCode.not_leader_or_follower
        acks = self.leader.check_acks_all(self.required_offset, self.min_isr)
        if acks is AckOutcome.DONE:
            return ErrorCode.none
        if acks is AckOutcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            return ErrorCode.not_enough_replicas_after_append
        return None


class DelayedProduces:
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, list[_Parked]] = {}

    def wake(self, tp: TopicPartition) -> None:
        """Something that can complete ``tp``'s parked produces happened (HW or role change):
        answer the ones that are done, leave the others parked."""
        parked = self._waiters.get(tp)
        if not parked:
            return
        waiting: list[_Parked] = []
        for entry in parked:
            if entry.future.done():
                continue
            code = entry.outcome()
            if code is None:
                waiting.append(entry)
            else:
                entry.future.set_result(code)
        if waiting:
            self._waiters[tp] = waiting
        else:
            del self._waiters[tp]

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
        entry = _Parked(leader, is_current, required_offset, min_isr, loop.create_future())
        code = entry.outcome()
        if code is not None:
            return code
        if timeout_s <= 0:
            return ErrorCode.request_timed_out
        self._waiters.setdefault(tp, []).append(entry)
        timer = loop.call_later(timeout_s, _time_out, entry.future)
        try:
            return await entry.future
        finally:
            timer.cancel()
            parked = self._waiters.get(tp)
            if parked is not None and entry in parked:
                parked.remove(entry)
                if not parked:
                    del self._waiters[tp]


def _time_out(fut: asyncio.Future[ErrorCode]) -> None:
    if not fut.done():
        fut.set_result(ErrorCode.request_timed_out)
