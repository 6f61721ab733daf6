"""A partition leader's view of its followers: high watermark, ISR shrink/expand, acks=all
(Kafka's ``Partition`` / ``Replica`` on the leader side).

Why it is shaped like this
--------------------------
The leader is the only broker that knows how far each follower has replicated (a follower's fetch
offset *is* its log end offset), so it owns the high watermark and the ISR. But the ISR it may act
on is the one committed to ZooKeeper, not the one it wishes: a leader that lost its session and was
replaced (a zombie) must not shrink the ISR to itself and then acknowledge acks=all writes alone.
Hence Kafka's **maximal ISR** rule, kept here:

* A change is *proposed* (:class:`IsrUpdate`, written by the shell as a conditional setData on the
  state znode's zkVersion) and adopted only by :meth:`LeaderPartition.on_isr_committed`.
* While a change is in flight, the HW and acks=all use the maximal set: the union of old and new for an expand,
  the old set for a shrink, so the leader is never less safe than either ISR. One change at a time.
* A failed write (BADVERSION: someone else, i.e. the controller, changed the znode) is dropped; the
  newer state arrives through the role decisions (a higher leader epoch, or the same epoch with a
  newer zkVersion, see :meth:`LeaderPartition.on_state_observed`).

Invariants: the high watermark never decreases; the leader is always in its ISR; ``isr`` is always
a committed znode value; time comes in as ``now_ms`` (no clock is read here).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from exactly.cluster.znodes import LeaderAndIsr

UNKNOWN_OFFSET = -1


@dataclass(frozen=True, slots=True)
class FollowerReplicaState:
    """What the leader knows of one follower (Kafka's ``ReplicaState``)."""

    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0
    # The largest t such that a fetch from this follower reached the leader's LEO as of time t.
    last_caught_up_time_ms: int = 0

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        return (
            leader_log_end_offset == self.log_end_offset or now_ms - self.last_caught_up_time_ms <= max_lag_ms
        )

    def after_fetch(
        self, fetch_offset: int, log_start_offset: int, now_ms: int, leader_log_end_offset: int
    ) -> FollowerReplicaState:
        """A fetch at ``fetch_offset`` caught up with the leader's LEO now if it reached it, and with
        the LEO of the previous fetch at that fetch's time if it reached that one."""
        if fetch_offset >= leader_log_end_offset:
            caught_up = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            caught_up = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        else:
            caught_up = self.last_caught_up_time_ms
        return FollowerReplicaState(
            log_end_offset=fetch_offset,
            log_start_offset=log_start_offset,
            last_fetch_leader_log_end_offset=max(
                leader_log_end_offset, self.last_fetch_leader_log_end_offset
            ),
            last_fetch_time_ms=now_ms,
            last_caught_up_time_ms=caught_up,
        )


@dataclass(frozen=True, slots=True)
class IsrUpdate:
    """Write ``new`` to the state znode if its version is still ``expected_zk_version``."""

    new: LeaderAndIsr
    expected_zk_version: int
    maximal_isr: frozenset[int]

    @property
    def isr(self) -> tuple[int, ...]:
        return self.new.isr


class AckOutcome(enum.Enum):
    WAIT = "wait"  # the HW has not reached the request's last offset yet
    DONE = "done"
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "not enough replicas after append"


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    high_watermark_advanced: bool
    isr_update: IsrUpdate | None


def _always(_broker: int) -> bool:
    return True


class LeaderPartition:
    """The leader side of one partition, created when this broker becomes its leader.

    ``leader_log_end_offset`` at construction is where the new epoch starts: the caller has
    recorded ``(leader_epoch, that offset)`` in the epoch cache before any append (KAFKA-7415).
    ``isr_eligible(broker)``: the broker is live and not shutting down (KAFKA-14140).
    """

    __slots__ = (
        "_followers",
        "_high_watermark",
        "_isr",
        "_pending",
        "controller_epoch",
        "epoch_start_offset",
        "isr_eligible",
        "leader_epoch",
        "leader_log_end_offset",
        "local_broker",
        "max_lag_ms",
        "replicas",
        "zk_version",
    )

    def __init__(
        self,
        *,
        local_broker: int,
        state: LeaderAndIsr,
        zk_version: int,
        replicas: Iterable[int],
        leader_log_end_offset: int,
        high_watermark: int,
        now_ms: int,
        max_lag_ms: int = 30_000,
        isr_eligible: Callable[[int], bool] = _always,
    ) -> None:
        if state.leader != local_broker:
            raise ValueError(f"state names leader {state.leader}, this is broker {local_broker}")
        self.local_broker = local_broker
        self.leader_epoch = state.leader_epoch
        self.controller_epoch = state.controller_epoch
        self.zk_version = zk_version
        self.replicas = tuple(replicas)
        self._isr = state.isr if local_broker in state.isr else (local_broker, *state.isr)
        self._pending: IsrUpdate | None = None
        self.leader_log_end_offset = leader_log_end_offset
        self.epoch_start_offset = leader_log_end_offset
        self._high_watermark = high_watermark
        self.max_lag_ms = max_lag_ms
        self.isr_eligible = isr_eligible
        # Becoming leader: followers in the ISR count as caught up now, the others never were.
        self._followers: dict[int, FollowerReplicaState] = {
            b: FollowerReplicaState(last_caught_up_time_ms=now_ms if b in self._isr else 0)
            for b in self.replicas
            if b != local_broker
        }

    # --- views ---------------------------------------------------------------------------------

    @property
    def isr(self) -> tuple[int, ...]:
        """The committed ISR (what the state znode says)."""
        return self._isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self._pending.maximal_isr if self._pending is not None else frozenset(self._isr)

    @property
    def isr_change_in_flight(self) -> bool:
        return self._pending is not None

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def follower(self, broker: int) -> FollowerReplicaState:
        return self._followers[broker]

    @property
    def followers(self) -> Mapping[int, FollowerReplicaState]:
        return dict(self._followers)

    # --- high watermark ------------------------------------------------------------------------

    def _maybe_advance_high_watermark(self, now_ms: int) -> bool:
        """HW = min LEO over the leader and every follower that is in the maximal ISR or caught up.
        A caught-up follower outside the ISR counts too, so it is not left behind while joining,
        but only if it may join (``isr_eligible``): a broker that is shutting down or gone would
        otherwise hold the HW, and every acks=all produce, for up to ``replica.lag.time.max.ms``
        after it stopped fetching (Kafka's ``shouldWaitForReplicaToJoinIsr``)."""
        candidate = self.leader_log_end_offset
        # ``maximal_isr`` without building a frozenset per call (this runs on every follower
        # fetch and leader append): the same members, tested against the tuple itself
        pending = self._pending
        maximal: Collection[int] = pending.maximal_isr if pending is not None else self._isr
        for broker, follower in self._followers.items():
            if follower.log_end_offset < candidate and (
                broker in maximal
                or (
                    follower.is_caught_up(self.leader_log_end_offset, now_ms, self.max_lag_ms)
                    and self.isr_eligible(broker)
                )
            ):
                candidate = follower.log_end_offset
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            return True
        return False

    def refresh_high_watermark(self, now_ms: int) -> bool:
        """Something outside the follower states changed (a broker left, or began shutting down):
        recompute the HW. Returns whether it advanced."""
        return self._maybe_advance_high_watermark(now_ms)

    def on_leader_append(self, log_end_offset: int, now_ms: int) -> bool:
        """The leader appended locally; with an ISR of one the HW moves at once."""
        self.leader_log_end_offset = log_end_offset
        return self._maybe_advance_high_watermark(now_ms)

    # --- follower fetches and ISR expansion ----------------------------------------------------

    def on_follower_fetch(
        self, broker: int, fetch_offset: int, log_start_offset: int, now_ms: int
    ) -> FetchOutcome:
        """A follower fetched at ``fetch_offset`` (its LEO). Call this only for fetches that did
        not return a diverging epoch (Kafka then leaves the follower's state alone)."""
        if broker not in self._followers:
            raise KeyError(f"broker {broker} is not a replica")
        self._followers[broker] = self._followers[broker].after_fetch(
            fetch_offset, log_start_offset, now_ms, self.leader_log_end_offset
        )
        update = self._maybe_expand_isr(broker)
        advanced = self._maybe_advance_high_watermark(now_ms)
        return FetchOutcome(advanced, update)

    def _maybe_expand_isr(self, broker: int) -> IsrUpdate | None:
        """A follower joins once it reached the HW *and* the start of the current leader epoch
        (a replica that has not reached this epoch could otherwise be elected without the data
        this leader committed), if it is eligible and no other change is in flight."""
        if self._pending is not None or broker in self._isr or not self.isr_eligible(broker):
            return None
        end = self._followers[broker].log_end_offset
        if end < self._high_watermark or end < self.epoch_start_offset:
            return None
        new_isr = (*self._isr, broker)
        return self._propose(new_isr, frozenset(new_isr))

    # --- ISR shrink ----------------------------------------------------------------------------

    def out_of_sync_replicas(self, now_ms: int) -> frozenset[int]:
        """ISR followers not caught up within ``replica.lag.time.max.ms`` (stuck or slow); empty
        while a change is in flight."""
        if self._pending is not None:
            return frozenset()
        return frozenset(
            b
            for b in self._isr
            if b != self.local_broker
            and not self._followers[b].is_caught_up(self.leader_log_end_offset, now_ms, self.max_lag_ms)
        )

    def maybe_shrink_isr(self, now_ms: int) -> IsrUpdate | None:
        """The periodic ``isr-expiration`` check (every ``replica.lag.time.max.ms / 2``)."""
        lagging = self.out_of_sync_replicas(now_ms)
        if not lagging:
            return None
        new_isr = tuple(b for b in self._isr if b not in lagging)
        return self._propose(new_isr, frozenset(self._isr))

    def _propose(self, new_isr: tuple[int, ...], maximal: frozenset[int]) -> IsrUpdate:
        new = LeaderAndIsr(self.local_broker, self.leader_epoch, new_isr, self.controller_epoch)
        self._pending = IsrUpdate(new, self.zk_version, maximal)
        return self._pending

    def on_isr_committed(self, update: IsrUpdate, new_zk_version: int, now_ms: int) -> bool:
        """The conditional write succeeded: adopt the ISR. Returns whether the HW advanced."""
        if update is not self._pending:
            return False
        self._pending = None
        self._isr = update.isr
        self.zk_version = new_zk_version
        return self._maybe_advance_high_watermark(now_ms)

    def on_isr_failed(self, update: IsrUpdate) -> None:
        """BADVERSION (or any failure): the change is not adopted; the newer state will come from
        ZooKeeper. The leader keeps its committed ISR and may propose again later."""
        if update is self._pending:
            self._pending = None

    def on_state_observed(self, state: LeaderAndIsr, zk_version: int, now_ms: int) -> bool:
        """The state znode was seen at the same leader epoch with a newer zkVersion (our own
        committed write, or an ISR-only change): take its ISR. Returns whether the HW advanced."""
        if state.leader_epoch != self.leader_epoch or zk_version <= self.zk_version:
            return False
        self._pending = None
        self.zk_version = zk_version
        self.controller_epoch = state.controller_epoch
        self._isr = state.isr
        return self._maybe_advance_high_watermark(now_ms)

    def on_reelected(
        self,
        state: LeaderAndIsr,
        zk_version: int,
        replicas: Iterable[int],
        leader_log_end_offset: int,
        now_ms: int,
    ) -> bool:
        """This broker leads again at a newer leader epoch without having followed in between
        (the controller removed a dead follower from the ISR, or re-elected it): Kafka's
        ``makeLeader`` for a broker that is already leader. The *same* object lives on, so
        acks=all produces parked on it keep waiting and complete as the HW moves, as Kafka's
        delayed produces do. The new epoch starts at ``leader_log_end_offset`` (the caller
        recorded it in the epoch cache first); a pending ISR change is dropped (its write, made
        at the old zkVersion, fails); followers keep the log end offsets they reported, and
        their last caught-up and last fetch times restart: now for ISR members, never for the
        others (Kafka's ``Replica.resetReplicaState`` with ``isNewLeader`` false). Returns
        whether the HW advanced (an ISR of one)."""
        if state.leader != self.local_broker or state.leader_epoch <= self.leader_epoch:
            raise ValueError(f"not a re-election of {self.local_broker} at a newer epoch: {state}")
        self.leader_epoch = state.leader_epoch
        self.controller_epoch = state.controller_epoch
        self.zk_version = zk_version
        self.replicas = tuple(replicas)
        self._isr = state.isr if self.local_broker in state.isr else (self.local_broker, *state.isr)
        self._pending = None
        self.leader_log_end_offset = leader_log_end_offset
        self.epoch_start_offset = leader_log_end_offset
        followers: dict[int, FollowerReplicaState] = {}
        for broker in self.replicas:
            if broker == self.local_broker:
                continue
            known = self._followers.get(broker, FollowerReplicaState())
            in_sync = broker in self._isr
            followers[broker] = FollowerReplicaState(
                log_end_offset=known.log_end_offset,
                log_start_offset=known.log_start_offset,
                last_fetch_leader_log_end_offset=leader_log_end_offset,
                last_fetch_time_ms=now_ms if in_sync else 0,
                last_caught_up_time_ms=now_ms if in_sync else 0,
            )
        self._followers = followers
        return self._maybe_advance_high_watermark(now_ms)

    # --- produce -------------------------------------------------------------------------------

    def check_before_append(self, required_acks: int, min_insync_replicas: int) -> ErrorCode:
        """acks=-1 with fewer committed ISR members than ``min.insync.replicas``: reject before
        writing anything. acks 0/1 ignore min.insync.replicas."""
        if required_acks == -1 and len(self._isr) < min_insync_replicas:
            return ErrorCode.not_enough_replicas
        return ErrorCode.none

    def check_acks_all(self, required_offset: int, min_insync_replicas: int) -> AckOutcome:
        """A delayed acks=-1 produce whose last offset + 1 is ``required_offset``: done once the HW
        reached it; then, if the maximal ISR shrank below ``min.insync.replicas`` meanwhile, the
        data is written but maybe not durable (NOT_ENOUGH_REPLICAS_AFTER_APPEND, the producer
        retries)."""
        if self._high_watermark < required_offset:
            return AckOutcome.WAIT
        if len(self.maximal_isr) < min_insync_replicas:
            return AckOutcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return AckOutcome.DONE
