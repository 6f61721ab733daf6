"""PendingAnswer: resolved by a call that tells its listener at once; cancelling releases waiters."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest

from exactly.server.deferred_response import PendingAnswer


def test_then_resolves_within_the_call_and_cancel_reaches_the_source() -> None:
    source: PendingAnswer[int] = PendingAnswer()
    framed = source.then(lambda n: [n, n])
    heard: list[list[int]] = []
    framed.listen(lambda: heard.append(framed.result()))
    source.set_result(3)
    assert heard == [[3, 3]]
    source.set_result(4)  # once only
    assert framed.result() == [3, 3]

    other: PendingAnswer[int] = PendingAnswer()
    released: list[str] = []
    other.on_cancel(lambda: released.append("parked entry"))
    chained = other.then(str)
    assert chained.cancel() and released == ["parked entry"]
    other.set_result(1)  # a cancelled answer stays unresolved
    assert not other.done() and not chained.done()
    with pytest.raises(asyncio.InvalidStateError):
        chained.result()


def test_wait_awaits_the_call_and_cancelling_the_waiter_cancels_the_answer() -> None:
    async def scenario() -> tuple[int, list[str]]:
        answer: PendingAnswer[int] = PendingAnswer()
        waiter = asyncio.ensure_future(answer.wait())
        await asyncio.sleep(0)
        answer.set_result(7)
        value = await waiter
        dropped: PendingAnswer[int] = PendingAnswer()
        released: list[str] = []
        dropped.on_cancel(lambda: released.append("released"))
        task = asyncio.ensure_future(dropped.wait())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return value, released

    assert asyncio.run(scenario()) == (7, ["released"])


class _Conn:
    """Stands for the connection: keeps the answer and listens with a bound method (a cycle while pending)."""

    def __init__(self, answer: PendingAnswer[list[int]]) -> None:
        self.answer = answer
        self.written: list[list[int]] = []
        answer.listen(self.answered)

    def answered(self) -> None:
        self.written.append(self.answer.result())


def _cyclic_garbage_of(scenario: Callable[[], None]) -> int:
    """Answers and connections only the cyclic collector could free after ``scenario`` (collector
    off meanwhile). Only these are counted: the collector is process-wide, and another thread of
    the test process (a client's, a ZooKeeper session's) may leave cycles of its own meanwhile
    (a caught exception and its frames: 13 objects failed this test once in a full run)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects go to gc.garbage, to be told apart
    try:
        scenario()
        gc.collect()
        return sum(isinstance(o, (PendingAnswer, _Conn)) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_resolved_or_cancelled_answer_leaves_no_reference_cycle() -> None:
    """Resolving or cancelling drops the listener (often a closure over the answer itself):
    reference counting frees a chained answer and its connection once they are let go."""

    def resolved() -> None:
        source: PendingAnswer[int] = PendingAnswer()
        conn = _Conn(source.then(lambda n: [n]))
        source.set_result(5)
        assert conn.written == [[5]]

    def cancelled() -> None:
        source: PendingAnswer[int] = PendingAnswer()
        source.on_cancel(lambda: None)
        framed = source.then(lambda n: [n])
        _Conn(framed)
        assert framed.cancel()

    def listened_late() -> None:
        source: PendingAnswer[int] = PendingAnswer()
        source.set_result(1)
        conn = _Conn(source.then(lambda n: [n]))
        assert conn.written == [[1]]

    for scenario in (resolved, cancelled, listened_late):
        assert _cyclic_garbage_of(scenario) == 0, scenario.__name__
