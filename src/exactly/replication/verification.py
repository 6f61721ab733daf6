"""Replica verification (Kafka's ``kafka-replica-verification.sh``): do the replicas of a partition
hold the same batches at the same offsets, byte for byte, up to the high watermark?

Why: replication bugs (a follower that appends at the wrong offset, a truncation that cuts too
little or too much, a zombie leader's tail that survives) do not show up to a consumer reading
from the leader; they show up when leadership moves. Comparing the replicas directly finds them
while the evidence is still there.

What is compared: each replica contributes its batches from the start of its log up to its own
high watermark (what a replica has *committed* as far as it knows; a follower's HW lags the
leader's by one fetch round). Only the range every replica has committed is comparable: offsets
below the smallest high watermark, from the largest log start offset (retention may have removed
a replica's oldest segments before another's). In that range every replica must hold the same batches (same
base and last offset, same bytes, which include the leader epoch stamped by the leader). A
replica whose high watermark is below the others' is *lagging*, not wrong; Kafka's tool reports
that as the maximum lag.

Invariant of the result: ``consistent`` is true iff no two replicas differ below
``compared_up_to``; ``in_sync`` additionally requires every replica to report the same high
watermark (a quiet cluster converges to that within one follower fetch round).

Sans-IO: the caller reads the batches (over the wire with the debug replica id -2, or from data
directories) and hands them in.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exactly.types import TopicPartition


@dataclass(frozen=True, slots=True)
class ReplicaBatch:
    """One batch as a replica holds it: offsets and the whole batch's bytes."""

    base_offset: int
    last_offset: int
    data: bytes

    @property
    def checksum(self) -> int:
        return zlib.crc32(self.data)


@dataclass(frozen=True, slots=True)
class ReplicaLog:
    """What one replica returned: its batches from the log start up to ``high_watermark``."""

    broker_id: int
    high_watermark: int
    batches: tuple[ReplicaBatch, ...]
    log_start_offset: int = 0


@dataclass(frozen=True, slots=True)
class Difference:
    """The first place where ``broker_id``'s replica departs from the reference replica."""

    broker_id: int
    reference_id: int
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"replica {self.broker_id} differs from {self.reference_id} at offset {self.offset}: {self.reason}"


@dataclass(frozen=True, slots=True)
class PartitionVerdict:
    tp: TopicPartition
    compared_up_to: int  # offsets below this were compared (the smallest high watermark)
    high_watermarks: Mapping[int, int]  # broker id -> the HW that replica reported
    batches: int  # batches compared (of the reference replica)
    differences: tuple[Difference, ...]
    unreachable: tuple[str, ...] = ()  # replicas that could not be read, with why

    @property
    def consistent(self) -> bool:
        return not self.differences and not self.unreachable

    @property
    def max_lag(self) -> int:
        if not self.high_watermarks:
            return 0
        return max(self.high_watermarks.values()) - min(self.high_watermarks.values())

    @property
    def in_sync(self) -> bool:
        return self.consistent and self.max_lag == 0

    def describe(self) -> str:
        hws = ", ".join(f"{b}:{hw}" for b, hw in sorted(self.high_watermarks.items()))
        head = (
            f"{self.tp.topic}-{self.tp.partition}: {self.batches} batches below offset "
            f"{self.compared_up_to} compared, high watermarks {{{hws}}}, max lag {self.max_lag}"
        )
        lines = [
            head,
            *(f"  {d}" for d in self.differences),
            *(f"  unreachable: {u}" for u in self.unreachable),
        ]
        return "\n".join(lines)


def compare_replicas(
    tp: TopicPartition,
    logs: Sequence[ReplicaLog],
    reference_id: int | None = None,
    unreachable: Sequence[str] = (),
) -> PartitionVerdict:
    """Compare ``logs`` (one per reachable replica) from the largest log start offset to the
    smallest high watermark.

    The reference is ``reference_id``'s log (the leader, when known) or the first one. Each other
    replica reports at most one difference: its first divergence, as later ones follow from it.
    """
    if not logs:
        return PartitionVerdict(tp, 0, {}, 0, (), tuple(unreachable))
    by_id = {log.broker_id: log for log in logs}
    reference = by_id.get(reference_id, logs[0]) if reference_id is not None else logs[0]
    bound = min(log.high_watermark for log in logs)
    start = max(log.log_start_offset for log in logs)
    ref_batches = _within(reference.batches, start, bound)
    differences: list[Difference] = []
    for log in logs:
        if log is reference:
            continue
        difference = _first_difference(ref_batches, _within(log.batches, start, bound), bound)
        if difference is not None:
            offset, reason = difference
            differences.append(Difference(log.broker_id, reference.broker_id, offset, reason))
    return PartitionVerdict(
        tp,
        bound,
        {log.broker_id: log.high_watermark for log in logs},
        len(ref_batches),
        tuple(differences),
        tuple(unreachable),
    )


def _within(batches: Sequence[ReplicaBatch], start: int, bound: int) -> list[ReplicaBatch]:
    return [b for b in batches if b.last_offset >= start and b.base_offset < bound]


def _first_difference(
    reference: Sequence[ReplicaBatch], other: Sequence[ReplicaBatch], bound: int
) -> tuple[int, str] | None:
    for ref, mine in zip(reference, other, strict=False):
        if (ref.base_offset, ref.last_offset) != (mine.base_offset, mine.last_offset):
            return (
                min(ref.base_offset, mine.base_offset),
                f"batch {mine.base_offset}-{mine.last_offset} where the reference has "
                f"{ref.base_offset}-{ref.last_offset}",
            )
        if ref.data != mine.data:
            return (
                ref.base_offset,
                f"batch {ref.base_offset}-{ref.last_offset} has other bytes "
                f"(crc32 {mine.checksum:08x} != {ref.checksum:08x}, {len(mine.data)} != {len(ref.data)} bytes)",
            )
    if len(reference) != len(other):
        longer, which = (
            (reference, "only the reference") if len(reference) > len(other) else (other, "only this replica")
        )
        extra = longer[min(len(reference), len(other))]
        return extra.base_offset, f"{which} has batch {extra.base_offset}-{extra.last_offset} below {bound}"
    return None
