"""Leader election strategies (Kafka's ``Election`` / ``PartitionLeaderElectionAlgorithms``).

Every strategy walks the replicas in *assignment order*, so the preferred replica (the first one)
wins whenever it is eligible. Each returns the new leader and ISR, or None when no replica is
eligible: the partition then stays offline rather than lose acknowledged data (the caller decides
what to write). The leader epoch is bumped by the caller via ``LeaderAndIsr.new_leader_and_isr``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ElectionResult:
    leader: int
    isr: tuple[int, ...]
    unclean: bool = False


def offline_partition_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], *, unclean_enabled: bool
) -> ElectionResult | None:
    """A partition whose leader died (or that has none): the first live ISR member; else, only if
    ``unclean.leader.election.enable``, the first live replica, whose log then wins (acknowledged
    data beyond it is lost). New ISR = the live part of the old ISR if the leader came from it,
    else just the leader."""
    live_isr = tuple(b for b in isr if b in live)
    leader = next((b for b in assignment if b in live and b in isr), None)
    if leader is not None:
        return ElectionResult(leader, live_isr)
    if unclean_enabled:
        leader = next((b for b in assignment if b in live), None)
        if leader is not None:
            return ElectionResult(leader, (leader,), unclean=True)
    return None


def controlled_shutdown_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], shutting_down: Collection[int]
) -> ElectionResult | None:
    """Moving leadership off brokers that are shutting down: the first live ISR member not shutting
    down; the new ISR drops the shutting-down brokers."""
    leader = next((b for b in assignment if b in live and b in isr and b not in shutting_down), None)
    if leader is None:
        return None
    return ElectionResult(leader, tuple(b for b in isr if b not in shutting_down))


def preferred_replica_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> ElectionResult | None:
    """Only the first assigned replica, and only if it is live and in the ISR; the ISR is kept."""
    if not assignment:
        return None
    preferred = assignment[0]
    if preferred in live and preferred in isr:
        return ElectionResult(preferred, tuple(isr))
    return None


def initial_leader(assignment: Sequence[int], live: Collection[int]) -> ElectionResult | None:
    """A new partition: the first live replica leads, the live replicas form the ISR (epoch 0)."""
    live_replicas = tuple(b for b in assignment if b in live)
    if not live_replicas:
        return None
    return ElectionResult(live_replicas[0], live_replicas)
