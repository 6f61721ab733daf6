"""Transaction states of the coordinator, and the one table of legal transitions.

Theory of operation
-------------------
Every ``transactional.id`` owns one :class:`~exactly.coordinator.txn.metadata.TransactionMetadata`
whose ``state`` walks this graph (the names and byte ids are Kafka's, because they are written to
``__transaction_state`` and exposed by DescribeTransactions / ListTransactions)::

      Empty ──AddPartitions/AddOffsets──► Ongoing ◄──┐ (more partitions)
        ▲                                  │ │ │ └──┘
        │                                  │ │ └─EndTxn(commit)─► PrepareCommit ─markers─► CompleteCommit
        │                                  │ └───EndTxn(abort)──► PrepareAbort ──markers─► CompleteAbort
        │                                  └─InitProducerId/timeout─► PrepareEpochFence ─► PrepareAbort
        │
      InitProducerId (epoch + 1, or a new producer id) from Empty, CompleteCommit, CompleteAbort;
      AddPartitions from CompleteCommit/CompleteAbort starts the next transaction (-> Ongoing);
      idle expiry from Empty, CompleteCommit, CompleteAbort -> Dead (tombstone, entry removed).

Two-phase commit: ``EndTxn`` first persists ``PrepareCommit``/``PrepareAbort`` (the decision),
then COMMIT/ABORT markers are written to every partition of the transaction, then
``CompleteCommit``/``CompleteAbort`` is persisted. A coordinator that restarts in a ``Prepare*``
state has already decided; it only has to (re)write the markers and persist the completion.

``PrepareEpochFence`` is transient and never written to the log: when a new producer instance calls
InitProducerId (or the transaction times out) while a transaction is ``Ongoing``, the coordinator
bumps the epoch (fencing the old instance) and moves on to ``PrepareAbort`` with the bumped epoch in
the same step. ``Dead`` is never written either: expiry writes a tombstone (null value) instead.

Invariants
----------
* Every state change is checked against :data:`VALID_PREVIOUS_STATES`, the only transition table;
  :func:`check_transition` raises :class:`InvalidTransitionError` for anything else.
* The table is Kafka's transaction-version-1 table. Kafka 4.x (KIP-890 part 2, "TV2") also lets
  ``Empty``/``CompleteCommit``/``CompleteAbort`` go to ``PrepareAbort``; this coordinator does not
  implement TV2, so those edges stay illegal here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class InvalidTransitionError(RuntimeError):
    """A state change that the transition table forbids: always a coordinator bug."""


class TransactionState(enum.Enum):
    """Coordinator-side transaction state. ``value`` is the on-disk byte id."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def id(self) -> int:
        """The byte written as ``TransactionStatus`` in ``__transaction_state`` values."""
        return int(self.value)

    @property
    def state_name(self) -> str:
        """Kafka's display name (DescribeTransactions / ListTransactions state filters)."""
        return _NAMES[self]

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        return VALID_PREVIOUS_STATES[self]

    @property
    def expiration_allowed(self) -> bool:
        """True where an idle transactional.id may be expired (no transaction in flight)."""
        return self in _EXPIRATION_ALLOWED

    @property
    def is_prepare(self) -> bool:
        """True for the decided-but-not-completed states whose markers may still be missing."""
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @classmethod
    def from_id(cls, state_id: int) -> TransactionState:
        # a dict lookup, not ``cls(state_id)``: a load calls this for every value it replays
        state = _BY_ID.get(state_id)
        if state is None:
            raise ValueError(f"unknown transaction state id {state_id}")
        return state

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        """The state with Kafka display name ``name``, or None (ListTransactions reports unknowns)."""
        return _BY_NAME.get(name)

    def __str__(self) -> str:
        return self.state_name


S = TransactionState

_NAMES: Mapping[TransactionState, str] = MappingProxyType(
    {
        S.EMPTY: "Empty",
        S.ONGOING: "Ongoing",
        S.PREPARE_COMMIT: "PrepareCommit",
        S.PREPARE_ABORT: "PrepareAbort",
        S.COMPLETE_COMMIT: "CompleteCommit",
        S.COMPLETE_ABORT: "CompleteAbort",
        S.DEAD: "Dead",
        S.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
    }
)
_BY_NAME: Mapping[str, TransactionState] = MappingProxyType({v: k for k, v in _NAMES.items()})
_BY_ID: Mapping[int, TransactionState] = MappingProxyType({s.value: s for s in TransactionState})

_EXPIRATION_ALLOWED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})

#: target state -> the states it may be entered from. The one transition table.
VALID_PREVIOUS_STATES: Mapping[TransactionState, frozenset[TransactionState]] = MappingProxyType(
    {
        # InitProducerId: bump the epoch (or rotate the producer id) between transactions.
        S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
        # AddPartitionsToTxn / AddOffsetsToTxn: the first add starts a transaction.
        S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
        # EndTxn(commit).
        S.PREPARE_COMMIT: frozenset({S.ONGOING}),
        # EndTxn(abort), or the abort that follows an epoch fence.
        S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
        # All markers written.
        S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
        S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
        # transactional.id expiry: only when nothing is in flight.
        S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
        # InitProducerId from a new instance, or a timeout, while a transaction is open.
        S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
    }
)

del S


def is_valid_transition(current: TransactionState, target: TransactionState) -> bool:
    return current in VALID_PREVIOUS_STATES[target]


def check_transition(current: TransactionState, target: TransactionState) -> None:
    """Raise :class:`InvalidTransitionError` unless ``current -> target`` is in the table."""
    if current not in VALID_PREVIOUS_STATES[target]:
        raise InvalidTransitionError(
            f"invalid transaction state transition {current} -> {target}; "
            f"{target} may only be entered from "
            f"{sorted(s.state_name for s in VALID_PREVIOUS_STATES[target])}"
        )
