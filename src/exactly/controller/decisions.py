"""The controller's reactions to cluster events, as lists of conditional state-znode writes.

Events (Kafka's ``KafkaController``): broker failure, broker start-up, broker bounce (the same id
re-registered with a larger broker epoch = czxid: failure handling first, then start-up), new
partitions, controlled shutdown, preferred leader election, auto leader rebalance.

Rules that hold for every decision here:

* Only the controller changes ``leader`` or ``leader_epoch``, always to ``leader_epoch + 1``, and
  it also bumps the epoch when it removes a dead or shutting-down replica from the ISR with the
  leader unchanged (``ReplicaStateMachine.doRemoveReplicasFromIsr``), so followers notice and
  truncate.
* The ISR never becomes empty: removing its last member keeps it (with leader -1), so a clean
  election can later pick only that broker.
* A partition with no eligible leader keeps its state: it stays offline (leader -1) rather than
  elect a replica that may lack acknowledged data, unless unclean election is enabled for its topic.
* Decisions that would not change a znode are not emitted (Kafka would still bump the epoch when
  it re-removes a replica that is the last ISR member of a leaderless partition; nothing observes
  that bump, so we skip the write).

Each :class:`StateChange` carries the zkVersion it was computed against; several changes of one
partition in one event are ordered and expect consecutive versions (a successful setData always
increments the version by one). The shell applies them in order with the ``/controller_epoch``
check; on BADVERSION it re-reads and recomputes.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from exactly.cluster.znodes import NO_LEADER, LeaderAndIsr, PartitionState
from exactly.controller.context import ControllerContext
from exactly.controller.election import (
    controlled_shutdown_leader,
    initial_leader,
    offline_partition_leader,
    preferred_replica_leader,
)
from exactly.types import TopicPartition

NEW_ZNODE = -1  # expected zk version of a state znode that does not exist yet (create, not set)


class ChangeReason(enum.Enum):
    NEW_PARTITION = "new partition"
    OFFLINE_ELECTION = "leader election after failure"
    UNCLEAN_ELECTION = "unclean leader election"
    ISR_REMOVAL = "replica removed from ISR"
    CONTROLLED_SHUTDOWN = "controlled shutdown election"
    PREFERRED_ELECTION = "preferred leader election"


@dataclass(frozen=True, slots=True)
class StateChange:
    tp: TopicPartition
    new: LeaderAndIsr
    expected_zk_version: int  # NEW_ZNODE: create the znode
    reason: ChangeReason


@dataclass(frozen=True, slots=True)
class BrokerChange:
    """The difference between two reads of ``/brokers/ids`` (ids with their czxid)."""

    dead: frozenset[int]
    started: frozenset[int]
    bounced: frozenset[int]  # same id, larger broker epoch: it lost its session and came back

    @property
    def empty(self) -> bool:
        return not (self.dead or self.started or self.bounced)


def diff_brokers(previous: Mapping[int, int], current: Mapping[int, int]) -> BrokerChange:
    """Compare broker id -> broker epoch maps. A watch may merge several changes; comparing the
    epochs (not counting events) still finds a broker that died and came back in between."""
    dead = frozenset(previous.keys() - current.keys())
    started = frozenset(current.keys() - previous.keys())
    bounced = frozenset(b for b in previous.keys() & current.keys() if current[b] > previous[b])
    return BrokerChange(dead, started, bounced)


def apply(ctx: ControllerContext, changes: Iterable[StateChange]) -> ControllerContext:
    """The context after ``changes`` were written (each write bumps the znode version by one)."""
    states = dict(ctx.states)
    for change in changes:
        states[change.tp] = PartitionState(change.new, change.expected_zk_version + 1)
    return replace(ctx, states=states)


def _sorted(tps: Iterable[TopicPartition]) -> list[TopicPartition]:
    return sorted(tps, key=lambda tp: (tp.topic, tp.partition))


def _without(isr: tuple[int, ...], brokers: frozenset[int]) -> tuple[int, ...]:
    """Remove ``brokers`` from an ISR, keeping the last member if all would go."""
    kept = tuple(b for b in isr if b not in brokers)
    return kept if kept else isr[-1:]


def _elect_offline(ctx: ControllerContext, tp: TopicPartition, state: PartitionState) -> StateChange | None:
    current = state.leader_and_isr
    result = offline_partition_leader(
        ctx.assignments.get(tp, ()),
        current.isr,
        ctx.live_brokers.keys() - ctx.shutting_down,
        unclean_enabled=ctx.unclean_election(tp.topic),
    )
    if result is None:
        return None
    reason = ChangeReason.UNCLEAN_ELECTION if result.unclean else ChangeReason.OFFLINE_ELECTION
    new = current.new_leader_and_isr(result.leader, result.isr, ctx.controller_epoch)
    return StateChange(tp, new, state.zk_version, reason)


def on_brokers_failed(ctx: ControllerContext, dead: Iterable[int]) -> list[StateChange]:
    """``ctx.live_brokers`` no longer holds ``dead``. Partitions they led get a new leader from the
    live ISR (or go leaderless, keeping a non-empty ISR); partitions they only followed lose them
    from the ISR, with a leader-epoch bump."""
    dead_set = frozenset(dead)
    changes: list[StateChange] = []
    for tp in _sorted(ctx.assignments):
        if not dead_set.intersection(ctx.assignments[tp]):
            continue
        state = ctx.states.get(tp)
        if state is None:
            continue
        current = state.leader_and_isr
        if current.leader in dead_set or current.leader == NO_LEADER:
            elected = _elect_offline(ctx, tp, state)
            if elected is not None:
                changes.append(elected)
                continue
            new_isr = _without(current.isr, dead_set)
            if current.leader == NO_LEADER and new_isr == current.isr:
                continue
            new = current.new_leader_and_isr(NO_LEADER, new_isr, ctx.controller_epoch)
            changes.append(StateChange(tp, new, state.zk_version, ChangeReason.ISR_REMOVAL))
        elif dead_set.intersection(current.isr):
            new_isr = _without(current.isr, dead_set)
            new = current.new_leader_and_isr(current.leader, new_isr, ctx.controller_epoch)
            changes.append(StateChange(tp, new, state.zk_version, ChangeReason.ISR_REMOVAL))
    return changes


def elect_offline_partitions(ctx: ControllerContext) -> list[StateChange]:
    """Kafka's ``triggerOnlinePartitionStateChange``: retry the election of every partition without
    a live leader. Runs after broker start-ups and at controller failover."""
    changes: list[StateChange] = []
    for tp in _sorted(ctx.states):
        state = ctx.states[tp]
        leader = state.leader_and_isr.leader
        if leader != NO_LEADER and ctx.is_live(leader):
            continue
        elected = _elect_offline(ctx, tp, state)
        if elected is not None:
            changes.append(elected)
    return changes


def stale_replicas(ctx: ControllerContext) -> dict[TopicPartition, frozenset[int]]:
    """Per partition, the live brokers its state znode names (leader or ISR member) although it
    was written before their registration (mzxid < broker epoch): that leadership or membership
    belonged to an earlier incarnation, which ended without any controller seeing it (the broker
    re-registered while there was no controller, e.g. after ZooKeeper expired every session at
    once).

    The current incarnation cannot be named by such a write: it did not exist yet, and every later
    write naming it has a larger mzxid. Left alone, the state keeps a leader that refuses to lead
    on a decision older than its registration (``replication.roles``' AWAIT_CONTROLLER), and no
    controller would ever rewrite it."""
    stale: dict[TopicPartition, frozenset[int]] = {}
    for tp, state in ctx.states.items():
        written = ctx.state_zxids.get(tp)
        if written is None:
            continue
        current = state.leader_and_isr
        named = {current.leader, *current.isr}
        found = frozenset(b for b in named if b in ctx.live_brokers and written < ctx.live_brokers[b])
        if found:
            stale[tp] = found
    return stale


def on_controller_failover(ctx: ControllerContext) -> list[StateChange]:
    """A newly elected controller's bootstrap (Kafka's state machines' start-up): replicas on
    brokers that are not live go offline (leaders re-elected, ISR membership removed with an epoch
    bump), then every partition still without a live leader gets an election attempt. The previous
    controller may have died before handling those failures, so nothing can be assumed done.

    A replica named by a state written for an earlier incarnation (:func:`stale_replicas`) is
    handled as failed in that partition, as :func:`on_broker_change` handles a bounce, and can
    then be elected again by the offline pass. Kafka needs no such step: its new controller sends
    LeaderAndIsr to every live broker, which a restarted broker obeys, whereas brokers that watch
    ZooKeeper lead only on a state written after their registration."""
    dead = frozenset(b for replicas in ctx.assignments.values() for b in replicas if not ctx.is_live(b))
    stale = stale_replicas(ctx)
    changes: list[StateChange] = []
    for tp in _sorted(ctx.assignments):
        gone = dead.intersection(ctx.assignments[tp]) | stale.get(tp, frozenset())
        if not gone:
            continue
        view = replace(
            ctx,
            assignments={tp: ctx.assignments[tp]},
            live_brokers={b: e for b, e in ctx.live_brokers.items() if b not in gone},
        )
        changes.extend(on_brokers_failed(view, gone))
    return changes + elect_offline_partitions(apply(ctx, changes))


def on_broker_change(ctx: ControllerContext, change: BrokerChange) -> list[StateChange]:
    """``ctx`` has the *current* live brokers. Bounced brokers are handled as failed first (their
    old incarnation's ISR membership and leadership end), then everyone returning gets a chance
    to lead offline partitions."""
    gone = change.dead | change.bounced
    changes: list[StateChange] = []
    if gone:
        live_without = {b: e for b, e in ctx.live_brokers.items() if b not in change.bounced}
        failed_ctx = replace(ctx, live_brokers=live_without)
        changes = on_brokers_failed(failed_ctx, gone)
    if change.started or change.bounced:
        changes.extend(elect_offline_partitions(apply(ctx, changes)))
    return changes


def new_partitions(ctx: ControllerContext, tps: Iterable[TopicPartition]) -> list[StateChange]:
    """Initial state of partitions that have an assignment but no state znode: the first live
    replica leads at epoch 0 with the live replicas as ISR. A partition with no live replica gets
    nothing (Kafka leaves it in NewPartition and logs); it is retried at the next broker change."""
    changes: list[StateChange] = []
    for tp in _sorted(tps):
        if tp in ctx.states:
            continue
        result = initial_leader(ctx.assignments.get(tp, ()), ctx.live_brokers.keys() - ctx.shutting_down)
        if result is None:
            continue
        new = LeaderAndIsr(result.leader, 0, result.isr, ctx.controller_epoch)
        changes.append(StateChange(tp, new, NEW_ZNODE, ChangeReason.NEW_PARTITION))
    return changes


@dataclass(frozen=True, slots=True)
class ControlledShutdownDecision:
    changes: tuple[StateChange, ...]
    # Partitions (RF > 1) the broker still leads after the changes: the broker retries until empty.
    remaining_leaderships: frozenset[TopicPartition]


def controlled_shutdown(ctx: ControllerContext, broker: int) -> ControlledShutdownDecision:
    """Kafka's ``doControlledShutdown``: ``ctx.shutting_down`` includes ``broker``. Leaderships of
    replicated partitions move to another live ISR member; where it only follows, it leaves the
    ISR (epoch +1). Single-replica partitions stay led by it until it exits."""
    shutting = ctx.shutting_down | {broker}
    changes: list[StateChange] = []
    remaining: set[TopicPartition] = set()
    for tp in ctx.partitions_on(broker):
        state = ctx.states.get(tp)
        assignment = ctx.assignments[tp]
        if state is None or len(assignment) <= 1:
            continue
        current = state.leader_and_isr
        if current.leader == broker:
            result = controlled_shutdown_leader(assignment, current.isr, ctx.live_brokers, shutting)
            if result is None:
                remaining.add(tp)
                continue
            new = current.new_leader_and_isr(result.leader, result.isr, ctx.controller_epoch)
            changes.append(StateChange(tp, new, state.zk_version, ChangeReason.CONTROLLED_SHUTDOWN))
        elif broker in current.isr:
            new_isr = _without(current.isr, frozenset({broker}))
            if new_isr == current.isr:
                continue
            new = current.new_leader_and_isr(current.leader, new_isr, ctx.controller_epoch)
            changes.append(StateChange(tp, new, state.zk_version, ChangeReason.ISR_REMOVAL))
    return ControlledShutdownDecision(tuple(changes), frozenset(remaining))


def controlled_shutdowns(ctx: ControllerContext) -> list[StateChange]:
    """Every broker in ``ctx.shutting_down`` that is live, one after the other (each decision sees
    the previous ones applied, so two brokers leaving at once never hand leadership to each other
    and one partition's changes expect consecutive zkVersions). Re-running it is harmless: a moved
    leadership or a completed ISR removal produces no change the second time."""
    changes: list[StateChange] = []
    for broker in sorted(ctx.shutting_down):
        if not ctx.is_live(broker):
            continue
        decision = controlled_shutdown(apply(ctx, changes), broker)
        changes.extend(decision.changes)
    return changes


def controlled_shutdown_pending(
    broker: int,
    states: Mapping[TopicPartition, LeaderAndIsr],
    assignments: Mapping[TopicPartition, tuple[int, ...]],
    available: Collection[int],
) -> frozenset[TopicPartition]:
    """What a shutting-down broker waits for, read from the states it observes: partitions
    (RF > 1) it still leads although another replica could take over, i.e. one that is live and
    not shutting down (``available``), and partitions whose ISR it is still in next to others.
    Empty once the controller's ``controlled_shutdown`` is applied: Kafka's broker waits for the
    controller's answer instead, which lists ``remaining_leaderships`` including partitions nobody
    else can take; waiting for those only delays the exit by the retry back-offs (with every other
    replica gone nothing can change), so they do not count here."""
    pending = set()
    for tp, state in states.items():
        replicas = assignments.get(tp, ())
        if len(replicas) <= 1 or broker not in replicas:
            continue
        if state.leader == broker:
            if any(b != broker and b in available for b in replicas):
                pending.add(tp)
        elif broker in state.isr and len(state.isr) > 1:
            pending.add(tp)
    return frozenset(pending)


def preferred_elections(ctx: ControllerContext, tps: Iterable[TopicPartition]) -> list[StateChange]:
    """Move leadership back to the first assigned replica where it is live, in the ISR and not
    already leading; other partitions are left alone (Kafka answers them PREFERRED_LEADER_NOT_AVAILABLE
    or ELECTION_NOT_NEEDED)."""
    changes: list[StateChange] = []
    for tp in _sorted(tps):
        state = ctx.states.get(tp)
        assignment = ctx.assignments.get(tp, ())
        if state is None or not assignment or state.leader_and_isr.leader == assignment[0]:
            continue
        current = state.leader_and_isr
        live = ctx.live_brokers.keys() - ctx.shutting_down
        result = preferred_replica_leader(assignment, current.isr, live)
        if result is None:
            continue
        new = current.new_leader_and_isr(result.leader, result.isr, ctx.controller_epoch)
        changes.append(StateChange(tp, new, state.zk_version, ChangeReason.PREFERRED_ELECTION))
    return changes


def imbalanced_partitions(ctx: ControllerContext, imbalance_percentage: int = 10) -> list[TopicPartition]:
    """Kafka's ``checkAndTriggerAutoLeaderRebalance``: for each live preferred broker, the share of
    its preferred partitions led by someone else; above ``leader.imbalance.per.broker.percentage``
    those partitions are candidates for preferred election."""
    by_preferred: dict[int, list[TopicPartition]] = {}
    for tp, replicas in ctx.assignments.items():
        if replicas:
            by_preferred.setdefault(replicas[0], []).append(tp)
    candidates: list[TopicPartition] = []
    for broker, tps in sorted(by_preferred.items()):
        if not ctx.is_live(broker) or broker in ctx.shutting_down:
            continue
        not_led = [
            tp for tp in tps if (s := ctx.states.get(tp)) is not None and s.leader_and_isr.leader != broker
        ]
        if len(not_led) / len(tps) > imbalance_percentage / 100:
            candidates.extend(not_led)
    return _sorted(candidates)
