"""ISR changes by a partition leader (Kafka's pre-AlterPartition path): the conditional write of
an ``IsrUpdate`` to the partition's state znode, and the isr-expiration timer that proposes shrinks.

The write is ``ClusterZk.update_isr`` at the zkVersion the leader holds, run in the default
executor; its outcome is applied on the loop: ``on_isr_committed`` adopts the new ISR (and may move
the HW, published if that ``LeaderPartition`` still leads), anything else is ``on_isr_failed``
and the leader keeps acting on the maximal ISR (see ``replication.leader``). A write lost with the
ZooKeeper session is expected (WARNING, no traceback); any other failure is logged with one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from exactly.cluster.zk import ClusterZk
from exactly.replication.leader import IsrUpdate, LeaderPartition
from exactly.server.clock import now_ms
from exactly.types import TopicPartition

log = logging.getLogger("exactly.replica_manager")

# A write refused because the session expired, was closed, or its connection is down: an expected
# outcome of a ZooKeeper outage (logged without a traceback); the leader keeps its committed ISR
# and proposes again once the session is back. Anything else is a bug and keeps its traceback.
SESSION_GONE = (SessionExpiredError, ConnectionLoss)


class IsrWriter:
    """Writes the ISR updates of the partitions this broker leads (``leaders``, the replica
    manager's live map) and shrinks lagging ones every ``replica.lag.time.max.ms / 2``."""

    def __init__(
        self,
        zk: ClusterZk,
        leaders: Mapping[TopicPartition, LeaderPartition],
        *,
        max_lag_ms: int,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        publish_high_watermark: Callable[[TopicPartition, LeaderPartition], None],
    ) -> None:
        self.zk = zk
        self.leaders = leaders
        self.max_lag_ms = max_lag_ms
        self._spawn = spawn
        self._publish_high_watermark = publish_high_watermark
        # Kafka's IsrShrinksPerSec / IsrExpandsPerSec as counts: ISR changes written here and
        # committed (read by the Prometheus collector, never by requests).
        self.shrinks = 0
        self.expands = 0

    def write(self, tp: TopicPartition, leader: LeaderPartition, update: IsrUpdate) -> None:
        """Conditional set in the executor; adopted on the loop only if it committed."""

        async def write() -> None:
            loop = asyncio.get_running_loop()
            try:
                version = await loop.run_in_executor(
                    None, self.zk.update_isr, tp, update.new, update.expected_zk_version
                )
            except SESSION_GONE as exc:  # expected: the shell registers again, the watches re-read
                log.warning("%s: ISR write not made, the ZooKeeper session is lost (%r)", tp, exc)
                version = None
            except Exception:
                log.exception("%s: ISR write failed", tp)
                version = None
            if version is None:
                leader.on_isr_failed(update)
                return
            log.info("%s: ISR now %s (zkVersion %d)", tp, list(update.isr), version)
            if len(update.isr) < len(update.maximal_isr):  # a shrink keeps the old ISR as maximal
                self.shrinks += 1
            else:
                self.expands += 1
            if leader.on_isr_committed(update, version, now_ms()) and self.leaders.get(tp) is leader:
                self._publish_high_watermark(tp, leader)

        self._spawn(write(), f"isr-{tp}")

    async def expiration_loop(self) -> None:
        """Kafka's isr-expiration task: every replica.lag.time.max.ms / 2, drop lagging followers."""
        while True:
            await asyncio.sleep(self.max_lag_ms / 2000)
            now = now_ms()
            for tp, leader in list(self.leaders.items()):
                update = leader.maybe_shrink_isr(now)
                if update is not None:
                    log.info("%s: shrinking ISR %s -> %s", tp, list(leader.isr), list(update.isr))
                    self.write(tp, leader, update)
