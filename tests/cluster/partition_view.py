"""What a broker says about one partition over the wire: Metadata v9 (and waiting on it),
ListOffsets v4 and OffsetsForLeaderEpoch v3 with the current leader epoch a client believes.

The failover tests need the leader *epoch* and the partition's error code, which the
confluent admin client does not expose; they also must not fail when the asked broker is the one
just killed (``view`` answers None then, and the waits simply ask again).

Ask the broker the next request goes to: each broker applies an observed state to its metadata
cache and to its role in the same step, so once *it* reports itself leader at an epoch it also
serves as one; another broker's view may be ahead of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from exactly.client.wire import WireError
from exactly.protocol.apis import ApiKey
from tests.cluster.helpers import by_id, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient

METADATA_VERSION = 9


@dataclass(frozen=True, slots=True)
class PartitionView:
    error_code: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def view(broker: Broker, topic: str, partition: int = 0) -> PartitionView | None:
    """``broker``'s Metadata answer for one partition; None if it cannot be asked or does not
    know the topic (yet)."""
    if not broker.running:
        return None
    try:
        with WireClient(broker.bootstrap, timeout=5) as wire:
            mod = wire.module(ApiKey.METADATA, METADATA_VERSION)
            response = wire.call(
                ApiKey.METADATA,
                METADATA_VERSION,
                topics=(mod.MetadataRequestTopic(name=TopicName(topic)),),
                allow_auto_topic_creation=False,
            )
    except (OSError, WireError):
        return None
    for t in response.topics:
        if t.name != topic or int(t.error_code) != 0:
            continue
        for p in t.partitions:
            if int(p.partition_index) == partition:
                return PartitionView(
                    int(p.error_code),
                    int(p.leader_id),
                    int(p.leader_epoch),
                    tuple(int(b) for b in p.replica_nodes),
                    tuple(int(b) for b in p.isr_nodes),
                )
    return None


def wait_for_view(
    broker: Broker,
    topic: str,
    condition: Callable[[PartitionView], bool],
    *,
    partition: int = 0,
    timeout: float = 30.0,
    what: str = "partition state",
) -> PartitionView:
    """Ask ``broker`` until its view of the partition satisfies ``condition``; return that view."""
    seen: list[PartitionView | None] = [None]

    def check() -> bool:
        current = view(broker, topic, partition)
        seen[0] = current
        return current is not None and condition(current)

    try:
        wait_for(check, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last view from {broker.name}: {seen[0]}") from None
    result = seen[0]
    assert result is not None
    return result


def kill_leader(
    brokers: list[Broker], topic: str, before: PartitionView | None = None, *, partition: int = 0
) -> tuple[Broker, PartitionView]:
    """SIGKILL the partition's leader -- the one ``before`` names, or by default the one a running
    broker names now -- and wait until a surviving broker names another leader at a newer leader
    epoch (the controller acts once the victim's session expired); -> (the victim, that view)."""
    if before is None:
        asked = next(b for b in brokers if b.running)
        before = wait_for_view(asked, topic, lambda v: v.leader >= 0, partition=partition, what="a leader")
    old = before
    victim = by_id(brokers, old.leader)
    victim.kill()
    witness = next(b for b in brokers if b.running)
    after = wait_for_view(
        witness,
        topic,
        lambda v: v.leader not in (-1, old.leader) and v.leader_epoch > old.leader_epoch,
        partition=partition,
        what=f"a new leader of {topic}-{partition}",
    )
    return victim, after


def list_offsets_code(
    wire: WireClient,
    topic: str,
    current_leader_epoch: int,
    *,
    timestamp: int = -1,
    isolation: int = 1,
    version: int = 5,
) -> tuple[int, int, int]:
    """ListOffsets v4+ (default: v5, latest, read_committed) -> (error code, offset, leader
    epoch)."""
    mod = wire.module(ApiKey.LIST_OFFSETS, version)
    response = wire.call(
        ApiKey.LIST_OFFSETS,
        version,
        replica_id=BrokerId(-1),
        isolation_level=i8(isolation),
        topics=(
            mod.ListOffsetsTopic(
                name=TopicName(topic),
                partitions=(
                    mod.ListOffsetsPartition(
                        partition_index=i32(0),
                        current_leader_epoch=i32(current_leader_epoch),
                        timestamp=i64(timestamp),
                    ),
                ),
            ),
        ),
    )
    (p,) = response.topics[0].partitions
    return int(p.error_code), int(p.offset), int(p.leader_epoch)


def offsets_for_epoch(
    wire: WireClient, topic: str, current_leader_epoch: int, epoch: int, *, version: int = 3
) -> tuple[int, int, int]:
    """OffsetsForLeaderEpoch as a consumer -> (error code, epoch, end offset); v2 (no replica
    id) is the version librdkafka validates its position with (KIP-320)."""
    mod = wire.module(ApiKey.OFFSET_FOR_LEADER_EPOCH, version)
    response = wire.call(
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
        version,
        replica_id=BrokerId(-1),
        topics=(
            mod.OffsetForLeaderTopic(
                topic=TopicName(topic),
                partitions=(
                    mod.OffsetForLeaderPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(current_leader_epoch),
                        leader_epoch=i32(epoch),
                    ),
                ),
            ),
        ),
    )
    (p,) = response.topics[0].partitions
    return int(p.error_code), int(p.leader_epoch), int(p.end_offset)
