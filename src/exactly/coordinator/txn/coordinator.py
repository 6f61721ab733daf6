"""The transaction coordinator: a sans-IO, replayable state machine.

Theory of operation
-------------------
The coordinator owns one :class:`TransactionMetadata` per transactional.id and performs no I/O.
Each request handler takes the parsed request fields plus ``now_ms`` and returns a
:class:`~exactly.coordinator.result.CoordinatorResult`: either a final response, or one
:class:`~exactly.coordinator.result.Write` of a prepared ``__transaction_state`` record whose
completion (:meth:`on_log_append_done`) applies it and returns the response -- and, once a
Prepare* record is durable, the :class:`WriteMarkers` effect. The runtime reports written markers
with :meth:`on_markers_written`, which returns the write of the ``Complete*`` record.

State changes only when a persist is reported done (prepare -> persist -> complete): a failed
append leaves the metadata exactly as it was. While an append or a marker round is in flight, the
id has a pending state and other requests get CONCURRENT_TRANSACTIONS, so interleaving requests
(the runtime drives appends on one event loop) never race.

Commit, end to end::

    init_producer_id   -> AppendTxnLog(Empty, epoch+1)      -> on_log_append_done -> (pid, epoch)
    add_partitions     -> AppendTxnLog(Ongoing, partitions) -> on_log_append_done -> OK
    end_txn(commit)    -> AppendTxnLog(PrepareCommit)       -> on_log_append_done -> OK + WriteMarkers
    markers written    -> on_markers_written -> AppendTxnLog(CompleteCommit) -> on_log_append_done

Recovery is replay: :meth:`begin_load`, :meth:`replay` every ``__transaction_state`` record in
offset order, then :meth:`load_complete` (:meth:`end_load`), whose effects are the markers of
every transaction that was decided (Prepare*) but not completed before the crash. Markers are
idempotent to re-write.

Fencing: the producer epoch is bumped by every InitProducerId, and by the abort of a transaction
that times out or that a new instance interrupts; the abort markers carry the bumped epoch, so a
zombie's EndTxn/AddPartitions gets PRODUCER_FENCED here and its produce INVALID_PRODUCER_EPOCH
on every partition of the aborted transaction.

Behaviour follows Kafka's TransactionCoordinator for transaction version 1 (client-side
AddPartitionsToTxn, no per-transaction epoch bump). State, loading, expiry and the admin views
live in :mod:`exactly.coordinator.txn.state_manager`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Never

from kio.schema.errors import ErrorCode

from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Write
from exactly.coordinator.txn import admin
from exactly.coordinator.txn.effects import (
    AddOffsetsResult,
    AddPartitionsResult,
    AppendPurpose,
    AppendTxnLog,
    EndTxnResult,
    InitProducerIdResult,
    Response,
)
from exactly.coordinator.txn.metadata import (
    TWO_PHASE_COMMIT_TIMEOUT_MS,
    IllegalTransitionStateError,
    ProducerFencedError,
    TransactionMetadata,
    TxnTransitMetadata,
    is_epoch_exhausted,
)
from exactly.coordinator.txn.responses import (
    ADD_OFFSETS_VERSION,
    ADD_PARTITIONS_VERSION,
    END_TXN_VERSION,
    INIT_PRODUCER_ID_VERSION,
    append_error_to_coordinator_error,
    compat_error,
    response_for_append,
)
from exactly.coordinator.txn.state import TransactionState
from exactly.coordinator.txn.state_manager import TransactionStateManager
from exactly.records.control import ControlType
from exactly.types import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, ProducerEpoch, TopicPartition

S = TransactionState
E = ErrorCode


class TransactionCoordinator(TransactionStateManager):
    """Kafka's transaction coordinator for every partition of ``__transaction_state``.

    Owns (through its :class:`TransactionStateManager` base) the metadata of every
    transactional.id, the appends in flight and the transactions whose markers are being written.
    Lifecycle: constructed empty -> :meth:`begin_load` / :meth:`replay` / :meth:`load_complete`
    (requests answered COORDINATOR_LOAD_IN_PROGRESS meanwhile) -> serving; a reload starts over
    with :meth:`begin_load` and a higher coordinator epoch, which makes every write still in
    flight stale. Construct with ``TransactionCoordinator(generate_producer_id, config=..., coordinator_epoch=...)``
    (see :class:`TransactionStateManager` for the state, loading and admin methods it inherits).
    """

    # -- InitProducerId -----------------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        *,
        now_ms: int,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        request_version: int = INIT_PRODUCER_ID_VERSION,
        enable_2pc: bool = False,
        keep_prepared_txn: bool = False,
    ) -> CoordinatorResult[InitProducerIdResult]:
        """Create or load the id, abort an open transaction, bump the epoch (or rotate the id).

        ``producer_id``/``producer_epoch`` are KIP-360's "I still hold this" fields (v3+).

        KIP-939 (v6): ``enable_2pc`` makes the id a two-phase-commit producer -- refused with
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless ``transaction.two.phase.commit.enable`` is
        set (as Kafka does: the client cannot tell a disabled broker from a missing permission);
        its timeout is stored as :data:`TWO_PHASE_COMMIT_TIMEOUT_MS` (the request's timeout is
        not checked), so its transactions are never timed out. ``keep_prepared_txn`` (only with
        ``enable_2pc``, else INVALID_REQUEST) keeps an open transaction instead of aborting it:
        the epoch is bumped (fencing the producer that wrote it) and the answer carries the
        transaction's producer id and epoch in ``ongoing_txn_*``; the caller then ends it with
        EndTxn under the new epoch. Deliberate differences: Kafka 4.1 still answers
        INVALID_REQUEST to every ``keep_prepared_txn`` (its recovery flow came later, and keeps
        only a transaction begun as 2PC, with a second producer identity under TV2); here the
        KIP's keep is implemented for TV1 (one identity, one bump), and any open transaction can
        be adopted (it becomes 2PC), because librdkafka cannot begin a 2PC transaction -- the
        Spark sink writes with librdkafka and adopts the transaction right after flushing it.
        The KIP allows ``keep_prepared_txn`` without ``enable_2pc``; that is refused here, since
        a kept transaction that the timeout may still abort cannot be decided later.
        """

        def fail(error: ErrorCode) -> CoordinatorResult[InitProducerIdResult]:
            error = compat_error(error, AppendPurpose.INIT_PRODUCER_ID, request_version)
            return CoordinatorResult(response=InitProducerIdResult(error))

        if transactional_id is None:  # idempotent producer: a fresh id, nothing to persist
            return CoordinatorResult(
                response=InitProducerIdResult(E.none, self._generate_producer_id(), ProducerEpoch(0))
            )
        if not transactional_id:
            return fail(E.invalid_request)
        if enable_2pc and not self.config.two_phase_commit_enable:
            return fail(E.transactional_id_authorization_failed)
        if keep_prepared_txn and not enable_2pc:
            return fail(E.invalid_request)
        if enable_2pc:
            transaction_timeout_ms = TWO_PHASE_COMMIT_TIMEOUT_MS
        elif not 0 < transaction_timeout_ms <= self.config.transaction_max_timeout_ms:
            return fail(E.invalid_transaction_timeout)
        if (owner := self.owner_error(transactional_id)) is not None:
            return fail(owner)
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            return fail(E.invalid_request)
        expected = None if producer_id == NO_PRODUCER_ID else (producer_id, ProducerEpoch(producer_epoch))

        md = self._txns.get(transactional_id)
        if md is None:
            md = TransactionMetadata.new(
                transactional_id, self._generate_producer_id(), transaction_timeout_ms, now_ms
            )
            self._txns[transactional_id] = md

        if md.pending_transition_in_progress:
            return fail(E.concurrent_transactions)
        if expected is not None and not self._is_valid_expected_producer(md, *expected):
            return fail(E.producer_fenced)
        if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return fail(E.concurrent_transactions)
        if md.state is S.ONGOING and keep_prepared_txn:
            if md.is_producer_epoch_exhausted:  # no epoch left to fence the writer with
                return fail(E.invalid_txn_state)
            transit = md.prepare_keep_prepared(transaction_timeout_ms, now_ms)
            return self._append(md, transit, AppendPurpose.KEEP_PREPARED, request_version)
        if md.state is S.ONGOING:
            # Abort the open transaction under a bumped epoch; the client retries after
            # CONCURRENT_TRANSACTIONS and then gets a second bump (or a new producer id).
            transit = md.prepare_fence_and_abort(now_ms)
            return self._append(md, transit, AppendPurpose.FENCE, request_version)
        if md.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            try:
                transit = md.prepare_init_producer_id(
                    transaction_timeout_ms,
                    None if expected is None else expected[1],
                    now_ms,
                    self._generate_producer_id,
                )
            except ProducerFencedError:
                return fail(E.producer_fenced)
            return self._append(md, transit, AppendPurpose.INIT_PRODUCER_ID, request_version)
        raise IllegalTransitionStateError(f"{transactional_id} is in {md.state}, which is never stored")

    @staticmethod
    def _is_valid_expected_producer(md: TransactionMetadata, producer_id: int, epoch: int) -> bool:
        """KIP-360: accept the caller's (id, epoch) if the id is new, current, or was just rotated."""
        return (
            md.producer_epoch == NO_PRODUCER_EPOCH
            or producer_id == md.producer_id
            or (producer_id == md.prev_producer_id and is_epoch_exhausted(epoch))
        )

    # -- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------------

    def add_partitions_to_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        *,
        now_ms: int,
        request_version: int = ADD_PARTITIONS_VERSION,
    ) -> CoordinatorResult[AddPartitionsResult]:
        """Add partitions to the transaction (starting it if needed) before the client writes."""
        requested = tuple(dict.fromkeys(partitions))
        error, md = self._check_add(transactional_id, producer_id, producer_epoch)
        if error is None and md is not None:
            if md.state is S.ONGOING and set(requested) <= md.partitions:
                error = E.none  # already in the transaction: nothing to persist
            else:
                transit = md.prepare_add_partitions(requested, now_ms)
                return self._append(md, transit, AppendPurpose.ADD_PARTITIONS, request_version, requested)
        assert error is not None
        error = compat_error(error, AppendPurpose.ADD_PARTITIONS, request_version)
        return CoordinatorResult(response=AddPartitionsResult.uniform(requested, error))

    def add_offsets_to_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        *,
        now_ms: int,
        request_version: int = ADD_OFFSETS_VERSION,
    ) -> CoordinatorResult[AddOffsetsResult]:
        """Add the group's ``__consumer_offsets`` partition, so the EndTxn marker reaches it."""
        tp = self.offsets_partition_for(group_id)
        error, md = self._check_add(transactional_id, producer_id, producer_epoch)
        if error is None and md is not None:
            if md.state is S.ONGOING and tp in md.partitions:
                error = E.none
            else:
                transit = md.prepare_add_partitions((tp,), now_ms)
                return self._append(md, transit, AppendPurpose.ADD_OFFSETS, request_version, (tp,))
        assert error is not None
        error = compat_error(error, AppendPurpose.ADD_OFFSETS, request_version)
        return CoordinatorResult(response=AddOffsetsResult(error))

    def _check_add(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[ErrorCode | None, TransactionMetadata | None]:
        if not transactional_id:
            return E.invalid_request, None
        if (owner := self.owner_error(transactional_id)) is not None:
            return owner, None
        md = self._txns.get(transactional_id)
        if md is None or md.producer_id != producer_id:
            return E.invalid_producer_id_mapping, None
        if md.producer_epoch != producer_epoch:
            return E.producer_fenced, None
        if md.pending_transition_in_progress or md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return E.concurrent_transactions, None
        return None, md

    def verify_partitions_in_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        *,
        request_version: int = ADD_PARTITIONS_VERSION,
    ) -> AddPartitionsResult:
        """AddPartitionsToTxn v4+ ``verify_only`` (KIP-890): is each partition in the open txn?

        A partition leader asks this before the first transactional write of a producer, so a
        late write cannot land after the transaction ended. Pending transitions are not checked:
        partitions join the set when their add is persisted and leave when the txn completes.
        """
        requested = tuple(dict.fromkeys(partitions))
        if not transactional_id:
            return AddPartitionsResult.uniform(requested, E.invalid_request)
        if (owner := self.owner_error(transactional_id)) is not None:
            return AddPartitionsResult.uniform(requested, owner)
        md = self._txns.get(transactional_id)
        if md is None or md.producer_id != producer_id:
            return AddPartitionsResult.uniform(requested, E.invalid_producer_id_mapping)
        if md.producer_epoch != producer_epoch:
            return AddPartitionsResult.uniform(requested, E.producer_fenced)
        if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return AddPartitionsResult.uniform(requested, E.concurrent_transactions)
        # TRANSACTION_ABORTABLE arrived with v5; v4 callers understand INVALID_TXN_STATE.
        missing = E.transaction_abortable if request_version >= 5 else E.invalid_txn_state
        return AddPartitionsResult(
            tuple((tp, E.none if tp in md.partitions else missing) for tp in requested)
        )

    # -- EndTxn -------------------------------------------------------------------------------

    def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        *,
        now_ms: int,
        request_version: int = END_TXN_VERSION,
    ) -> CoordinatorResult[EndTxnResult]:
        """Commit or abort: persist Prepare*, then (on success) answer OK and write the markers.

        A retry after completion answers OK when it asks for the same outcome, and
        INVALID_TXN_STATE when it asks for the other one.
        """

        def fail(error: ErrorCode) -> CoordinatorResult[EndTxnResult]:
            return CoordinatorResult(
                response=EndTxnResult(compat_error(error, AppendPurpose.END_TXN, request_version))
            )

        if not transactional_id:
            return fail(E.invalid_request)
        if (owner := self.owner_error(transactional_id)) is not None:
            return fail(owner)
        md = self._txns.get(transactional_id)
        if md is None or md.producer_id != producer_id:
            return fail(E.invalid_producer_id_mapping)
        if md.producer_epoch != producer_epoch:
            return fail(E.producer_fenced)
        if md.pending_transition_in_progress:
            return fail(E.concurrent_transactions)
        state = md.state
        if state is S.ONGOING:
            target = S.PREPARE_COMMIT if committed else S.PREPARE_ABORT
            transit = md.prepare_abort_or_commit(target, now_ms)
            return self._append(md, transit, AppendPurpose.END_TXN, request_version)
        done, in_flight = (
            (S.COMPLETE_COMMIT, S.PREPARE_COMMIT) if committed else (S.COMPLETE_ABORT, S.PREPARE_ABORT)
        )
        if state is done:
            return CoordinatorResult(response=EndTxnResult(E.none, md.producer_id, md.producer_epoch))
        if state is in_flight:
            return fail(E.concurrent_transactions)
        if state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return fail(E.invalid_txn_state)
        raise IllegalTransitionStateError(f"{transactional_id} is in {state}, which is never stored")

    # -- continuations ------------------------------------------------------------------------

    def on_log_append_done(
        self, append: AppendTxnLog, error: ErrorCode = E.none, *, now_ms: int
    ) -> CoordinatorResult[Response]:
        """The runtime finished ``append``; apply it (or drop it) and continue the operation."""
        purpose = append.purpose
        md = self._txns.get(append.transactional_id)
        if (
            md is None
            or append.coordinator_epoch != self.coordinator_epoch
            or self._in_flight.get(append.transactional_id) is not append.transit
            or md.pending_state is not append.transit.state
        ):
            # Reloaded (or the id vanished) while the append was in flight: not ours to apply.
            return self._respond(append, E.not_coordinator)
        del self._in_flight[append.transactional_id]

        if error != E.none:
            if purpose is AppendPurpose.COMPLETE:
                # Keep the pending Complete*: the runtime retries via on_markers_written.
                return CoordinatorResult()
            md.abort_pending()
            if md.producer_epoch == NO_PRODUCER_EPOCH and md.state is S.EMPTY:
                del self._txns[append.transactional_id]  # created by this request, never persisted
            return self._respond(append, append_error_to_coordinator_error(error))

        if purpose is AppendPurpose.EXPIRE:
            del self._txns[append.transactional_id]
            return CoordinatorResult()
        md.complete_transition(append.transit)
        if purpose is AppendPurpose.COMPLETE:
            self._completions.pop(append.transactional_id, None)
            return CoordinatorResult()
        if md.state.is_prepare:  # END_TXN, FENCE, TIMEOUT_ABORT: the decision is durable
            markers = self._start_completion(md, now_ms)
            return CoordinatorResult(response=response_for_append(append, E.none), effects=(markers,))
        return self._respond(append, E.none)

    def on_markers_written(
        self, transactional_id: str, producer_id: int, producer_epoch: int, result: ControlType
    ) -> CoordinatorResult[Response]:
        """Every marker of a :class:`WriteMarkers` is written: persist Complete*.

        Returns the :class:`AppendTxnLog` to execute, or no effect when the markers are stale
        (another incarnation, or already completed). Call again to retry a failed append.
        """
        completion = self._completions.get(transactional_id)
        if completion is None:
            return CoordinatorResult()
        m = completion.markers
        if (m.producer_id, m.producer_epoch, m.result) != (producer_id, producer_epoch, result):
            return CoordinatorResult()
        md = self._txns[transactional_id]
        return self._writes(self._make_append(md, completion.transit, AppendPurpose.COMPLETE))

    # -- periodic tasks -----------------------------------------------------------------------

    def expire_timed_out(self, now_ms: int) -> CoordinatorResult[Response]:
        """Abort, with an epoch bump, every transaction open longer than its timeout.

        Run every ``abort_timed_out_interval_ms``. Each write's success yields the ABORT markers.
        The bump fences the producer that let its transaction time out.
        """
        if self.loading:
            return CoordinatorResult()
        return self._writes(
            *(
                self._make_append(md, md.prepare_fence_and_abort(now_ms), AppendPurpose.TIMEOUT_ABORT)
                for md in admin.timed_out(self._txns.values(), now_ms)
            )
        )

    def expire_transactional_ids(
        self, now_ms: int, expiration_ms: int | None = None
    ) -> CoordinatorResult[Response]:
        """Tombstones for ids idle (no open transaction) for ``expiration_ms`` (default 7 days).

        The entry is removed only when its tombstone write completes.
        """
        return self._writes(*self.expirable_appends(now_ms, expiration_ms))

    def load_complete(self, now_ms: int) -> CoordinatorResult[Response]:
        """End loading (:meth:`end_load`): the markers owed by transactions left in Prepare*."""
        return CoordinatorResult(effects=self.end_load(now_ms))

    def unload(self, now_ms: int) -> CoordinatorResult[Response]:
        """Stop owning ``__transaction_state`` (:meth:`resign`): forget all state; requests get
        NOT_COORDINATOR until a :meth:`begin_load` (then COORDINATOR_LOAD_IN_PROGRESS until
        :meth:`load_complete`), as Kafka answers for a partition it no longer owns. Writes still
        in flight complete as stale and their requests are answered NOT_COORDINATOR."""
        self.resign()
        return CoordinatorResult()

    def poll(self, now_ms: int) -> CoordinatorResult[Response]:
        """No timers are kept (see :meth:`next_deadline`): nothing is ever due."""
        return CoordinatorResult()

    # -- internals ----------------------------------------------------------------------------

    def _append(
        self,
        md: TransactionMetadata,
        transit: TxnTransitMetadata,
        purpose: AppendPurpose,
        request_version: int,
        requested: tuple[TopicPartition, ...] = (),
    ) -> CoordinatorResult[Never]:
        return self._writes(self._make_append(md, transit, purpose, request_version, requested))

    def _writes(self, *appends: AppendTxnLog) -> CoordinatorResult[Never]:
        """Hand prepared appends to the runtime; each completes through :meth:`on_log_append_done`."""
        return CoordinatorResult(writes=tuple(self._write(a) for a in appends))

    def _write(self, append: AppendTxnLog) -> Write:
        def complete(outcome: AppendOutcome) -> CoordinatorResult[Response]:
            return self.on_log_append_done(append, outcome.error, now_ms=outcome.now_ms)

        return Write(
            partition=append.partition,
            records=((append.key, append.value),),
            complete=complete,
            describe=f"{append.purpose.value} {append.transactional_id}",
        )

    @staticmethod
    def _respond(append: AppendTxnLog, error: ErrorCode) -> CoordinatorResult[Response]:
        return CoordinatorResult(response=response_for_append(append, error))
