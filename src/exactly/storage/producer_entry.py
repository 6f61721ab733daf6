"""One producer's state in one partition, as an immutable value (Kafka's ProducerStateEntry and
BatchMetadata).

Why a module of its own: both the producer-state manager (which stages and applies new entries)
and the snapshot codec (which writes and reads them) need the value, while the manager also uses
the codec's files. With the value here, ``producer_state`` imports ``producer_snapshot`` and
``producer_snapshot`` imports only this module: no import circle.

Invariants
----------
* ``batches`` is oldest first and holds at most ``NUM_BATCHES_TO_RETAIN`` entries: the most
  batches an idempotent producer keeps in flight per partition
  (max.in.flight.requests.per.connection <= 5), so any retry it can send is one of them.
* An entry is never mutated; the manager replaces it whole when a batch is applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactly.frozen import quick_init

NUM_BATCHES_TO_RETAIN = 5


@quick_init
@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@quick_init
@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """Immutable snapshot of one producer's state (used by DescribeProducers and snapshots)."""

    producer_id: int
    producer_epoch: int
    batches: tuple[BatchMetadata, ...]  # oldest first, at most NUM_BATCHES_TO_RETAIN
    coordinator_epoch: int
    last_timestamp: int
    current_txn_first_offset: int | None

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1


__all__ = ["NUM_BATCHES_TO_RETAIN", "BatchMetadata", "ProducerStateEntry"]
