"""The asyncio shell around the sans-IO GroupCoordinator.

CONTRACT SKELETON — being implemented. The broker calls exactly these:

* ``GroupRuntime(broker)`` at construction (no I/O).
* ``load()`` once at start-up, before the listener opens: replay ``__consumer_offsets`` (if it
  exists) through ``broker.internal.replay(OFFSETS_TOPIC)`` into the coordinator, then
  ``load_complete``.
* ``start_tasks()`` after the listener opens: returns the background tasks (the timer loop that
  calls ``coordinator.poll`` at ``next_deadline()``); the broker cancels them at shutdown.
* ``on_marker(partition, producer_id, commit)`` from the transaction marker writer right after a
  COMMIT/ABORT marker was appended to ``__consumer_offsets-<partition>``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exactly.server.broker import Broker


class GroupRuntime:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def load(self) -> None:
        pass

    def start_tasks(self) -> list[asyncio.Task[None]]:
        return []

    def on_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        pass
