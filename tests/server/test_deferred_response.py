"""PendingAnswer: resolved by a call that tells its listener at once; cancelling releases waiters."""

from __future__ import annotations

import asyncio

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
