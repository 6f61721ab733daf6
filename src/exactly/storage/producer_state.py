"""Per-partition producer state: idempotence and transaction bookkeeping (Kafka's
ProducerStateManager, ProducerAppendInfo, ProducerStateEntry).

CONTRACT STUB — the public API below is fixed; the implementation is being written.

Theory of operation
-------------------
For every producer id that wrote to this partition the manager keeps the epoch, the metadata of
the last 5 batches (first/last sequence, last offset, timestamp), the coordinator epoch and the
first offset of its ongoing transaction, if any.

Appends follow prepare -> persist -> complete:
  1. ``prepare_append(header, origin, now_ms)`` validates one batch whose offsets are already
     assigned and returns either ``DuplicateBatch`` (ack with the original offsets, write nothing)
     or a ``ProducerAppendInfo`` (staged, not yet visible). Raises ``ProducerStateError`` with
     OUT_OF_ORDER_SEQUENCE_NUMBER (45), INVALID_PRODUCER_EPOCH (47), INVALID_TXN_STATE (48) ...
  2. The log appends the bytes.
  3. ``complete_append(info)`` applies the staged change; ``update_map_end_offset(next_offset)``.
     For a control batch the result is a ``CompletedTxn`` the log turns into a transaction-index
     entry (aborted ones) and an LSO move.

Recovery = newest valid snapshot at or below the recovery point + ``replay`` of the log tail.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from exactly.records.batch import BatchHeader
from exactly.records.control import ControlType

NUM_BATCHES_TO_RETAIN = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000


class AppendOrigin(enum.Enum):
    CLIENT = "client"  # Produce requests: full validation
    COORDINATOR = "coordinator"  # transaction markers written by the txn coordinator
    REPLICATION = "replication"  # log replay at recovery / follower fetch: no validation errors


class ProducerStateError(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


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


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """A resend of one of the last 5 batches: ack it with its original offsets."""

    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the marker
    is_aborted: bool


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


@dataclass(frozen=True, slots=True)
class ProducerAppendInfo:
    """A staged change for one producer; applied by ``complete_append`` after the log write."""

    producer_id: int
    updated: ProducerStateEntry
    completed_txn: CompletedTxn | None
    started_txn_first_offset: int | None


class ProducerStateManager:
    def __init__(
        self,
        directory: Path,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        raise NotImplementedError

    # --- the append path -------------------------------------------------------------------
    def prepare_append(
        self,
        header: BatchHeader,
        *,
        origin: AppendOrigin,
        now_ms: int,
        control_type: ControlType | None = None,
    ) -> ProducerAppendInfo | DuplicateBatch:
        """Validate one batch (offsets already assigned). ``control_type`` is given for control
        batches. Raises ProducerStateError for CLIENT/COORDINATOR origins; REPLICATION never raises
        on sequence/epoch (the log is the truth)."""
        raise NotImplementedError

    def complete_append(self, info: ProducerAppendInfo) -> CompletedTxn | None:
        raise NotImplementedError

    def update_map_end_offset(self, offset: int) -> None:
        raise NotImplementedError

    @property
    def map_end_offset(self) -> int:
        raise NotImplementedError

    # --- transactions / LSO -----------------------------------------------------------------
    def first_unstable_offset(self) -> int | None:
        """Smallest first offset among ongoing transactions (None when none is open)."""
        raise NotImplementedError

    def ongoing_transactions(self) -> dict[int, int]:
        """producer id -> first offset of its open transaction."""
        raise NotImplementedError

    # --- introspection ---------------------------------------------------------------------
    def active_producers(self) -> dict[int, ProducerStateEntry]:
        raise NotImplementedError

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        raise NotImplementedError

    def remove_expired_producers(self, now_ms: int) -> int:
        """Forget producers idle longer than producer.id.expiration.ms that have no open
        transaction. Returns how many were removed."""
        raise NotImplementedError

    # --- snapshots and recovery ------------------------------------------------------------
    def take_snapshot(self) -> Path | None:
        """Write ``<map_end_offset:020d>.snapshot`` (CRC32C-checked) atomically."""
        raise NotImplementedError

    def load(self, *, log_start_offset: int, recovery_point: int) -> int:
        """Load the newest valid snapshot with offset in [log_start_offset, recovery_point],
        skipping corrupt ones (deleting them). Returns the offset replay must start from
        (the snapshot offset, or log_start_offset when none is usable)."""
        raise NotImplementedError

    def replay(self, header: BatchHeader, control_type: ControlType | None = None) -> CompletedTxn | None:
        """Apply a batch read back from the log during recovery (origin REPLICATION)."""
        raise NotImplementedError

    def truncate_and_reload(self, *, log_start_offset: int, log_end_offset: int) -> None:
        """Drop state and snapshots above log_end_offset / below log_start_offset."""
        raise NotImplementedError

    def delete_snapshots_before(self, offset: int) -> None:
        raise NotImplementedError

    def latest_snapshot_offset(self) -> int | None:
        raise NotImplementedError
