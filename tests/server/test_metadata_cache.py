"""The cluster-mode metadata cache: what Metadata reports from observed ZooKeeper state."""

from __future__ import annotations

from exactly.cluster.znodes import LeaderAndIsr, PartitionState, TopicAssignment
from exactly.server.metadata_cache import BrokerEndpoint, CachedTopic, MetadataCache
from exactly.types import TopicPartition


def cache_with_topic() -> MetadataCache:
    cache = MetadataCache()
    cache.set_brokers({b: BrokerEndpoint(b, "127.0.0.1", 9000 + b) for b in (1, 2)})
    cache.set_topic(CachedTopic("t", TopicAssignment({0: (1, 2, 3), 1: (2, 3, 1)}), {}))
    return cache


def test_partitions_without_state_have_no_leader() -> None:
    cache = cache_with_topic()
    parts = cache.partitions("t")
    assert [p.leader for p in parts] == [-1, -1]
    assert not cache.has_leaders("t")


def test_offline_replicas_are_the_ones_not_registered() -> None:
    cache = cache_with_topic()
    cache.set_state(TopicPartition("t", 0), PartitionState(LeaderAndIsr(1, 4, (1, 2), 7), 3))
    p0 = cache.partitions("t")[0]
    assert (p0.leader, p0.leader_epoch, p0.isr, p0.offline_replicas) == (1, 4, (1, 2), (3,))


def test_older_state_never_replaces_newer() -> None:
    cache = cache_with_topic()
    tp = TopicPartition("t", 0)
    cache.set_state(tp, PartitionState(LeaderAndIsr(2, 5, (2,), 7), 4))
    cache.set_state(tp, PartitionState(LeaderAndIsr(1, 4, (1, 2), 7), 3))
    state = cache.state(tp)
    assert state is not None and state.leader_and_isr.leader == 2


def test_has_leaders_needs_live_leaders_for_every_partition() -> None:
    cache = cache_with_topic()
    cache.set_state(TopicPartition("t", 0), PartitionState(LeaderAndIsr(1, 0, (1, 2), 1), 0))
    assert not cache.has_leaders("t")
    cache.set_state(TopicPartition("t", 1), PartitionState(LeaderAndIsr(3, 0, (3,), 1), 0))
    assert not cache.has_leaders("t")  # broker 3 is not registered
    cache.set_state(TopicPartition("t", 1), PartitionState(LeaderAndIsr(2, 1, (2,), 1), 1))
    assert cache.has_leaders("t")
    cache.remove_topic("t")
    assert cache.partitions("t") == [] and cache.state(TopicPartition("t", 0)) is None


def test_a_leader_that_is_not_registered_is_reported_as_none() -> None:
    """Between a broker's death and the controller's election the state still names it: Kafka's
    metadata cache answers LEADER_NOT_AVAILABLE with leader -1 (and the state's epoch) then."""
    cache = cache_with_topic()
    cache.set_state(TopicPartition("t", 0), PartitionState(LeaderAndIsr(2, 4, (2, 1), 7), 3))
    assert cache.partitions("t")[0].leader == 2
    cache.set_brokers({1: BrokerEndpoint(1, "127.0.0.1", 9001)})  # broker 2's session is gone
    p0 = cache.partitions("t")[0]
    assert (p0.leader, p0.leader_epoch, p0.isr, p0.offline_replicas) == (-1, 4, (2, 1), (2, 3))
