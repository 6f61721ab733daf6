"""Wrappers for the fast-path equivalence tests (``tests/server/test_*fast*.py``): each test runs
the same requests through two brokers, one whose fast path is wrapped in :class:`Counting` (so the
test can assert how many requests the fast path took rather than the generic path) and one whose
fast path is :class:`Off` (every request goes the generic way)."""

from __future__ import annotations

from typing import Any


class Counting:
    """Wraps a broker's fast path (``answer(...)`` returning None when it declines) and counts the
    requests it took."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.taken = 0

    def answer(self, *args: Any) -> Any:
        result = self.inner.answer(*args)
        self.taken += result is not None
        return result


class Off:
    """A fast path that declines everything."""

    taken = 0

    def answer(self, *args: Any) -> None:
        return None
