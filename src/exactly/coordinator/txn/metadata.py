"""Per-transactional.id metadata, and the immutable transit that changes it.

Prepare -> persist -> complete (Kafka's ``TxnTransitMetadata`` / ``completeTransitionTo``):

1. ``prepare_*`` validates the change against the transition table, builds an immutable
   :class:`TxnTransitMetadata` (the *whole* next state, which is exactly what gets written to
   ``__transaction_state``) and records the target in ``pending_state``. Nothing else changes.
2. The runtime appends the transit to the log.
3. Only when the append succeeded does :meth:`TransactionMetadata.complete_transition` copy the
   transit in; when it failed, :meth:`TransactionMetadata.abort_pending` clears ``pending_state``
   and the metadata is exactly what it was before step 1.

While ``pending_state`` is set, no other transition may be prepared: the coordinator answers
CONCURRENT_TRANSACTIONS instead. That is what serializes a transactional.id across requests that
interleave while an append is in flight.

Divergence from Kafka, on purpose: Kafka's epoch fence writes the bumped epoch into the in-memory
metadata *before* the append and keeps a ``hasFailedEpochFence`` flag to avoid bumping twice when
the append fails. Here the fence is just another transit (``epoch_fence=True``), so a failed fence
leaves the metadata untouched and the next attempt bumps from the same epoch; the bumped epoch was
never handed to anyone nor written in a marker, so reusing it is safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from exactly.coordinator.txn.state import TransactionState, check_transition
from exactly.frozen import quick_init
from exactly.types import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    ProducerEpoch,
    ProducerId,
    TopicPartition,
)

S = TransactionState

#: KIP-939: the transaction timeout stored for a two-phase-commit producer. Kafka marks a 2PC
#: transaction by this value in the already-persisted ``TransactionTimeoutMs`` (no new log field),
#: so the mark survives a coordinator failover and the replay of any log format.
TWO_PHASE_COMMIT_TIMEOUT_MS = 2**31 - 1


def is_two_phase_commit_timeout(txn_timeout_ms: int) -> bool:
    return txn_timeout_ms == TWO_PHASE_COMMIT_TIMEOUT_MS


class ProducerFencedError(Exception):
    """The request's epoch is neither the current one nor a retry of the last bump."""


class IllegalTransitionStateError(RuntimeError):
    """A transit that does not fit the metadata it completes: always a coordinator bug."""


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps one epoch in reserve: at ``MAX - 1`` the coordinator can still fence once more.

    A client is never given ``MAX_PRODUCER_EPOCH``; reaching ``MAX - 1`` means the next
    InitProducerId hands out a new producer id with epoch 0 instead of bumping.
    """
    return epoch >= MAX_PRODUCER_EPOCH - 1


@quick_init
@dataclass(frozen=True, slots=True)
class TxnTransitMetadata:
    """The complete next state of one transactional.id, as it will be persisted.

    Immutable so that what was appended is exactly what gets applied. ``last_producer_epoch`` and
    ``epoch_fence`` are in-memory only (Kafka does not persist the former either).
    """

    producer_id: ProducerId
    prev_producer_id: ProducerId
    next_producer_id: ProducerId
    producer_epoch: ProducerEpoch
    last_producer_epoch: ProducerEpoch
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int
    client_transaction_version: int = 0
    epoch_fence: bool = False


@dataclass(slots=True)
class TransactionMetadata:
    """Coordinator state for one transactional.id (Kafka's ``TransactionMetadata``).

    Mutated only by ``prepare_*`` (which set ``pending_state`` and nothing else),
    :meth:`complete_transition` and :meth:`abort_pending`.

    ``txn_start_timestamp`` is -1 outside a transaction; ``producer_epoch`` is -1 only for a
    freshly created id that never completed an InitProducerId. Lifecycle: created by a first
    InitProducerId or by replay of its record; removed when its expiry tombstone is durable (or
    when the creating request's first append failed).
    """

    transactional_id: str
    producer_id: ProducerId
    prev_producer_id: ProducerId
    next_producer_id: ProducerId
    producer_epoch: ProducerEpoch
    last_producer_epoch: ProducerEpoch
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int
    client_transaction_version: int = 0
    pending_state: TransactionState | None = None

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def new(
        cls, transactional_id: str, producer_id: ProducerId, txn_timeout_ms: int, now_ms: int
    ) -> TransactionMetadata:
        """A brand-new id: ``Empty`` with epoch -1, so the first InitProducerId bumps it to 0."""
        return cls(
            transactional_id=transactional_id,
            producer_id=producer_id,
            prev_producer_id=NO_PRODUCER_ID,
            next_producer_id=NO_PRODUCER_ID,
            producer_epoch=NO_PRODUCER_EPOCH,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            txn_timeout_ms=txn_timeout_ms,
            state=S.EMPTY,
            partitions=frozenset(),
            txn_start_timestamp=-1,
            txn_last_update_timestamp=now_ms,
        )

    @classmethod
    def from_transit(cls, transactional_id: str, transit: TxnTransitMetadata) -> TransactionMetadata:
        """Metadata as loaded from ``__transaction_state`` (no pending state)."""
        return cls(
            transactional_id=transactional_id,
            producer_id=transit.producer_id,
            prev_producer_id=transit.prev_producer_id,
            next_producer_id=transit.next_producer_id,
            producer_epoch=transit.producer_epoch,
            last_producer_epoch=transit.last_producer_epoch,
            txn_timeout_ms=transit.txn_timeout_ms,
            state=transit.state,
            partitions=transit.partitions,
            txn_start_timestamp=transit.txn_start_timestamp,
            txn_last_update_timestamp=transit.txn_last_update_timestamp,
            client_transaction_version=transit.client_transaction_version,
        )

    # -- queries ------------------------------------------------------------------------------

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def is_two_phase_commit(self) -> bool:
        """KIP-939: the producer enabled 2PC; its transactions are never aborted on a timeout."""
        return is_two_phase_commit_timeout(self.txn_timeout_ms)

    def snapshot(self) -> TxnTransitMetadata:
        """The current state as a transit, without preparing anything (Kafka's prepareNoTransit)."""
        return TxnTransitMetadata(
            producer_id=self.producer_id,
            prev_producer_id=self.prev_producer_id,
            next_producer_id=self.next_producer_id,
            producer_epoch=self.producer_epoch,
            last_producer_epoch=self.last_producer_epoch,
            txn_timeout_ms=self.txn_timeout_ms,
            state=self.state,
            partitions=self.partitions,
            txn_start_timestamp=self.txn_start_timestamp,
            txn_last_update_timestamp=self.txn_last_update_timestamp,
            client_transaction_version=self.client_transaction_version,
        )

    # -- prepare ------------------------------------------------------------------------------

    def prepare_init_producer_id(
        self,
        txn_timeout_ms: int,
        expected_epoch: ProducerEpoch | None,
        now_ms: int,
        generate_producer_id: Callable[[], ProducerId],
    ) -> TxnTransitMetadata:
        """InitProducerId between transactions: bump the epoch, or rotate to a new producer id.

        The producer id rotates when the epoch is exhausted and the request is not a stale retry
        (KIP-360: ``expected_epoch`` is the epoch the producer still holds, None for a fresh
        producer). ``generate_producer_id`` is only called when a new id is really needed.
        """
        if self.is_producer_epoch_exhausted and (
            expected_epoch is None or expected_epoch == self.producer_epoch
        ):
            return self.prepare_producer_id_rotation(
                generate_producer_id(), txn_timeout_ms, now_ms, record_last_epoch=expected_epoch is not None
            )
        return self.prepare_increment_producer_epoch(txn_timeout_ms, expected_epoch, now_ms)

    def prepare_increment_producer_epoch(
        self, txn_timeout_ms: int, expected_epoch: ProducerEpoch | None, now_ms: int
    ) -> TxnTransitMetadata:
        """Epoch + 1 (-> ``Empty``), honouring KIP-360's expected epoch.

        * no expected epoch: a new producer instance; bump and forget the last epoch.
        * expected == current (or no epoch yet): the producer recovers after an error; bump and
          remember the epoch it held, so a retry of this very call can be recognised.
        * expected == last epoch: a retry of a bump that succeeded; return the current epoch.
        * anything else: the caller is a fenced zombie -> :class:`ProducerFencedError`.
        """
        if expected_epoch is None:
            epoch, last_epoch = self._bumped_client_epoch(), NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = self._bumped_client_epoch(), self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            raise ProducerFencedError(
                f"{self.transactional_id}: expected epoch {expected_epoch} is neither the current "
                f"epoch {self.producer_epoch} nor the last epoch {self.last_producer_epoch}"
            )
        return self._prepare(
            S.EMPTY,
            producer_epoch=epoch,
            last_producer_epoch=last_epoch,
            txn_timeout_ms=txn_timeout_ms,
            partitions=frozenset(),
            txn_start_timestamp=-1,
            txn_last_update_timestamp=now_ms,
        )

    def prepare_producer_id_rotation(
        self, new_producer_id: ProducerId, txn_timeout_ms: int, now_ms: int, *, record_last_epoch: bool
    ) -> TxnTransitMetadata:
        """A new producer id with epoch 0 (-> ``Empty``) once the epochs of the old id run out."""
        if self.state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransitionStateError("cannot rotate the producer id while a transaction is open")
        return self._prepare(
            S.EMPTY,
            producer_id=new_producer_id,
            producer_epoch=ProducerEpoch(0),
            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            txn_timeout_ms=txn_timeout_ms,
            partitions=frozenset(),
            txn_start_timestamp=-1,
            txn_last_update_timestamp=now_ms,
        )

    def prepare_add_partitions(self, added: Iterable[TopicPartition], now_ms: int) -> TxnTransitMetadata:
        """-> ``Ongoing`` with the union of partitions; the first add stamps the start time."""
        starting = self.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
        return self._prepare(
            S.ONGOING,
            partitions=self.partitions | frozenset(added),
            txn_start_timestamp=now_ms if starting else self.txn_start_timestamp,
            txn_last_update_timestamp=now_ms,
        )

    def prepare_abort_or_commit(self, target: TransactionState, now_ms: int) -> TxnTransitMetadata:
        """EndTxn: ``Ongoing`` -> ``PrepareCommit`` / ``PrepareAbort``, same producer id and epoch."""
        if target not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise ValueError(f"not a prepare state: {target}")
        return self._prepare(target, txn_last_update_timestamp=now_ms)

    def prepare_fence_and_abort(self, now_ms: int) -> TxnTransitMetadata:
        """``Ongoing`` -> ``PrepareEpochFence`` -> ``PrepareAbort`` with epoch + 1, in one transit.

        Used when a new producer instance calls InitProducerId, or the transaction timed out: the
        abort markers carry the bumped epoch, which fences the old instance on every partition,
        and its next EndTxn/AddPartitions gets PRODUCER_FENCED. ``last_producer_epoch`` is
        cleared so the old instance cannot pass as a KIP-360 retry. At ``MAX_PRODUCER_EPOCH`` the
        epoch is kept (Kafka does the same; it "must not happen unless there is a bug").
        """
        check_transition(self.state, S.PREPARE_EPOCH_FENCE)
        self._check_no_pending(S.PREPARE_EPOCH_FENCE)
        bumped = self.producer_epoch if self.producer_epoch >= MAX_PRODUCER_EPOCH else self._bumped_epoch()
        check_transition(S.PREPARE_EPOCH_FENCE, S.PREPARE_ABORT)
        return self._prepare(
            S.PREPARE_ABORT,
            from_state=S.PREPARE_EPOCH_FENCE,
            producer_epoch=bumped,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            txn_last_update_timestamp=now_ms,
            epoch_fence=True,
        )

    def prepare_keep_prepared(self, txn_timeout_ms: int, now_ms: int) -> TxnTransitMetadata:
        """KIP-939 ``keep_prepared_txn``: ``Ongoing`` -> ``Ongoing`` with epoch + 1, same partitions.

        The new holder of the transactional.id takes over the open (prepared) transaction: the
        bump fences the producer that wrote it, and the holder ends the transaction with EndTxn
        under the new epoch. ``last_producer_epoch`` keeps the epoch the transaction was written
        with (the InitProducerId response reports it as ``ongoing_txn_producer_epoch``).
        Written as an ``epoch_fence`` transit, which :meth:`complete_transition` accepts on an
        Ongoing -> Ongoing step only with exactly one bump and unchanged partitions.
        """
        if self.state is not S.ONGOING:
            raise IllegalTransitionStateError(f"{self.transactional_id}: no open transaction to keep")
        return self._prepare(
            S.ONGOING,
            producer_epoch=self._bumped_client_epoch(),
            last_producer_epoch=self.producer_epoch,
            txn_timeout_ms=txn_timeout_ms,
            txn_last_update_timestamp=now_ms,
            epoch_fence=True,
        )

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        """``PrepareCommit`` -> ``CompleteCommit`` (or Abort) once every marker is written."""
        if not self.state.is_prepare:
            raise IllegalTransitionStateError(f"{self.transactional_id}: cannot complete from {self.state}")
        target = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self._prepare(target, partitions=frozenset(), txn_last_update_timestamp=now_ms)

    def prepare_dead(self) -> TxnTransitMetadata:
        """Expiry of an idle id; the transit is written as a tombstone, never as a value."""
        return self._prepare(S.DEAD, partitions=frozenset())

    # -- complete / abort ---------------------------------------------------------------------

    def complete_transition(self, transit: TxnTransitMetadata) -> None:
        """Apply ``transit`` after its append succeeded; check it matches what was prepared."""
        target = self.pending_state
        if target is None:
            raise IllegalTransitionStateError(f"{self.transactional_id}: no pending transition to complete")
        if target is not transit.state:
            self._fail(transit)
        if target is S.EMPTY:
            if (
                (transit.producer_epoch != self.producer_epoch and not self._valid_epoch_bump(transit))
                or transit.partitions
                or transit.txn_start_timestamp != -1
            ):
                self._fail(transit)
        elif target is S.ONGOING:
            kept = (  # keep_prepared_txn: one bump, same transaction (its timeout may become 2PC)
                transit.epoch_fence
                and self.state is S.ONGOING
                and transit.producer_id == self.producer_id
                and transit.producer_epoch == self.producer_epoch + 1
                and transit.partitions == self.partitions
                and transit.txn_start_timestamp == self.txn_start_timestamp
            )
            if not kept and (
                not self._same_producer(transit)
                or not transit.partitions >= self.partitions
                or transit.txn_timeout_ms != self.txn_timeout_ms
            ):
                self._fail(transit)
        elif target in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            fenced_ok = (
                transit.epoch_fence
                and transit.producer_id == self.producer_id
                and transit.producer_epoch in (self.producer_epoch + 1, MAX_PRODUCER_EPOCH)
            )
            if (
                not (self._same_producer(transit) or fenced_ok)
                or transit.partitions != self.partitions
                or transit.txn_timeout_ms != self.txn_timeout_ms
                or transit.txn_start_timestamp != self.txn_start_timestamp
            ):
                self._fail(transit)
        elif target in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            if (
                not self._same_producer(transit)
                or transit.txn_timeout_ms != self.txn_timeout_ms
                or transit.txn_start_timestamp == -1
            ):
                self._fail(transit)
        else:
            # PrepareEpochFence is folded into the abort transit; Dead ends in removal, not here.
            self._fail(transit)

        self.producer_id = transit.producer_id
        self.prev_producer_id = transit.prev_producer_id
        self.next_producer_id = transit.next_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.txn_timeout_ms = transit.txn_timeout_ms
        self.state = transit.state
        self.partitions = transit.partitions
        self.txn_start_timestamp = transit.txn_start_timestamp
        self.txn_last_update_timestamp = transit.txn_last_update_timestamp
        self.client_transaction_version = transit.client_transaction_version
        self.pending_state = None

    def abort_pending(self) -> None:
        """The append failed: forget the prepared transition; nothing else ever changed."""
        self.pending_state = None

    # -- internals ----------------------------------------------------------------------------

    def _bumped_epoch(self) -> ProducerEpoch:
        if self.producer_epoch >= MAX_PRODUCER_EPOCH:
            raise IllegalTransitionStateError(f"{self.transactional_id}: producer epoch overflow")
        return ProducerEpoch(self.producer_epoch + 1)

    def _bumped_client_epoch(self) -> ProducerEpoch:
        """Epoch + 1 for a client; an exhausted epoch must rotate the producer id instead."""
        if self.is_producer_epoch_exhausted:
            raise IllegalTransitionStateError(
                f"{self.transactional_id}: epochs of producer id {self.producer_id} are exhausted"
            )
        return self._bumped_epoch()

    def _same_producer(self, transit: TxnTransitMetadata) -> bool:
        return transit.producer_id == self.producer_id and transit.producer_epoch == self.producer_epoch

    def _valid_epoch_bump(self, transit: TxnTransitMetadata) -> bool:
        return transit.producer_epoch == self.producer_epoch + 1 or (
            transit.producer_epoch == 0 and transit.producer_id != self.producer_id
        )

    def _check_no_pending(self, target: TransactionState) -> None:
        if self.pending_state is not None:
            raise IllegalTransitionStateError(
                f"{self.transactional_id}: preparing {target} while {self.pending_state} is pending"
            )

    def _prepare(
        self,
        target: TransactionState,
        *,
        from_state: TransactionState | None = None,
        **changes: object,
    ) -> TxnTransitMetadata:
        """Build the transit (unchanged fields copied) and mark ``target`` as pending."""
        self._check_no_pending(target)
        check_transition(self.state if from_state is None else from_state, target)
        transit = replace(self.snapshot(), state=target, prev_producer_id=self.producer_id, **changes)  # type: ignore[arg-type]
        if transit.producer_id < 0:
            raise IllegalTransitionStateError(f"illegal producer id {transit.producer_id}")
        if target is not S.DEAD and transit.producer_epoch < 0:
            raise IllegalTransitionStateError(f"illegal producer epoch {transit.producer_epoch}")
        self.pending_state = target
        return transit

    def _fail(self, transit: TxnTransitMetadata) -> None:
        raise IllegalTransitionStateError(
            f"{self.transactional_id}: transit {transit} does not fit {self.state} "
            f"(pending {self.pending_state}); this is a coordinator bug"
        )
