"""Producer ids from ZooKeeper blocks: two brokers never collide, neither across restarts."""

from __future__ import annotations

import threading
from collections.abc import Callable

from exactly.cluster import znodes as zn
from exactly.cluster.producer_ids import ZkProducerIdManager, allocate_block
from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import ProducerIdBlock
from tests.cluster.helpers import wait_for

Factory = Callable[[], ClusterZk]


def test_first_blocks_follow_kafkas_format(cluster_zk: Factory) -> None:
    zk = cluster_zk()
    assert allocate_block(zk.client, 1) == ProducerIdBlock(1, 0, 999)
    assert allocate_block(zk.client, 2) == ProducerIdBlock(2, 1000, 1999)
    raw = zk.client.get(zn.LATEST_PRODUCER_ID_BLOCK)[0]
    assert raw == b'{"version":1,"broker":2,"block_start":"1000","block_end":"1999"}'


def test_two_brokers_never_collide_including_restarts(cluster_zk: Factory) -> None:
    sessions = {1: cluster_zk(), 2: cluster_zk()}
    seen: dict[int, list[int]] = {1: [], 2: []}

    def run(broker: int, count: int) -> None:
        manager = ZkProducerIdManager(sessions[broker].client, broker, block_size=10)
        seen[broker].extend(manager.generate() for _ in range(count))

    for _incarnation in range(3):  # each round is a restart: a fresh manager per broker
        threads = [threading.Thread(target=run, args=(b, 95)) for b in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    everything = seen[1] + seen[2]
    assert len(everything) == 6 * 95
    assert len(set(everything)) == len(everything)  # cluster-wide unique
    assert all(a < b for a, b in zip(seen[1], seen[1][1:]))  # increasing per broker
    # a restarted broker's ids are above everything that broker handed out before
    assert min(seen[1][95:190]) > max(seen[1][:95])


def test_prefetch_keeps_generate_off_zookeeper(cluster_zk: Factory) -> None:
    zk = cluster_zk()
    manager = ZkProducerIdManager(zk.client, 1, block_size=10)
    # the 9th id uses 90% of the block: the next one is fetched in the background
    assert [manager.generate() for _ in range(10)] == list(range(10))
    wait_for(lambda: manager.has_block, what="the next block to be prefetched")
    latest = ProducerIdBlock.decode(zk.client.get(zn.LATEST_PRODUCER_ID_BLOCK)[0])
    assert latest == ProducerIdBlock(1, 10, 19)
    assert manager.generate() == 10
    # generate took no new block itself
    assert ProducerIdBlock.decode(zk.client.get(zn.LATEST_PRODUCER_ID_BLOCK)[0]) == latest


def test_prefetch_at_start_up_takes_the_first_block(cluster_zk: Factory) -> None:
    zk = cluster_zk()
    manager = ZkProducerIdManager(zk.client, 3)
    manager.prefetch()
    wait_for(lambda: manager.has_block, what="the first block")
    assert manager.generate() == 0
    assert ProducerIdBlock.decode(zk.client.get(zn.LATEST_PRODUCER_ID_BLOCK)[0]) == ProducerIdBlock(3, 0, 999)
