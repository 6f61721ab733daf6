"""The asyncio shell around the sans-IO TransactionCoordinator.

CONTRACT SKELETON — being implemented (same shape as group_runtime: ``load()``,
``start_tasks()``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exactly.server.broker import Broker


class TxnRuntime:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def load(self) -> None:
        pass

    def start_tasks(self) -> list[asyncio.Task[None]]:
        return []
