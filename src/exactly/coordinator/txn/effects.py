"""The transaction coordinator's prepared appends, its marker effect and its response fields.

The coordinator never performs I/O. Every operation returns a
:class:`~exactly.coordinator.result.CoordinatorResult` (the shape both coordinators share):

* its ``writes`` carry :class:`AppendTxnLog` records -- one ``__transaction_state`` record each,
  prepared with its transit; the write's completion is
  ``TransactionCoordinator.on_log_append_done(append, error)``, so the runtime needs no lookup
  state of its own;
* its ``effects`` carry :class:`WriteMarkers` -- write a COMMIT/ABORT control batch
  (``records.control``) for ``(producer_id, producer_epoch, coordinator_epoch)`` to every partition
  in ``partitions`` (retrying each until it succeeds), then call ``on_markers_written``.

All values are frozen: they may be logged, compared in tests or retried by the runtime without
aliasing coordinator state.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from exactly.coordinator.txn.log import TRANSACTION_STATE_TOPIC
from exactly.coordinator.txn.metadata import TxnTransitMetadata
from exactly.records.control import ControlType
from exactly.types import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, ProducerEpoch, ProducerId, TopicPartition


class AppendPurpose(enum.Enum):
    """Why a ``__transaction_state`` append was requested: selects the continuation."""

    INIT_PRODUCER_ID = "init_producer_id"  # Empty/Complete* -> Empty, answers InitProducerId
    FENCE = "fence"  # InitProducerId hit an Ongoing txn: fence + abort, answers CONCURRENT_TRANSACTIONS
    KEEP_PREPARED = "keep_prepared"  # KIP-939: Ongoing -> Ongoing with epoch + 1, txn kept open
    ADD_PARTITIONS = "add_partitions"  # -> Ongoing, answers AddPartitionsToTxn
    ADD_OFFSETS = "add_offsets"  # -> Ongoing, answers AddOffsetsToTxn
    END_TXN = "end_txn"  # Ongoing -> Prepare*, answers EndTxn and starts the markers
    TIMEOUT_ABORT = "timeout_abort"  # Ongoing -> PrepareAbort with epoch + 1, no client waiting
    COMPLETE = "complete"  # Prepare* -> Complete* after the markers, no client waiting
    EXPIRE = "expire"  # tombstone for an idle transactional.id, no client waiting


@dataclass(frozen=True, slots=True)
class AppendTxnLog:
    """Effect: append ``key``/``value`` (None = tombstone) to ``__transaction_state-<partition>``.

    Written acks=all, uncompressed; completed exactly once with ``on_log_append_done(this,
    error)`` (the :class:`~exactly.coordinator.result.Write`'s completion); until then the
    transactional.id is blocked.
    """

    transactional_id: str
    partition: int
    key: bytes
    value: bytes | None
    transit: TxnTransitMetadata
    purpose: AppendPurpose
    coordinator_epoch: int
    request_version: int = -1  # version of the request awaiting this append (error code mapping)
    requested_partitions: tuple[TopicPartition, ...] = ()  # AddPartitionsToTxn: the response lists them

    @property
    def topic(self) -> str:
        return TRANSACTION_STATE_TOPIC


@dataclass(frozen=True, slots=True)
class WriteMarkers:
    """Effect: write a ``result`` marker to every partition, then call ``on_markers_written``.

    The markers must carry exactly this producer id, epoch and coordinator epoch: the epoch is the
    one persisted in the Prepare* record (bumped when the abort fences a producer).
    """

    transactional_id: str
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    coordinator_epoch: int
    result: ControlType
    partitions: frozenset[TopicPartition]


Effect = AppendTxnLog | WriteMarkers


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    """``ongoing_txn_*`` (InitProducerId v6, KIP-939): the producer id and epoch under which the
    transaction kept open by ``keep_prepared_txn`` was written; -1 when none was kept."""

    error: ErrorCode
    producer_id: ProducerId = NO_PRODUCER_ID
    producer_epoch: ProducerEpoch = NO_PRODUCER_EPOCH
    ongoing_txn_producer_id: ProducerId = NO_PRODUCER_ID
    ongoing_txn_producer_epoch: ProducerEpoch = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class AddPartitionsResult:
    """Per-partition errors of one transaction (AddPartitionsToTxn v0-v3, or one v4+ entry)."""

    partition_errors: tuple[tuple[TopicPartition, ErrorCode], ...]

    @classmethod
    def uniform(cls, partitions: Iterable[TopicPartition], error: ErrorCode) -> AddPartitionsResult:
        return cls(tuple((tp, error) for tp in partitions))

    @property
    def error(self) -> ErrorCode:
        """The first error, or ``none`` when every partition succeeded."""
        return next((e for _, e in self.partition_errors if e != ErrorCode.none), ErrorCode.none)

    def as_dict(self) -> dict[TopicPartition, ErrorCode]:
        return dict(self.partition_errors)


@dataclass(frozen=True, slots=True)
class AddOffsetsResult:
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class EndTxnResult:
    error: ErrorCode
    producer_id: ProducerId = NO_PRODUCER_ID
    producer_epoch: ProducerEpoch = NO_PRODUCER_EPOCH


Response = InitProducerIdResult | AddPartitionsResult | AddOffsetsResult | EndTxnResult


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    """DescribeTransactions entry; partitions are those still without markers while Prepare*."""

    error: ErrorCode
    transactional_id: str
    state: str = ""
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = -1
    producer_id: ProducerId = NO_PRODUCER_ID
    producer_epoch: ProducerEpoch = NO_PRODUCER_EPOCH
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: ProducerId
    state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResult:
    error: ErrorCode
    unknown_state_filters: tuple[str, ...] = ()
    transactions: tuple[ListedTransaction, ...] = ()
