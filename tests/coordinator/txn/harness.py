"""A synchronous stand-in for the asyncio shell: executes effects at once, in memory.

``__transaction_state`` is a list of (partition, key, value) records; markers are recorded.
Append failures and held-back markers are injected per call, so tests can stop a flow at any
point and "crash" by building a new coordinator from the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Write
from exactly.coordinator.txn import (
    TransactionCoordinator,
    TxnCoordinatorConfig,
    TxnTransitMetadata,
    WriteMarkers,
)
from exactly.types import ProducerId, TopicPartition

E = ErrorCode
TIMEOUT_MS = 60_000
T0 = 1_700_000_000_000


class PidGen:
    """Producer id allocator double: sequential ids, counts calls."""

    def __init__(self, start: int = 1000) -> None:
        self.next_id = start
        self.calls = 0

    def __call__(self) -> ProducerId:
        self.calls += 1
        self.next_id += 1
        return ProducerId(self.next_id - 1)


def tp(topic: str, partition: int = 0) -> TopicPartition:
    return TopicPartition(topic, partition)


class Shell:
    def __init__(self, *, config: TxnCoordinatorConfig | None = None, now_ms: int = T0) -> None:
        self.pids = PidGen()
        self.config = config
        self.coord = TransactionCoordinator(self.pids, config=config)
        self.log: list[tuple[int, bytes, bytes | None]] = []
        self.markers: list[WriteMarkers] = []
        self.held_markers: list[WriteMarkers] = []
        self.now = now_ms
        self.append_errors: list[ErrorCode] = []  # consumed one per append; empty = success
        self.hold_markers = False
        self.appends = 0

    # -- effect execution ---------------------------------------------------------------------

    def run(self, result: CoordinatorResult[Any]) -> Any:
        """Execute every write and marker effect (and what they lead to); return the response."""
        response = result.response
        pending: list[CoordinatorResult[Any]] = [result]
        while pending:
            current = pending.pop(0)
            if current.response is not None:
                response = current.response
            for write in current.writes:
                pending.append(self.complete_write(write))
            for effect in current.effects:
                assert isinstance(effect, WriteMarkers)
                self.markers.append(effect)
                if self.hold_markers:
                    self.held_markers.append(effect)
                    continue
                pending.append(
                    self.coord.on_markers_written(
                        effect.transactional_id, effect.producer_id, effect.producer_epoch, effect.result
                    )
                )
        return response

    def complete_write(self, write: Write) -> CoordinatorResult[Any]:
        self.appends += 1
        error = self.append_errors.pop(0) if self.append_errors else E.none
        if error == E.none:
            ((key, value),) = write.records
            self.log.append((write.partition, key, value))
        return write.complete(AppendOutcome(now_ms=self.now, error=error))

    def txn(self, tid: str) -> TxnTransitMetadata:
        """The id's current state; the id must exist."""
        txn = self.coord.transaction(tid)
        assert txn is not None, f"{tid} unknown"
        return txn

    def release_markers(self) -> None:
        held, self.held_markers = self.held_markers, []
        self.hold_markers = False
        for m in held:
            self.run(
                self.coord.on_markers_written(m.transactional_id, m.producer_id, m.producer_epoch, m.result)
            )

    # -- requests -----------------------------------------------------------------------------

    def init(self, tid: str | None, timeout_ms: int = TIMEOUT_MS, **kw: Any) -> Any:
        return self.run(self.coord.init_producer_id(tid, timeout_ms, now_ms=self.now, **kw))

    def add(self, tid: str, pid: int, epoch: int, *partitions: TopicPartition, **kw: Any) -> Any:
        return self.run(self.coord.add_partitions_to_txn(tid, pid, epoch, partitions, now_ms=self.now, **kw))

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str, **kw: Any) -> Any:
        return self.run(self.coord.add_offsets_to_txn(tid, pid, epoch, group, now_ms=self.now, **kw))

    def end(self, tid: str, pid: int, epoch: int, commit: bool, **kw: Any) -> Any:
        return self.run(self.coord.end_txn(tid, pid, epoch, commit, now_ms=self.now, **kw))

    # -- crash / restart ----------------------------------------------------------------------

    def restart(self, *, keep: int | None = None, coordinator_epoch: int = 1) -> Sequence[WriteMarkers]:
        """A new coordinator replaying the first ``keep`` log records; returns pending markers."""
        if keep is not None:
            del self.log[keep:]
        self.coord = TransactionCoordinator(self.pids, config=self.config)
        self.coord.begin_load(coordinator_epoch)
        for _partition, key, value in self.log:
            self.coord.replay(key, value)
        return self.coord.end_load(self.now)
