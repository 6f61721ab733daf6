"""Replica assignment for new topics and partitions (Kafka's rack-unaware AdminUtils).

Why Kafka's exact algorithm: it spreads leaders (first replicas) round-robin over the brokers from
a random start, and shifts the followers by a second offset that grows every ``len(brokers)``
partitions, so that no two brokers always follow each other. Reproducing it keeps partition
placement (and therefore leader load) familiar to Kafka operators, and the fixed-start-index form
makes it testable.

Brokers are taken in ascending id order (Kafka sorts the broker metadata by id).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping


class InvalidReplicationFactorError(ValueError):
    """Kafka's INVALID_REPLICATION_FACTOR: RF <= 0 or larger than the live brokers."""


class InvalidPartitionsError(ValueError):
    """Kafka's INVALID_PARTITIONS: a non-positive count, or not an increase."""


def assign_replicas(
    brokers: Iterable[int],
    partitions: int,
    replication_factor: int,
    *,
    fixed_start_index: int = -1,
    start_partition_id: int = -1,
    rng: random.Random | None = None,
) -> dict[int, tuple[int, ...]]:
    """Replicas for ``partitions`` new partitions, numbered from ``max(0, start_partition_id)``.

    ``fixed_start_index`` >= 0 pins both the first broker index and the follower shift (Kafka uses
    it for added partitions and tests); otherwise both are random.
    """
    broker_list = sorted(set(brokers))
    if partitions <= 0:
        raise InvalidPartitionsError("Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
    if replication_factor > len(broker_list):
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: {len(broker_list)}."
        )
    n = len(broker_list)
    rand = rng or random.Random()
    start_index = fixed_start_index if fixed_start_index >= 0 else rand.randrange(n)
    shift = fixed_start_index if fixed_start_index >= 0 else rand.randrange(n)
    partition_id = max(0, start_partition_id)
    result: dict[int, tuple[int, ...]] = {}
    for _ in range(partitions):
        if partition_id > 0 and partition_id % n == 0:
            shift += 1
        first = (partition_id + start_index) % n
        replicas = [broker_list[first]]
        replicas.extend(
            broker_list[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)
        )
        result[partition_id] = tuple(replicas)
        partition_id += 1
    return result


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_added_partitions(
    brokers: Iterable[int], existing: Mapping[int, tuple[int, ...]], new_total: int
) -> dict[int, tuple[int, ...]]:
    """Replicas for the partitions CreatePartitions adds (Kafka's AdminZkClient.createNewPartitionsAssignment):
    same RF as partition 0, start index = the position of partition 0's first replica (or the first
    broker id above it) so the round-robin continues where the topic's creation left off."""
    if not existing or 0 not in existing:
        raise InvalidPartitionsError("the topic has no partition 0 to extend")
    to_add = new_total - len(existing)
    if to_add <= 0:
        raise InvalidPartitionsError(
            f"The number of partitions for a topic can only be increased. Topic currently has "
            f"{len(existing)} partitions, {new_total} would not be an increase."
        )
    broker_list = sorted(set(brokers))
    first_of_p0 = existing[0][0]
    start_index = next((i for i, b in enumerate(broker_list) if b >= first_of_p0), -1)
    return assign_replicas(
        broker_list,
        to_add,
        len(existing[0]),
        fixed_start_index=max(0, start_index),
        start_partition_id=len(existing),
    )
