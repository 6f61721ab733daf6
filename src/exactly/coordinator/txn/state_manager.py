"""The coordinator's in-memory state and its plumbing (Kafka's ``TransactionStateManager``).

Holds the metadata map, loads it from ``__transaction_state`` by replay, turns transits into
prepared :class:`AppendTxnLog` records, tracks transactions whose markers are being written, and answers
the read-only admin APIs. The request logic on top of it is
:class:`~exactly.coordinator.txn.coordinator.TransactionCoordinator`, split off the way Kafka
splits TransactionCoordinator from TransactionStateManager; the runtime only ever uses the
coordinator.

Invariants
----------
* ``_txns`` changes only through replay, ``complete_transition`` after a persisted append,
  removal after a persisted tombstone, and removal of an id created by a request whose first
  append failed (it was never persisted).
* ``_completions`` holds exactly the transactions in ``Prepare*`` whose ``Complete*`` transit
  is prepared (their metadata has that pending state) and whose markers are being written.
* ``_in_flight`` holds, per id, the transit of the one append the runtime still has to report;
  a report whose transit is not that object (e.g. from before a reload) is stale and ignored.
* While loading, every request is answered COORDINATOR_LOAD_IN_PROGRESS and periodic tasks do
  nothing; replay may run at any time but is meant for loading.
* A request for an id of a partition outside the owned set (``_ownership``, the
  :class:`~exactly.coordinator.ownership.Ownership` the group coordinator shares: the partitions
  of the last load, None: all of them, the single broker) is answered NOT_COORDINATOR, checked
  when the request runs (:meth:`TransactionStateManager.owner_error`), never
  INVALID_PRODUCER_ID_MAPPING: an id missing from ``_txns`` means "never initialized" only for a
  partition this coordinator loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from exactly.coordinator.ownership import Ownership
from exactly.coordinator.txn import admin
from exactly.coordinator.txn.config import TxnCoordinatorConfig
from exactly.coordinator.txn.effects import (
    AppendPurpose,
    AppendTxnLog,
    DescribedTransaction,
    ListTransactionsResult,
    WriteMarkers,
)
from exactly.coordinator.txn.log import (
    CONSUMER_OFFSETS_TOPIC,
    encode_key,
    encode_transit,
    offsets_partition_for,
    partition_for,
    read_record,
    transit_from_value,
)
from exactly.coordinator.txn.metadata import TransactionMetadata, TxnTransitMetadata
from exactly.coordinator.txn.state import TransactionState
from exactly.records.control import ControlType
from exactly.types import ProducerId, TopicPartition

S = TransactionState
E = ErrorCode


@dataclass(frozen=True, slots=True)
class _Completion:
    """A decided transaction whose markers are being written; ``transit`` is its Complete*."""

    markers: WriteMarkers
    transit: TxnTransitMetadata


class TransactionStateManager:
    """State, loading, persistence plumbing and admin views; see the module docstring.

    Owns the metadata of every transactional.id, the one append in flight per id and the
    transactions whose markers are being written; all three are dropped by :meth:`begin_load`.

    ``generate_producer_id`` is the producer-id block allocator (called only when a new id is
    needed). ``coordinator_epoch`` goes into every marker; the runtime should raise it on each
    (re)load so that markers from an older incarnation can be told apart.
    """

    def __init__(
        self,
        generate_producer_id: Callable[[], ProducerId],
        *,
        config: TxnCoordinatorConfig | None = None,
        coordinator_epoch: int = 0,
    ) -> None:
        self._generate_producer_id = generate_producer_id
        self.config = config or TxnCoordinatorConfig()
        self.coordinator_epoch = coordinator_epoch
        self._txns: dict[str, TransactionMetadata] = {}
        self._completions: dict[str, _Completion] = {}
        # The transit of the one append in flight per id: a report for anything else is stale.
        self._in_flight: dict[str, TxnTransitMetadata] = {}
        # The __transaction_state partitions owned or loading (see the module docstring).
        self._ownership = Ownership()
        self.skipped_records = 0  # replayed records of unknown key/value versions

    # -- introspection ------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        """The ``__transaction_state`` partition of ``transactional_id``."""
        return partition_for(transactional_id, self.config.transaction_state_partitions)

    def offsets_partition_for(self, group_id: str) -> TopicPartition:
        """The ``__consumer_offsets`` partition AddOffsetsToTxn adds for ``group_id``."""
        return TopicPartition(
            CONSUMER_OFFSETS_TOPIC, offsets_partition_for(group_id, self.config.offsets_topic_partitions)
        )

    def transaction(self, transactional_id: str) -> TxnTransitMetadata | None:
        """An immutable snapshot of the id's current (persisted) state, or None."""
        md = self._txns.get(transactional_id)
        return None if md is None else md.snapshot()

    def pending_state(self, transactional_id: str) -> TransactionState | None:
        md = self._txns.get(transactional_id)
        return None if md is None else md.pending_state

    def transactional_ids(self) -> Iterator[str]:
        return iter(tuple(self._txns))

    @property
    def loading(self) -> bool:
        return self._ownership.loading

    @property
    def ownership(self) -> Ownership:
        """The partitions owned or loading (changed only by :meth:`begin_load` / :meth:`end_load`)."""
        return self._ownership

    def owner_error(self, transactional_id: str) -> ErrorCode | None:
        """Kafka's ``getTransactionState`` check, made when a request runs: LOAD_IN_PROGRESS
        while loading, NOT_COORDINATOR when the id's partition is not one this coordinator
        loaded, else None (go on; an id absent from the map is then really unknown).

        Why here and not only in the runtime: a cluster request checks ownership when it
        arrives, then waits for the operation lock; a reload that resigned the partition can
        run in between (the broker lost ``__transaction_state`` leadership while an append
        held the lock). The request must then meet NOT_COORDINATOR, which a client follows to
        the new coordinator, and not an empty map's INVALID_PRODUCER_ID_MAPPING, which
        librdkafka takes for a lost producer id (abortable with an epoch bump) and which
        Kafka never answers for a partition it does not own."""
        return self._ownership.owner_error(self.partition_for(transactional_id))

    # -- loading ------------------------------------------------------------------------------

    def begin_load(
        self, coordinator_epoch: int | None = None, partitions: Iterable[int] | None = None
    ) -> None:
        """Forget all state and answer COORDINATOR_LOAD_IN_PROGRESS until :meth:`end_load`.

        ``partitions``: the ``__transaction_state`` partitions this load replays (None: every
        one); requests for ids of other partitions get NOT_COORDINATOR once the load ended.
        Appends still in flight from before are ignored when reported (their ids are gone or
        have no matching pending state) and their requests answered NOT_COORDINATOR.
        """
        if coordinator_epoch is not None:
            self.coordinator_epoch = coordinator_epoch
        self._ownership = self._ownership.begin_load(partitions)
        self._forget()

    def resign(self) -> None:
        """Own nothing (Kafka's ``removeTransactionsForTxnTopicPartition``): forget all state;
        every request gets NOT_COORDINATOR, not COORDINATOR_LOAD_IN_PROGRESS (Kafka answers that
        only for a partition in ``loadingPartitions``; one it does not own has no cache entry:
        NOT_COORDINATOR, which sends the client to look the coordinator up again), until a
        :meth:`begin_load`. Appends still in flight are ignored when reported, as after a load."""
        self._ownership = self._ownership.resign()
        self._forget()

    def _forget(self) -> None:
        self._txns.clear()
        self._completions.clear()
        self._in_flight.clear()
        self.skipped_records = 0

    def replay(self, key: bytes, value: bytes | None, *, offset: int = -1, producer_id: int = -1) -> None:
        """Apply one ``__transaction_state`` record (offset order); a None value is a tombstone.

        ``offset`` and ``producer_id`` are part of the runtime's replay contract; the transaction
        log needs neither (its records are never transactional, and later records win).
        """
        record = read_record(key, value)
        if record is None:
            self.skipped_records += 1
            return
        tid = record.transactional_id
        self._completions.pop(tid, None)
        if record.value is None:
            self._txns.pop(tid, None)
        else:
            self._txns[tid] = TransactionMetadata.from_transit(tid, transit_from_value(record.value))

    def replay_end_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """Markers never land on ``__transaction_state``; nothing to apply."""

    def next_deadline(self) -> int | None:
        """No per-entity timers: timeouts and expiry run as periodic scans."""
        return None

    def end_load(self, now_ms: int) -> tuple[WriteMarkers, ...]:
        """Start serving; returns the markers to (re)write for transactions left in Prepare*."""
        self._ownership = self._ownership.complete_load()
        return self.pending_completions(now_ms)

    def pending_completions(self, now_ms: int) -> tuple[WriteMarkers, ...]:
        """Markers of every decided-but-incomplete (PrepareCommit/PrepareAbort) transaction.

        Idempotent: a transaction already being completed is listed with the same markers.
        """
        for md in self._txns.values():
            if (
                md.state.is_prepare
                and md.transactional_id not in self._completions
                and md.pending_state is None
            ):
                self._start_completion(md, now_ms)
        return tuple(c.markers for c in self._completions.values())

    def expirable_appends(self, now_ms: int, expiration_ms: int | None = None) -> tuple[AppendTxnLog, ...]:
        """Tombstones for ids idle (no open transaction) for ``expiration_ms`` (default 7 days).

        The entry is removed only when the tombstone append is reported done.
        """
        if self.loading:
            return ()
        ttl = self.config.transactional_id_expiration_ms if expiration_ms is None else expiration_ms
        return tuple(
            self._make_append(md, md.prepare_dead(), AppendPurpose.EXPIRE)
            for md in admin.expirable(self._txns.values(), now_ms, ttl)
        )

    # -- admin --------------------------------------------------------------------------------

    def describe_transactions(self, transactional_ids: Iterable[str]) -> tuple[DescribedTransaction, ...]:
        """DescribeTransactions (KIP-664) entries, one per requested id."""
        return tuple(self._describe(tid) for tid in transactional_ids)

    def _describe(self, transactional_id: str) -> DescribedTransaction:
        """Kafka's ``handleDescribeTransactions``: ``getTransactionState``'s error first
        (LOAD_IN_PROGRESS, or NOT_COORDINATOR for an id of a partition not owned, never
        TRANSACTIONAL_ID_NOT_FOUND from a map that cannot hold it), then the entry."""
        error = self.owner_error(transactional_id)
        if error is not None:
            return DescribedTransaction(error, transactional_id)
        return admin.describe(self._txns, transactional_id, loading=False)

    def list_transactions(
        self,
        *,
        now_ms: int,
        state_filters: Iterable[str] = (),
        producer_id_filters: Iterable[int] = (),
        duration_filter_ms: int = -1,
        transactional_id_pattern: str | None = None,
    ) -> ListTransactionsResult:
        """ListTransactions (KIP-664; duration filter KIP-994; id pattern KIP-1152)."""
        return admin.list_transactions(
            self._txns.values(),
            now_ms=now_ms,
            loading=self.loading,
            state_filters=state_filters,
            producer_id_filters=producer_id_filters,
            duration_filter_ms=duration_filter_ms,
            transactional_id_pattern=transactional_id_pattern,
        )

    # -- internals ----------------------------------------------------------------------------

    def _make_append(
        self,
        md: TransactionMetadata,
        transit: TxnTransitMetadata,
        purpose: AppendPurpose,
        request_version: int = -1,
        requested: tuple[TopicPartition, ...] = (),
    ) -> AppendTxnLog:
        tid = md.transactional_id
        self._in_flight[tid] = transit
        value = None if transit.state is S.DEAD else encode_transit(transit, self.config.log_value_version)
        return AppendTxnLog(
            transactional_id=tid,
            partition=self.partition_for(tid),
            key=encode_key(tid),
            value=value,
            transit=transit,
            purpose=purpose,
            coordinator_epoch=self.coordinator_epoch,
            request_version=request_version,
            requested_partitions=requested,
        )

    def _start_completion(self, md: TransactionMetadata, now_ms: int) -> WriteMarkers:
        """Prepare Complete* (held pending until persisted) and describe the markers to write."""
        transit = md.prepare_complete(now_ms)
        markers = WriteMarkers(
            transactional_id=md.transactional_id,
            producer_id=md.producer_id,
            producer_epoch=md.producer_epoch,
            coordinator_epoch=self.coordinator_epoch,
            result=ControlType.COMMIT if md.state is S.PREPARE_COMMIT else ControlType.ABORT,
            partitions=md.partitions,
        )
        self._completions[md.transactional_id] = _Completion(markers, transit)
        return markers
