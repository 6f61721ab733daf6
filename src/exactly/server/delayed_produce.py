"""acks=all produces parked until the ISR has their records (Kafka's DelayedProduce purgatory).

A parked produce is an entry per partition with a completion callback plus one
``loop.call_later`` timer. The replica manager wakes a partition's parked produces whenever its
high watermark moves or its leadership changes. The waker itself decides (Kafka's
``tryComplete`` run by whoever moved the HW): each parked produce re-asks
``LeaderPartition.check_acks_all`` (and whether its leader still leads) there and then, and only
the produces that are done are completed, with their final error code, by calling their
callback inside the wake (``park``; the produce handler's answer is then written by the
connection in that same call, see ``deferred_response.PendingAnswer``); the others stay parked
as they are. So a HW move that completes one of five in-flight produces costs four comparisons,
and a completed produce's answer is on the socket before the event that completed it has been
answered itself. Wake-ups carry no meaning of their own: a spurious one is a few comparisons.
The event loop is never blocked. ``wait`` is the awaitable form, for callers that wait in a
coroutine (the coordinators' writes to their internal topics).

Invariants: every parked entry is in exactly one partition's list until it is completed (by a
wake, its timer) or discarded (its produce's answer was cancelled with the connection), and
each entry's callback runs at most once, after the entry left the list and its timer was
cancelled, so nothing outlives its produce.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from exactly.replication.leader import AckOutcome, LeaderPartition
from exactly.types import TopicPartition

log = logging.getLogger("exactly.delayed_produce")

OnDone = Callable[[ErrorCode], None]


class Parked:
    """One produce's wait on one partition (mutable only in its timer handle, set once)."""

    __slots__ = ("is_current", "leader", "min_isr", "on_done", "required_offset", "timer", "tp")

    def __init__(
        self,
        tp: TopicPartition,
        leader: LeaderPartition,
        is_current: Callable[[], bool],
        required_offset: int,
        min_isr: int,
        on_done: OnDone,
    ) -> None:
        self.tp = tp
        self.leader = leader
        self.is_current = is_current
        self.required_offset = required_offset
        self.min_isr = min_isr
        self.on_done = on_done
        self.timer: asyncio.TimerHandle | None = None

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


def _complete(entry: Parked, code: ErrorCode) -> None:
    """Run a completion callback; its failure (a bug in answering one produce) is logged and
    stays there: the waker is another request's handler (a follower's fetch) or a timer."""
    try:
        entry.on_done(code)
    except Exception:
        log.exception("%s: completing a delayed produce failed", entry.tp)


class DelayedProduces:
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, list[Parked]] = {}

    def wake(self, tp: TopicPartition) -> None:
        """Something that can complete ``tp``'s parked produces happened (HW or role change):
        complete the ones that are done (their callbacks run here, after the list is updated,
        so a callback may park or discard others), leave the others parked."""
        parked = self._waiters.get(tp)
        if not parked:
            return
        waiting: list[Parked] = []
        done: list[tuple[Parked, ErrorCode]] = []
        for entry in parked:
            code = entry.outcome()
            if code is None:
                waiting.append(entry)
            else:
                done.append((entry, code))
        if not done:
            return
        if waiting:
            self._waiters[tp] = waiting
        else:
            del self._waiters[tp]
        for entry, code in done:
            if entry.timer is not None:
                entry.timer.cancel()
            _complete(entry, code)

    def park(
        self,
        tp: TopicPartition,
        leader: LeaderPartition,
        is_current: Callable[[], bool],
        required_offset: int,
        min_isr: int,
        timeout_s: float,
        on_done: OnDone,
    ) -> ErrorCode | Parked:
        """The produce's answer now if it has one (``on_done`` is not called), else its parked
        entry: ``on_done(code)`` runs once, when the HW reached ``required_offset`` (NONE, or
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the maximal ISR shrank below min.insync.replicas
        meanwhile), ``is_current()`` says ``leader`` no longer leads (NOT_LEADER_OR_FOLLOWER), or
        after ``timeout_s`` (REQUEST_TIMED_OUT)."""
        entry = Parked(tp, leader, is_current, required_offset, min_isr, on_done)
        code = entry.outcome()
        if code is not None:
            return code
        if timeout_s <= 0:
            return ErrorCode.request_timed_out
        self._waiters.setdefault(tp, []).append(entry)
        entry.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, entry)
        return entry

    def discard(self, entry: Parked) -> None:
        """Forget a parked entry without completing it (its answer is no longer wanted)."""
        if entry.timer is not None:
            entry.timer.cancel()
        self._remove(entry)

    def _expire(self, entry: Parked) -> None:
        if self._remove(entry):
            _complete(entry, ErrorCode.request_timed_out)

    def _remove(self, entry: Parked) -> bool:
        parked = self._waiters.get(entry.tp)
        if parked is None or entry not in parked:
            return False
        parked.remove(entry)
        if not parked:
            del self._waiters[entry.tp]
        return True

    async def wait(
        self,
        tp: TopicPartition,
        leader: LeaderPartition,
        is_current: Callable[[], bool],
        required_offset: int,
        min_isr: int,
        timeout_s: float,
    ) -> ErrorCode:
        """``park`` as a coroutine: the same answers; cancelling it discards the entry."""
        fut: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()

        def done(code: ErrorCode) -> None:
            if not fut.done():
                fut.set_result(code)

        entry = self.park(tp, leader, is_current, required_offset, min_isr, timeout_s, done)
        if not isinstance(entry, Parked):
            return entry
        try:
            return await fut
        finally:
            self.discard(entry)
