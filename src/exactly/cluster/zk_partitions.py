"""The kazoo shell's partition-state part: reading and watching state znodes, the controller's
fenced state writes and a partition leader's conditional ISR write.

A state change is applied at the zkVersion its decision was computed against; BADVERSION means
the state moved meanwhile and the caller re-reads and decides again. A controller write is a multi
whose first operation checks ``/controller_epoch``'s version, so a deposed controller changes
nothing (:class:`~exactly.cluster.zk_base.ControllerMovedError`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError

from exactly.cluster import znodes as zn
from exactly.cluster.zk_base import (
    ControllerLease,
    ControllerMovedError,
    ObservedState,
    StateWriteResult,
    ZkClientHolder,
    first_failure,
)
from exactly.cluster.znodes import LeaderAndIsr, PartitionState
from exactly.controller.decisions import NEW_ZNODE, StateChange
from exactly.types import TopicPartition

log = logging.getLogger(__name__)


class ZkPartitionStates(ZkClientHolder):
    """Partition-state reads, watches and writes of :class:`~exactly.cluster.zk.ClusterZk`."""

    def partition_state(self, tp: TopicPartition) -> ObservedState | None:
        try:
            data, stat = self.client.get(zn.partition_state_path(tp.topic, tp.partition))
        except NoNodeError:
            return None
        what = f"{tp} state"
        return ObservedState(
            PartitionState(LeaderAndIsr.decode(data, what), int(stat.version)), int(stat.mzxid)
        )

    def watch_partition_state(
        self, tp: TopicPartition, callback: Callable[[ObservedState | None], bool | None]
    ) -> None:
        """``callback`` now and after every change of the state znode (None while it does not
        exist), on a kazoo thread. A one-shot watch re-armed by kazoo: changes in between may merge,
        which the role decisions tolerate because they compare epochs. The watch ends when the
        callback returns False (the topic was deleted and is no longer of interest)."""

        def on_change(data: bytes | None, stat: Any) -> bool | None:
            if data is None or stat is None:
                return callback(None)
            state = PartitionState(LeaderAndIsr.decode(data, f"{tp} state"), int(stat.version))
            return callback(ObservedState(state, int(stat.mzxid)))

        self.client.DataWatch(zn.partition_state_path(tp.topic, tp.partition), on_change)

    def write_partition_states(
        self, lease: ControllerLease, changes: Iterable[StateChange]
    ) -> list[StateWriteResult]:
        """Apply controller decisions, each in a multi fenced by ``/controller_epoch``'s version.
        Raises :class:`ControllerMovedError` at the first failed fence (nothing after it is tried)."""
        results: list[StateWriteResult] = []
        for change in changes:
            path = zn.partition_state_path(change.tp.topic, change.tp.partition)
            tx = self.client.transaction()
            tx.check(zn.CONTROLLER_EPOCH, lease.epoch_zk_version)
            if change.expected_zk_version == NEW_ZNODE:
                for parent in (
                    zn.partitions_path(change.tp.topic),
                    zn.partition_path(change.tp.topic, change.tp.partition),
                ):
                    if self.client.exists(parent) is None:
                        tx.create(parent, b"")  # (Kafka writes these with no data too)
                tx.create(path, change.new.encode())
            else:
                tx.set_data(path, change.new.encode(), version=change.expected_zk_version)
            outcome = tx.commit()
            if isinstance(outcome[0], BadVersionError | NoNodeError):
                raise ControllerMovedError(f"controller epoch {lease.epoch} is no longer current")
            if any(isinstance(r, Exception) for r in outcome):
                log.info(
                    "%s: %s not applied (%s), state changed meanwhile",
                    change.tp,
                    change.reason.value,
                    first_failure(outcome),
                )
                results.append(StateWriteResult(change, None))
                continue
            new_version = 0 if change.expected_zk_version == NEW_ZNODE else int(outcome[-1].version)
            results.append(StateWriteResult(change, new_version))
        return results

    def update_isr(self, tp: TopicPartition, new: LeaderAndIsr, expected_zk_version: int) -> int | None:
        """A partition leader's ISR write (Kafka's pre-AlterPartition path): conditional on the
        zkVersion it holds, no controller fence (the leader is not the controller). Returns the
        new zkVersion, or None on BADVERSION/NONODE: then the leader must not adopt the ISR."""
        path = zn.partition_state_path(tp.topic, tp.partition)
        try:
            stat = self.client.set(path, new.encode(), version=expected_zk_version)
        except (BadVersionError, NoNodeError):
            log.info("%s: cached zkVersion %d is stale, ISR change not adopted", tp, expected_zk_version)
            return None
        return int(stat.version)
