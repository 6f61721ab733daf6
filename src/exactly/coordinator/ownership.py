"""Which partitions of its internal topic a coordinator owns, and whether it is loading them.

Both coordinators (groups on ``__consumer_offsets``, transactions on ``__transaction_state``)
answer a request for a key *when the request runs*, not only when it arrives, as Kafka's
``validateGroupStatus`` / ``getAndMaybeAddTransactionState`` do: a cluster request passes the
runtime's check, then waits for the operation lock, and a reload that resigned the key's
partition may run in between. It must then get NOT_COORDINATOR (the client looks the coordinator
up again), never what an empty coordinator would say (UNKNOWN_MEMBER_ID, a new group created here,
INVALID_PRODUCER_ID_MAPPING). :class:`Ownership` is that check and the lifecycle it follows, one
value object held by each coordinator.

States and transitions
----------------------
:class:`OwnershipState` and the one table :data:`TRANSITIONS` (events :class:`OwnershipEvent`);
anything not in the table raises :class:`InvalidOwnershipTransitionError` (a runtime bug)::

    NEW ──begin_load──► LOADING ──complete_load──► OWNING ──begin_load──► LOADING
     │ └─complete_load (a new coordinator's first load may skip begin_load)─► OWNING
     └──resign──► RESIGNED ◄──resign── LOADING / OWNING / RESIGNED;  RESIGNED ──begin_load──► LOADING

Invariants
----------
* ``partitions`` is what the coordinator owns (OWNING) or is loading (LOADING): None means every
  partition (a single broker, or a new coordinator), an empty set none (RESIGNED always).
* :meth:`Ownership.owner_error`: COORDINATOR_LOAD_IN_PROGRESS for every key while LOADING (the
  load replaces all state, whichever partition the key is on), NOT_COORDINATOR for a partition
  outside ``partitions``, else None (go on: a key the coordinator does not hold is unknown).
* ``loads`` counts :meth:`Ownership.begin_load` calls: a load generation that never decreases.
* The object is frozen: a transition returns a new one, so a coordinator's ownership changes
  only where it assigns the result.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from kio.schema.errors import ErrorCode

__all__ = [
    "TRANSITIONS",
    "InvalidOwnershipTransitionError",
    "Ownership",
    "OwnershipEvent",
    "OwnershipState",
]


class InvalidOwnershipTransitionError(RuntimeError):
    """A lifecycle call the transition table forbids (e.g. ``complete_load`` with no load)."""


class OwnershipState(enum.Enum):
    NEW = "new"  # constructed, never loaded: owns every partition
    LOADING = "loading"  # replaying ``partitions``: every request waits (LOAD_IN_PROGRESS)
    OWNING = "owning"  # serving ``partitions`` (None: every one)
    RESIGNED = "resigned"  # unloaded (Kafka's onResignation): owns nothing until a load begins


class OwnershipEvent(enum.Enum):
    BEGIN_LOAD = "begin load"
    COMPLETE_LOAD = "complete load"
    RESIGN = "resign"


_S = OwnershipState
_E = OwnershipEvent

TRANSITIONS: Mapping[tuple[OwnershipState, OwnershipEvent], OwnershipState] = MappingProxyType(
    {
        (_S.NEW, _E.BEGIN_LOAD): _S.LOADING,
        # A single broker's first load replays every partition into a new coordinator.
        (_S.NEW, _E.COMPLETE_LOAD): _S.OWNING,
        (_S.NEW, _E.RESIGN): _S.RESIGNED,
        # A newer load replaces one not completed (a reload queued behind another).
        (_S.LOADING, _E.BEGIN_LOAD): _S.LOADING,
        (_S.LOADING, _E.COMPLETE_LOAD): _S.OWNING,
        (_S.LOADING, _E.RESIGN): _S.RESIGNED,
        (_S.OWNING, _E.BEGIN_LOAD): _S.LOADING,
        (_S.OWNING, _E.RESIGN): _S.RESIGNED,
        (_S.RESIGNED, _E.BEGIN_LOAD): _S.LOADING,
        # Resigning what is already given up changes nothing (Kafka ignores it too).
        (_S.RESIGNED, _E.RESIGN): _S.RESIGNED,
    }
)


@dataclass(frozen=True, slots=True)
class Ownership:
    """What a coordinator owns of its topic; see the module docstring. Start with ``Ownership()``."""

    state: OwnershipState = OwnershipState.NEW
    partitions: frozenset[int] | None = None
    loads: int = 0

    @property
    def loading(self) -> bool:
        return self.state is OwnershipState.LOADING

    def owner_error(self, partition: int) -> ErrorCode | None:
        """The error for a request for a key of ``partition``, checked when it runs:
        COORDINATOR_LOAD_IN_PROGRESS while loading, NOT_COORDINATOR for a partition not owned,
        else None."""
        if self.state is OwnershipState.LOADING:
            return ErrorCode.coordinator_load_in_progress
        if self.partitions is not None and partition not in self.partitions:
            return ErrorCode.not_coordinator
        return None

    def begin_load(self, partitions: Iterable[int] | None = None) -> Ownership:
        """A load of ``partitions`` (None: every one) starts; requests wait until
        :meth:`complete_load`, then keys of other partitions get NOT_COORDINATOR."""
        return replace(
            self,
            state=self._next(OwnershipEvent.BEGIN_LOAD),
            partitions=None if partitions is None else frozenset(partitions),
            loads=self.loads + 1,
        )

    def complete_load(self) -> Ownership:
        """The load is replayed: serve its partitions (a new coordinator: every one)."""
        return replace(self, state=self._next(OwnershipEvent.COMPLETE_LOAD))

    def resign(self) -> Ownership:
        """Unloaded: own no partition (NOT_COORDINATOR for every key) until a load begins."""
        return replace(self, state=self._next(OwnershipEvent.RESIGN), partitions=frozenset())

    def _next(self, event: OwnershipEvent) -> OwnershipState:
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise InvalidOwnershipTransitionError(f"{event.value} while {self.state.value}")
        return target
