"""Carrying out one coordinator result: its writes, their completions and its effects.

Why a module of its own: :mod:`exactly.server.coordinator_runtime` decides *when* an operation
runs (lifecycle, loading, ownership, the operation lock, parked requests, timers); this module
is *how* the result of one operation reaches the internal topic, the same for a single broker
and for a cluster. It knows nothing of tokens, locks or loading: it takes a
:class:`~exactly.coordinator.result.CoordinatorResult` and gives back the :class:`Answers` it
owes, which the runtime delivers.

Theory of operation
-------------------
1. each :class:`~exactly.coordinator.result.Write` is appended as one batch to its partition of
   the internal topic -- :meth:`ResultDriver.drive` with ``InternalTopics.append`` (a single
   broker: storage is synchronous and this broker is the only replica, so "appended" is
   "durable"), :meth:`ResultDriver.drive_replicated` with ``InternalTopics.append_replicated``
   (cluster mode: acks=all, awaited until the ISR has it);
2. the outcome goes to the write's completion, which applies the records (prepare -> persist ->
   complete) and returns the next result; those writes run before the next sibling (depth-first),
   so an operation's chain of appends finishes in order;
3. ``effects`` go to the binding's side-effect handler (the transaction markers), which may hand
   back another result, carried out the same way;
4. only then are the answers complete: the last ``response`` given and every parked request's
   ``reply``, in the order they came.

A failed append never raises out of a drive: it reaches the write's completion as an
:class:`~exactly.coordinator.result.AppendOutcome` with the error code (``AppendFailed``'s, or
UNKNOWN_SERVER_ERROR for anything unexpected, logged), so the coordinator can undo its prepared
transition. Both drivers share one traversal (:meth:`ResultDriver._carry_out`, a generator that
yields each write and is sent its outcome), so the order cannot differ between the two modes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode

from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Reply, Write
from exactly.server.clock import now_ms
from exactly.server.internal_topics import AppendFailed

if TYPE_CHECKING:
    from exactly.server.internal_topics import InternalTopics

R = TypeVar("R")

SideEffect = Callable[[object], "CoordinatorResult[Any] | None"]


class Answers:
    """What one drive owes: the request's response (the last one given) and the replies to
    parked requests, in the order the results gave them."""

    __slots__ = ("replies", "response")

    def __init__(self, result: CoordinatorResult[Any]) -> None:
        self.response: Any = None
        self.replies: list[Reply] = []
        self.add(result)

    def add(self, result: CoordinatorResult[Any]) -> None:
        if result.response is not None:
            self.response = result.response
        self.replies.extend(result.replies)


class ResultDriver:
    """Carries out results against one internal topic (see the module docstring).

    ``side_effect`` executes a result's ``effects`` (the transaction markers) and returns the
    coordinator's follow-up result, or None when the effect was deferred (queued for a retry); a
    result with effects and no handler is a bug (TypeError). The caller keeps the coordinator
    from being entered concurrently: :meth:`drive_replicated` yields to the event loop at every
    append, so the runtime holds its operation lock around it.
    """

    __slots__ = ("_internal", "_log", "_name", "_side_effect", "_topic")

    def __init__(
        self,
        name: str,
        topic: str,
        internal: InternalTopics,
        side_effect: SideEffect | None,
        log: logging.Logger,
    ) -> None:
        self._name = name
        self._topic = topic
        self._internal = internal
        self._side_effect = side_effect
        self._log = log

    def drive(self, result: CoordinatorResult[Any]) -> Answers:
        """Carry out ``result`` with local (synchronous) appends."""
        answers = Answers(result)
        steps = self._carry_out(result, answers)
        write = next(steps, None)
        while write is not None:
            write = _send(steps, self._append(write))
        return answers

    async def drive_replicated(self, result: CoordinatorResult[Any]) -> Answers:
        """Carry out ``result`` with acks=all appends, each awaited until the ISR has it."""
        answers = Answers(result)
        steps = self._carry_out(result, answers)
        write = next(steps, None)
        while write is not None:
            write = _send(steps, await self._append_replicated(write))
        return answers

    def _carry_out(
        self, result: CoordinatorResult[Any], answers: Answers
    ) -> Generator[Write, AppendOutcome, None]:
        """Writes, then effects; what each leads to is carried out before its next sibling. Yields
        each write and takes its append's outcome back, so the local (:meth:`drive`) and the
        replicated (:meth:`drive_replicated`) drivers share one traversal."""
        for write in result.writes:
            nxt = write.complete((yield write))
            answers.add(nxt)
            yield from self._carry_out(nxt, answers)
        for effect in result.effects:
            if self._side_effect is None:
                raise TypeError(f"{self._name} runtime has no handler for {effect!r}")
            follow = self._side_effect(effect)
            if follow is not None:
                answers.add(follow)
                yield from self._carry_out(follow, answers)

    def _append(self, write: Write) -> AppendOutcome:
        try:
            base = self._to_topic(self._internal.append, write)
        except Exception as exc:
            return self._failed(write, exc)
        return AppendOutcome(now_ms=now_ms(), base_offset=base)

    async def _append_replicated(self, write: Write) -> AppendOutcome:
        try:
            base = await self._to_topic(self._internal.append_replicated, write)
        except Exception as exc:
            return self._failed(write, exc)
        return AppendOutcome(now_ms=now_ms(), base_offset=base)

    def _to_topic(self, append: Callable[..., R], write: Write) -> R:
        """``append`` (either of InternalTopics' appends) called with ``write``'s batch."""
        return append(
            self._topic,
            write.partition,
            write.records,
            producer_id=write.producer_id,
            producer_epoch=write.producer_epoch,
            transactional=write.transactional,
        )

    def _failed(self, write: Write, exc: Exception) -> AppendOutcome:
        if isinstance(exc, AppendFailed):
            self._log.warning(
                "append to %s-%d (%s) failed: %s (%s)",
                self._topic,
                write.partition,
                write.describe,
                exc.error_code.name,
                exc,
            )
            return AppendOutcome(now_ms=now_ms(), error=exc.error_code)
        self._log.error("unexpected error appending to %s-%d", self._topic, write.partition, exc_info=exc)
        return AppendOutcome(now_ms=now_ms(), error=ErrorCode.unknown_server_error)


def _send(steps: Generator[Write, AppendOutcome, None], outcome: AppendOutcome) -> Write | None:
    """The next write of a traversal given the last one's outcome; None once it is done."""
    try:
        return steps.send(outcome)
    except StopIteration:
        return None
