"""A restarted broker serves nothing before it has joined the cluster.

A leader killed -9 and restarted at once (same port, as a supervisor would) comes back while its
old ZooKeeper session - and with it its registration and its leadership - is still alive: it
waits for the session to expire before it can register, and the controller then elects another
leader. Until it has registered and learned its partition roles it must not answer: a broker that
served its logs as a lone broker in that window (leader epoch 0, high watermark = log end)
acknowledged acks=all writes that the newly elected leader never had, and truncated them on
joining (found by the cluster chaos suite: an acknowledged write lost, its offset reused).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.cluster.zk import ClusterZk
from tests.cluster.fault_helpers import (
    TOPIC,
    by_id,
    create_topic,
    new_leader_elected,
    partition_states,
)
from tests.cluster.helpers import await_replicas_identical, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

SESSION_MS = 3_000


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"zookeeper.session.timeout.ms": str(SESSION_MS)})


@pytest.mark.slow
def test_leader_restarted_before_its_session_expired_acknowledges_nothing_until_it_joined(
    cluster: list[Broker], zk: ClusterZk
) -> None:
    create_topic(cluster, zk)
    old_leader = partition_states(zk)[0].leader
    leader = by_id(cluster, old_leader)
    port = leader.port
    assert port is not None
    leader.kill()
    failure: list[BaseException] = []

    def restart() -> None:
        try:
            leader.start(port=port, timeout=60)
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)

    restarting = threading.Thread(target=restart, name="restart")
    restarting.start()
    answered: list[int] = []
    refused = 0
    while restarting.is_alive():  # until it printed its listening line (it joined)
        try:
            with WireClient(f"127.0.0.1:{port}", timeout=2) as client:
                response = client.send(produce_request(TOPIC, 0, simple_batch([b"early"]), timeout_ms=1_000))
                answered.append(int(partition_response(response).error_code))
        except OSError:
            refused += 1
        restarting.join(0.05)
    assert not failure, failure
    # the window was real: the old session outlived the restart, another leader took over
    wait_for(lambda: new_leader_elected(zk, old_leader), timeout=30, what="a new leader")
    assert refused > 0, "the restarted broker never had to wait for its old session"
    assert 0 not in answered, f"a broker that had not joined acknowledged a write: {answered}"
    await_replicas_identical(bootstrap_of(cluster), [TOPIC])


def bootstrap_of(brokers: list[Broker]) -> str:
    return next(b.bootstrap for b in brokers if b.running)
