"""Keyed deadlines for a sans-IO coordinator (Kafka's ``CoordinatorTimer`` without threads).

The coordinator never sleeps: it schedules ``(key, deadline_ms, action)`` here, the runtime asks for
:meth:`DeadlineQueue.next_deadline` and calls the coordinator's ``poll(now_ms)`` at or after it, and
the coordinator pops due actions in deadline order. Scheduling an existing key replaces its deadline
(a heartbeat pushes its member's session timeout forward); cancelling is idempotent.

Implementation: a heap of ``(deadline, seq, key)`` with lazy deletion; ``_live`` maps a key to the
sequence number of its current entry so stale heap entries are skipped when popped.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable

TimerAction = Callable[[], None]


class DeadlineQueue:
    """Keyed one-shot timers ordered by deadline, then by scheduling order.

    Owns the pending timers (key -> deadline, action); owned by the coordinator's ``Operations``
    and lives as long as it does. A fired or cancelled timer is forgotten.
    """

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, int, TimerAction]] = {}
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int, action: TimerAction) -> None:
        seq = next(self._seq)
        self._live[key] = (deadline_ms, seq, action)
        heapq.heappush(self._heap, (deadline_ms, seq, key))

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def _prune(self) -> None:
        while self._heap:
            _, seq, key = self._heap[0]
            live = self._live.get(key)
            if live is not None and live[1] == seq:
                return
            heapq.heappop(self._heap)

    def next_deadline(self) -> int | None:
        self._prune()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> TimerAction | None:
        """Remove and return the earliest action due at ``now_ms``, or None."""
        self._prune()
        if not self._heap or self._heap[0][0] > now_ms:
            return None
        _, _, key = heapq.heappop(self._heap)
        _, _, action = self._live.pop(key)
        return action

    def __len__(self) -> int:
        return len(self._live)
