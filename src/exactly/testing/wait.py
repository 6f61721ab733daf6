"""Waiting for a condition instead of sleeping for a guessed time.

``wait_until(cond, timeout, what)`` (``wait_until_async`` on an event loop) calls ``cond()`` until it returns something truthy and returns
that value; if the deadline passes first it raises :class:`WaitTimeout` (an ``AssertionError``,
so a test reports it as a failed expectation) naming ``what`` and, when given, the last value
``describe()`` reports, so the failure says what state things were in rather than just "timeout".

The condition is always evaluated once more after the deadline: a slow machine that gets the
condition true just as time runs out does not fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import TypeVar

__all__ = ["WaitTimeout", "next_millisecond", "wait_until", "wait_until_async"]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not become true in time."""


def _polls(
    cond: Callable[[], T], timeout: float, what: str, describe: Callable[[], object] | None
) -> Generator[None, None, T]:
    """The one polling rule both waits follow: evaluate ``cond``, return its truthy value, else
    yield (the caller sleeps its interval, blocking or on the loop) until the deadline, then
    evaluate once more and raise :class:`WaitTimeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            value = cond()
            if value:
                return value
            detail = f"; last state: {describe()}" if describe is not None else ""
            raise WaitTimeout(f"{what}: not reached within {timeout}s{detail}")
        yield


def wait_until(
    cond: Callable[[], T],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll ``cond()`` every ``interval`` seconds until it is truthy; return its value.

    Raises :class:`WaitTimeout` after ``timeout`` seconds, with ``what`` (and ``describe()``'s
    value, if given) in the message.
    """
    polls = _polls(cond, timeout, what, describe)
    while True:
        try:
            next(polls)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        time.sleep(interval)


async def wait_until_async(
    cond: Callable[[], T],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> T:
    """:func:`wait_until` for code on an event loop: the loop keeps running between the polls."""
    polls = _polls(cond, timeout, what, describe)
    while True:
        try:
            next(polls)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(interval)


def next_millisecond() -> int:
    """Wait for the wall clock to enter a later millisecond than now; return that (epoch ms).

    For a test that needs a timestamp strictly later than every one taken before the call (record
    timestamps are epoch milliseconds, so two taken within one millisecond are equal)."""
    now = time.time_ns() // 1_000_000
    return wait_until(
        lambda: (later := time.time_ns() // 1_000_000) > now and later,
        1.0,
        "the wall clock's next millisecond",
        interval=0.0005,
    )
