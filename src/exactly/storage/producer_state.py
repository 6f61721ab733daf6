"""Per-partition producer state: idempotence and transaction bookkeeping (Kafka's
ProducerStateManager, ProducerAppendInfo, ProducerStateEntry).

Theory of operation
-------------------
For every producer id that wrote to this partition the manager keeps the epoch, the metadata of
the last 5 batches (first/last sequence, last offset, timestamp), the coordinator epoch and the
first offset of its ongoing transaction, if any. Five, because that is the most batches an
idempotent producer keeps in flight per partition (max.in.flight.requests.per.connection <= 5):
any retry the client can send is one of them.

Appends follow prepare -> persist -> complete:
  1. ``prepare_append(header, origin, now_ms)`` validates one batch whose offsets are already
     assigned and returns either ``DuplicateBatch`` (ack with the original offsets, write nothing)
     or a ``ProducerAppendInfo`` (staged, not yet visible). Raises ``ProducerStateError`` with
     OUT_OF_ORDER_SEQUENCE_NUMBER (45), INVALID_PRODUCER_EPOCH (47), INVALID_TXN_STATE (48),
     TRANSACTION_COORDINATOR_FENCED (52).
  2. The log appends the bytes.
  3. ``complete_append(info)`` applies the staged change (and advances the map end offset to the
     batch's next offset); ``update_map_end_offset(next_offset)`` may also be called explicitly.
     For a control batch the result is a ``CompletedTxn`` the log turns into a transaction-index
     entry (aborted ones) and an LSO move.

Rules (Kafka's, see ProducerAppendInfo.checkProducerEpoch/checkSequence/appendEndTxnMarker)
----------------------------------------------------------------------------------------------
* Duplicate (CLIENT origin only): same epoch and the same (first seq, last seq) as one of the
  cached batches -> ``DuplicateBatch`` with the original offsets and timestamp.
* Epoch lower than the last one seen -> INVALID_PRODUCER_EPOCH, for data and markers.
* Sequence (CLIENT origin only): a higher epoch must start at 0; within the epoch the first
  sequence must be last seq + 1 (0 after Int32 max); a producer with no state (KIP-360) or no
  known epoch is accepted at any sequence. Otherwise OUT_OF_ORDER_SEQUENCE_NUMBER.
* Transactions: the first transactional data batch opens the producer's transaction at its base
  offset; a non-transactional data batch while one is open -> INVALID_TXN_STATE. A marker whose
  coordinator epoch is below the last one seen -> TRANSACTION_COORDINATOR_FENCED. A marker closes
  the transaction (``CompletedTxn``); a marker with no open transaction still updates the epoch
  and coordinator epoch but yields no ``CompletedTxn`` (nothing to index, LSO unaffected).
* REPLICATION origin (recovery replay, later follower fetch) never raises: the log is the truth.

Differences from Kafka, on purpose
----------------------------------
* ``ProducerStateEntry.last_timestamp`` is the *broker* time of the producer's last append (the
  ``now_ms`` given to ``prepare_append``), not the batch's CreateTime. Producer expiration uses it,
  and a client with a skewed clock must not lose its dedup state early. ``BatchMetadata.timestamp``
  keeps the batch's max timestamp, which is what a duplicate is acked with.
* Snapshots keep every retained batch, not only the last (see ``producer_snapshot``), so dedup
  of all 5 in-flight batches survives a restart.
* ``first_unstable_offset`` counts undecided transactions only. Kafka also holds the LSO back for
  completed transactions whose marker is above the high watermark; with one replica the high
  watermark reaches the marker at once, and ``PartitionLog`` caps the LSO at the high watermark.

Invariants
----------
* Single-threaded: prepare/complete pairs for one partition never interleave (the event loop
  serialises appends), so a staged ``ProducerAppendInfo`` is always based on the current entry.
* ``_ongoing`` maps producer id -> first offset of its open transaction and agrees with
  ``current_txn_first_offset`` of every entry; ``_first_unstable`` is the minimum of its values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

import exactly.storage.producer_snapshot as snap
from exactly.frozen import quick_init
from exactly.records.batch import BatchHeader, increment_sequence
from exactly.records.control import ControlType
from exactly.storage.producer_entry import NUM_BATCHES_TO_RETAIN, BatchMetadata, ProducerStateEntry

DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
NO_PRODUCER_EPOCH = -1
NO_COORDINATOR_EPOCH = -1
_INT32_MAX = 2**31 - 1


class AppendOrigin(enum.Enum):
    CLIENT = "client"  # Produce requests: full validation
    COORDINATOR = "coordinator"  # transaction markers written by the txn coordinator
    REPLICATION = "replication"  # log replay at recovery / follower fetch: no validation errors


# the hot path compares with these module constants (an enum member lookup is a dict walk in 3.11)
_CLIENT = AppendOrigin.CLIENT
_REPLICATION = AppendOrigin.REPLICATION


class ProducerStateError(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@quick_init
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


@quick_init
@dataclass(frozen=True, slots=True)
class ProducerAppendInfo:
    """A staged change for one producer; applied by ``complete_append`` after the log write.

    ``next_offset`` (an addition to the original contract) is the offset after the batch, so
    ``complete_append`` keeps the map end offset right even if the caller forgets to call
    ``update_map_end_offset``. ``producer_id`` -1 marks a batch without a producer id: applying it
    changes nothing but the map end offset.
    """

    producer_id: int
    updated: ProducerStateEntry
    completed_txn: CompletedTxn | None
    started_txn_first_offset: int | None
    next_offset: int = -1


_NO_PRODUCER_ENTRY = ProducerStateEntry(-1, NO_PRODUCER_EPOCH, (), NO_COORDINATOR_EPOCH, -1, None)


def _fail(origin: AppendOrigin, error_code: ErrorCode, message: str) -> None:
    """Raise for CLIENT/COORDINATOR appends; the log is the truth for REPLICATION."""
    if origin is not AppendOrigin.REPLICATION:
        raise ProducerStateError(error_code, message)


class ProducerStateManager(snap.ProducerSnapshots):
    """Producer state of one partition plus its snapshot files (``<offset:020d>.snapshot``).

    Owns: the entry of every producer id that wrote to the partition, the open transactions
    (``_ongoing``), the map end offset (the offset up to which the log has been applied) and the
    snapshot files in the partition directory.

    Lifecycle: constructed empty by ``PartitionLog.open``; recovery loads the newest valid
    snapshot at or below the recovery point and replays the log tail into it; then every append
    goes through ``prepare_append`` -> log write -> ``complete_append`` (module docstring);
    snapshots are taken at segment roll and at close, deleted with the segments they cover, and
    expired producers are removed by the log manager's maintenance. No descriptor stays open.
    """

    def __init__(
        self,
        directory: Path,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        self.directory = directory
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of the open txn
        self._first_unstable: int | None = None
        self._map_end_offset = 0
        self._last_snap_offset = 0
        self._snapshots: dict[int, Path] = snap.list_snapshots(directory)
        self._unsynced: set[int] = set()

    # --- the append path -------------------------------------------------------------------
    def prepare_append(
        self,
        header: BatchHeader,
        *,
        origin: AppendOrigin,
        now_ms: int,
        control_type: ControlType | None = None,
        coordinator_epoch: int = NO_COORDINATOR_EPOCH,
    ) -> ProducerAppendInfo | DuplicateBatch:
        """Validate one batch (offsets already assigned). ``control_type`` is given for control
        batches, with the marker's ``coordinator_epoch`` (an addition to the contract). Raises
        ProducerStateError for CLIENT/COORDINATOR origins; REPLICATION never raises on
        sequence/epoch (the log is the truth). Constant work per batch: no record is read."""
        pid = header.producer_id
        if pid < 0:
            if control_type is not None:
                raise ValueError("a control batch must carry a producer id")
            return ProducerAppendInfo(-1, _NO_PRODUCER_ENTRY, None, None, header.next_offset)
        entry = self._producers.get(pid)
        epoch = header.producer_epoch
        current_epoch = NO_PRODUCER_EPOCH if entry is None else entry.producer_epoch
        if control_type is None:
            if header.is_control:
                # Kafka skips a control batch with no record (cleaned away) during replay; an
                # unreadable marker in the log is treated the same. Elsewhere it is a bug.
                if origin is not AppendOrigin.REPLICATION:
                    raise ValueError("control batch without its control type (parse the marker first)")
                if header.record_count == 0 and epoch > current_epoch:
                    # Unlike Kafka, an empty control batch still carries its epoch: the cleaner
                    # keeps it precisely because it is a producer's newest epoch (fencing), so a
                    # rebuild from the log without snapshots must not lose that epoch.
                    txn_first = None if entry is None else entry.current_txn_first_offset
                    coordinator_epoch = NO_COORDINATOR_EPOCH if entry is None else entry.coordinator_epoch
                    bumped = ProducerStateEntry(pid, epoch, (), coordinator_epoch, now_ms, txn_first)
                    return ProducerAppendInfo(pid, bumped, None, None, header.next_offset)
                return ProducerAppendInfo(-1, _NO_PRODUCER_ENTRY, None, None, header.next_offset)
            return self._prepare_data(header, entry, pid, epoch, current_epoch, origin, now_ms)

        # --- transaction marker ---
        if epoch < current_epoch:
            _fail(
                origin,
                ErrorCode.invalid_producer_epoch,
                f"marker epoch {epoch} of producer {pid} is older than the current epoch {current_epoch}",
            )
        if entry is not None and entry.coordinator_epoch > coordinator_epoch:
            _fail(
                origin,
                ErrorCode.transaction_coordinator_fenced,
                f"marker coordinator epoch {coordinator_epoch} for producer {pid} is older than "
                f"{entry.coordinator_epoch}",
            )
        txn_first = None if entry is None else entry.current_txn_first_offset
        completed = (
            None
            if txn_first is None
            else CompletedTxn(pid, txn_first, header.base_offset, control_type is ControlType.ABORT)
        )
        batches = () if entry is None or epoch != current_epoch else entry.batches
        updated = ProducerStateEntry(pid, epoch, batches, coordinator_epoch, now_ms, None)
        return ProducerAppendInfo(pid, updated, completed, None, header.next_offset)

    def _prepare_data(
        self,
        header: BatchHeader,
        entry: ProducerStateEntry | None,
        pid: int,
        epoch: int,
        current_epoch: int,
        origin: AppendOrigin,
        now_ms: int,
    ) -> ProducerAppendInfo | DuplicateBatch:
        first_seq = header.base_sequence
        last_seq = header.last_sequence
        if entry is not None and origin is _CLIENT and epoch == current_epoch:
            for cached in entry.batches:
                if cached.first_seq == first_seq and cached.last_seq == last_seq:
                    return DuplicateBatch(cached.first_offset, cached.last_offset, cached.timestamp)
        if epoch < current_epoch:
            _fail(
                origin,
                ErrorCode.invalid_producer_epoch,
                f"epoch {epoch} of producer {pid} is older than the current epoch {current_epoch}",
            )
        if origin is _CLIENT and current_epoch != NO_PRODUCER_EPOCH:
            if epoch != current_epoch:
                if first_seq != 0:
                    _fail(
                        origin,
                        ErrorCode.out_of_order_sequence_number,
                        f"producer {pid} started epoch {epoch} at sequence {first_seq}, expected 0",
                    )
            else:
                expected_after = entry.last_seq if entry is not None else -1
                if first_seq != expected_after + 1 and not (first_seq == 0 and expected_after == _INT32_MAX):
                    _fail(
                        origin,
                        ErrorCode.out_of_order_sequence_number,
                        f"out of order sequence {first_seq} for producer {pid} (epoch {epoch}), "
                        f"last sequence {expected_after}",
                    )
        offset_delta = header.last_offset_delta
        meta = BatchMetadata(
            first_seq, last_seq, header.base_offset + offset_delta, offset_delta, header.max_timestamp
        )
        if entry is None or epoch != current_epoch:
            batches: tuple[BatchMetadata, ...] = (meta,)
        elif len(entry.batches) >= NUM_BATCHES_TO_RETAIN:
            batches = (*entry.batches[1 - NUM_BATCHES_TO_RETAIN :], meta)
        else:
            batches = (*entry.batches, meta)
        txn_first = None if entry is None else entry.current_txn_first_offset
        started = None
        if header.is_transactional:
            if txn_first is None:
                txn_first = started = header.base_offset
        elif txn_first is not None:
            _fail(
                origin,
                ErrorCode.invalid_txn_state,
                f"non-transactional batch from producer {pid} while its transaction from offset "
                f"{txn_first} is open",
            )
        coordinator_epoch = NO_COORDINATOR_EPOCH if entry is None else entry.coordinator_epoch
        updated = ProducerStateEntry(pid, epoch, batches, coordinator_epoch, now_ms, txn_first)
        return ProducerAppendInfo(pid, updated, None, started, header.next_offset)

    def prepare_plain(
        self,
        pid: int,
        epoch: int,
        first_seq: int,
        offset_delta: int,
        base_offset: int,
        max_timestamp: int,
        now_ms: int,
    ) -> ProducerStateEntry | None:
        """``prepare_append`` of a CLIENT, non-transactional data batch that is *accepted as new*
        (the usual Produce), from the header's fields: the producer's next entry, for
        ``apply_plain`` after the write. None whenever anything else applies -- a duplicate, a
        stale epoch, a sequence gap, an open transaction -- and then nothing was changed and the
        caller takes ``prepare_append``, which answers those cases with their errors. Same
        checks in the same order, so for every batch either this returns what
        ``prepare_append`` would stage or returns None (tests/storage/test_producer_state_plain.py).
        Why a second entry: the profile of a 100 B-record produce shows the staged
        ``ProducerAppendInfo``, the header properties and the calls in between (~15 Python calls)
        are a tenth of a Produce request's Python path. Why not one function with
        ``_prepare_data``: that one serves every origin and transactional batches and raises the
        errors, so this calling it would bring back the header object and staged info this
        path exists to avoid, and it calling this would only add a call to the generic path
        without removing any of its checks; the model test keeps the two equal instead."""
        entry = self._producers.get(pid)
        last_seq = -1 if first_seq < 0 else increment_sequence(first_seq, offset_delta)
        if entry is None:
            if epoch < NO_PRODUCER_EPOCH:
                return None  # INVALID_PRODUCER_EPOCH
            batches: tuple[BatchMetadata, ...] = ()
            coordinator_epoch = NO_COORDINATOR_EPOCH
        else:
            if entry.current_txn_first_offset is not None:
                return None  # INVALID_TXN_STATE (or a duplicate of a transactional batch)
            current_epoch = entry.producer_epoch
            batches = entry.batches
            if epoch == current_epoch:
                for cached in batches:
                    if cached.first_seq == first_seq and cached.last_seq == last_seq:
                        return None  # a duplicate: acked with its original offsets
                expected_after = batches[-1].last_seq if batches else -1
                if current_epoch != NO_PRODUCER_EPOCH and (
                    first_seq != expected_after + 1 and not (first_seq == 0 and expected_after == _INT32_MAX)
                ):
                    return None  # OUT_OF_ORDER_SEQUENCE_NUMBER
                if len(batches) >= NUM_BATCHES_TO_RETAIN:
                    batches = batches[1 - NUM_BATCHES_TO_RETAIN :]
            elif epoch < current_epoch:
                return None  # INVALID_PRODUCER_EPOCH
            else:
                if current_epoch != NO_PRODUCER_EPOCH and first_seq != 0:
                    return None  # a new epoch must start at sequence 0
                batches = ()
            coordinator_epoch = entry.coordinator_epoch
        meta = BatchMetadata(first_seq, last_seq, base_offset + offset_delta, offset_delta, max_timestamp)
        return ProducerStateEntry(pid, epoch, (*batches, meta), coordinator_epoch, now_ms, None)

    def apply_plain(self, entry: ProducerStateEntry | None, next_offset: int) -> None:
        """``complete_append`` of what ``prepare_plain`` staged (None: a batch without a producer
        id, which only moves the map end offset)."""
        if entry is not None:
            self._producers[entry.producer_id] = entry
        self._map_end_offset = next_offset

    def complete_append(self, info: ProducerAppendInfo) -> CompletedTxn | None:
        """Apply a staged change after the log write succeeded."""
        if info.next_offset > self._map_end_offset:
            self._map_end_offset = info.next_offset
        pid = info.producer_id
        if pid < 0:
            return None
        self._producers[pid] = info.updated
        if info.started_txn_first_offset is not None:
            self._ongoing[pid] = info.started_txn_first_offset
            if self._first_unstable is None:
                self._first_unstable = info.started_txn_first_offset
            else:
                self._first_unstable = min(self._first_unstable, info.started_txn_first_offset)
        completed = info.completed_txn
        if completed is not None and self._ongoing.pop(pid, None) == self._first_unstable:
            self._first_unstable = min(self._ongoing.values(), default=None)
        return completed

    def update_map_end_offset(self, offset: int) -> None:
        """``offset`` is exclusive: the next offset the log will assign."""
        self._map_end_offset = offset

    @property
    def map_end_offset(self) -> int:
        return self._map_end_offset

    # --- transactions / LSO -----------------------------------------------------------------
    def first_unstable_offset(self) -> int | None:
        """Smallest first offset among ongoing transactions (None when none is open)."""
        return self._first_unstable

    def ongoing_transactions(self) -> dict[int, int]:
        """producer id -> first offset of its open transaction."""
        return dict(self._ongoing)

    # --- introspection ---------------------------------------------------------------------
    def active_producers(self) -> dict[int, ProducerStateEntry]:
        return dict(self._producers)

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def remove_expired_producers(self, now_ms: int) -> int:
        """Forget producers idle longer than producer.id.expiration.ms that have no open
        transaction. Returns how many were removed. Like Kafka, idle for exactly the expiration
        time counts as expired."""
        limit = self.producer_id_expiration_ms
        expired = [
            pid
            for pid, entry in self._producers.items()
            if entry.current_txn_first_offset is None and now_ms - entry.last_timestamp >= limit
        ]
        for pid in expired:
            del self._producers[pid]
        return len(expired)

    # --- recovery (the snapshot files: ProducerSnapshots) ----------------------------------
    def replay(
        self,
        header: BatchHeader,
        control_type: ControlType | None = None,
        *,
        coordinator_epoch: int = NO_COORDINATOR_EPOCH,
        now_ms: int | None = None,
    ) -> CompletedTxn | None:
        """Apply a batch read back from the log during recovery (origin REPLICATION) and advance
        the map end offset past it. ``coordinator_epoch`` is the marker's (control batches);
        ``now_ms`` defaults to the batch's max timestamp (the producer's last-seen time)."""
        info = self.prepare_append(
            header,
            origin=AppendOrigin.REPLICATION,
            now_ms=header.max_timestamp if now_ms is None else now_ms,
            control_type=control_type,
            coordinator_epoch=coordinator_epoch,
        )
        if isinstance(info, DuplicateBatch):  # pragma: no cover - REPLICATION has no dedup
            return None
        completed = self.complete_append(info)
        self._map_end_offset = header.next_offset
        return completed
