"""``ClusterTopics`` without ZooKeeper: ids, placement, auto-creation's de-duplication and the
local replica of a cluster topic (the ZooKeeper writes run in tests/cluster)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import TopicAssignment, encode_topic_id
from exactly.server.cluster_topics import ClusterTopics
from exactly.server.config import BrokerConfig
from exactly.server.metadata_cache import BrokerEndpoint, CachedTopic, MetadataCache
from exactly.storage.config import LogConfig
from exactly.storage.log_manager import LogManager
from exactly.types import TopicPartition

NOW = 1_700_000_000_000


class Spawned:
    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        coro.close()  # not run: these tests check what is started, not the ZooKeeper write
        self.names.append(name)


async def never(predicate: Callable[[], bool], timeout_s: float) -> bool:
    return predicate()


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    yield manager
    manager.close()


def make(logs: LogManager, brokers: int, spawn: Spawned) -> ClusterTopics:
    cache = MetadataCache()
    cache.set_brokers({b: BrokerEndpoint(b, "127.0.0.1", 9000 + b) for b in range(1, brokers + 1)})
    config = BrokerConfig.load(
        None, {"zookeeper.connect": "127.0.0.1:1", "broker.id": "1", "default.replication.factor": "3"}
    )
    zk = ClusterZk(config.get("zookeeper.connect"))  # never started: nothing here touches it
    return ClusterTopics(zk, cache, logs, config, wait_for_cache=never, spawn=spawn)


def cached(name: str, topic_id: uuid.UUID | None, partitions: int = 2) -> CachedTopic:
    encoded = encode_topic_id(topic_id) if topic_id is not None else None
    return CachedTopic(name, TopicAssignment({p: (1, 2) for p in range(partitions)}, encoded), {})


def test_topic_ids_come_from_the_metadata_cache(logs: LogManager) -> None:
    topics = make(logs, 3, Spawned())
    topic_id = uuid.uuid4()
    topics.cache.set_topic(cached("orders", topic_id))
    topics.cache.set_topic(cached("legacy", None))
    assert topics.topic_id("orders") == topic_id
    assert topics.topic_id("legacy") is None and topics.topic_id("missing") is None
    assert topics.topic_name_by_id(topic_id) == "orders"
    assert topics.topic_name_by_id(uuid.uuid4()) is None


def test_placement_refuses_more_replicas_than_live_brokers(logs: LogManager) -> None:
    topics = make(logs, 2, Spawned())
    code, _, replicas = topics.plan_assignment(3, 2)
    assert code == ErrorCode.none and sorted(replicas) == [0, 1, 2]
    assert all(len(set(r)) == 2 for r in replicas.values())
    code, message, replicas = topics.plan_assignment(1, 3)
    assert code == ErrorCode.invalid_replication_factor and message and replicas == {}


def test_auto_creation_starts_once_per_topic_and_not_below_the_replication_factor(
    logs: LogManager,
) -> None:
    spawned = Spawned()
    make(logs, 2, spawned).request_auto_create("few", 1)  # default.replication.factor=3
    assert spawned.names == []
    topics = make(logs, 3, spawned)
    topics.request_auto_create("t", 1)
    topics.request_auto_create("t", 1)  # still under way: not written twice
    assert spawned.names == ["auto-create-t"]
    topics.cache.set_topic(cached("known", uuid.uuid4()))
    topics.request_auto_create("known", 1)
    assert spawned.names == ["auto-create-t"]


def test_the_local_replica_takes_the_cluster_topic_id(logs: LogManager) -> None:
    topics = make(logs, 3, Spawned())
    assert topics.local_log(TopicPartition("orders", 0)) is None  # not in the cache yet
    topic_id = uuid.uuid4()
    topics.cache.set_topic(cached("orders", topic_id, partitions=3))
    plog = topics.local_log(TopicPartition("orders", 1))
    assert plog is not None and plog.tp == TopicPartition("orders", 1)
    info = logs.topic("orders")
    assert info is not None and info.topic_id == topic_id and info.partitions == 3
    assert topics.local_log(TopicPartition("orders", 1)) is plog
