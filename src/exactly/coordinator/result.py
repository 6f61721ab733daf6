"""What every coordinator operation hands back to the runtime (Kafka's ``CoordinatorResult``).

Both coordinators -- transactions (``__transaction_state``) and groups (``__consumer_offsets``) --
are sans-IO state machines that persist by appending records to a partition of their internal
topic. Every operation, whether a client request, a timer or a load, returns one
:class:`CoordinatorResult`:

* ``writes``: record batches to append, each to one partition of the coordinator's topic. Each
  :class:`Write` carries its *completion*: the runtime appends the batch, waits until it is
  durable, and reports the :class:`AppendOutcome` to ``Write.complete``. The completion is the
  only place the write's state change is applied (prepare -> persist -> complete), and it applies
  exactly what replaying the write's records at load time gives, so recovery is replay. A
  completion returns another ``CoordinatorResult`` (its response, further writes).
* ``response``: the answer to the request that ran the operation. When the operation has writes,
  the answer comes from their completions instead (it cannot be known before the append).
* ``replies``: answers addressed by the token the runtime passed in with each request. A
  coordinator that parks requests (a JoinGroup that waits for the rebalance, a follower's
  SyncGroup that waits for the leader's assignment) answers every request this way, at once or
  from a later operation; the transaction coordinator never parks and uses ``response``.
* ``effects``: work outside the coordinator's own log that the runtime hands to the
  coordinator-specific side-effect handler (the transaction markers); that handler reports back
  with another ``CoordinatorResult``.

The runtime sends ``response`` and ``replies`` only after every write of the result (and of the
completions it led to) has been reported: a client never sees an answer whose records are not
durable.

Unlike Kafka, the state change is applied when the append is durable rather than speculatively
with a rollback on failure: with synchronous storage nothing can interleave between the append
and its completion, and pending states (CONCURRENT_TRANSACTIONS, parked replies) already keep
other requests off the record in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kio.schema.errors import ErrorCode

R = TypeVar("R", covariant=True)

Record = tuple[bytes, bytes | None]
"""A key and a value (None = tombstone) of the coordinator's internal topic."""

RequestToken = Hashable
"""Identifies a request the runtime is waiting to answer (the coordinator may park it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendOutcome:
    """What the runtime reports after a write: ``base_offset`` of the first record, or an error."""

    now_ms: int
    base_offset: int = -1
    error: ErrorCode = ErrorCode.none

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.none


@dataclass(frozen=True, slots=True, kw_only=True)
class Write:
    """One batch for partition ``partition`` of the coordinator's topic, and its completion.

    ``producer_id >= 0`` makes it a transactional batch of that producer (TxnOffsetCommit): the
    partition's producer state tracks the open transaction until its marker. ``describe`` names
    the write in log lines. Invariant: nothing of this write is visible in the coordinator's state
    until ``complete`` runs with a successful outcome; ``complete`` runs exactly once.
    """

    partition: int
    records: tuple[Record, ...]
    complete: Callable[[AppendOutcome], CoordinatorResult[Any]] = field(repr=False, compare=False)
    producer_id: int = -1
    producer_epoch: int = -1
    describe: str = ""

    @property
    def transactional(self) -> bool:
        return self.producer_id >= 0


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a parked request, addressed by the token it came with."""

    token: RequestToken
    response: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorResult(Generic[R]):
    """Records to append and the answers to send once they are durable (see the module docstring)."""

    response: R | None = None
    writes: tuple[Write, ...] = ()
    replies: tuple[Reply, ...] = ()
    effects: tuple[object, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.writes or self.replies or self.effects) and self.response is None


NOTHING: CoordinatorResult[Any] = CoordinatorResult()
