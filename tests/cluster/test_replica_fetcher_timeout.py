"""A follower whose Fetch response is lost reconnects after ``replica.socket.timeout.ms``.

Every broker advertises a fault proxy (the chaos suite's cluster set-up), so the followers fetch
from the leader through it. The proxy swallows the next Fetch responses, without closing the
connection: a fetcher that waited for them forever never fetched from that leader again (found by
the cluster chaos suite, seed 7 of the first 50: a follower out of the ISR for good after a
dropped response). Kafka's fetcher times the request out and reconnects; so must ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.cluster.zk import ClusterZk
from tests.cluster.fault_helpers import TOPIC, create_topic, isr_full, partition_states, produce_acked
from tests.cluster.helpers import await_registered, await_replicas_identical, cluster_overrides, wait_for
from tests.support.broker import Broker
from tests.support.proxy import FaultProxy

FETCH = 1
SOCKET_TIMEOUT_MS = 2_000


@pytest.fixture
def proxied_cluster(zk_connect: str, tmp_path: Path) -> Iterator[tuple[list[Broker], list[FaultProxy]]]:
    proxies = [FaultProxy().start() for _ in range(3)]
    brokers = [
        Broker(
            tmp_path / f"broker-{i}",
            tmp_path / f"broker-{i}.log",
            overrides={
                **cluster_overrides(zk_connect, i),
                "advertised.listeners": proxies[i].advertised_listener,
                "replica.socket.timeout.ms": str(SOCKET_TIMEOUT_MS),
            },
            name=f"broker-{i}",
        )
        for i in range(3)
    ]
    try:
        for broker, proxy in zip(brokers, proxies, strict=True):
            broker.start()
            proxy.set_upstream(broker.host, broker.port or 0)
        await_registered(brokers)
        yield brokers, proxies
    finally:
        for broker in brokers:
            broker.close()
        for proxy in proxies:
            proxy.close()


@pytest.mark.slow
def test_followers_recover_from_lost_fetch_responses(
    proxied_cluster: tuple[list[Broker], list[FaultProxy]], zk: ClusterZk
) -> None:
    brokers, proxies = proxied_cluster
    create_topic(brokers, zk)
    produce_acked(brokers, range(0, 10))
    leader = partition_states(zk)[0].leader
    proxy = proxies[leader]
    proxy.drop_responses(2, api_keys=FETCH, close=False)  # one parked fetch of each follower
    wait_for(lambda: proxy.pending_drops() == 0, timeout=15, what="both fetch responses dropped")
    produce_acked(brokers, range(10, 20))  # acks=all with min.insync.replicas 2: a follower must fetch
    wait_for(lambda: isr_full(zk), timeout=30, what="both followers in the ISR")
    verdicts = await_replicas_identical(proxy.bootstrap, [TOPIC], timeout=30)
    assert all(v.in_sync for v in verdicts)
    assert "connection lost: TimeoutError" in "".join(b.log_text() for b in brokers)
