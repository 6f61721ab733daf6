"""An acks=all write parked on a frozen follower completes when the controller drops that
follower from the ISR.

In ZooKeeper mode the controller's ISR shrink (the follower's session expired) bumps the leader
epoch with the same leader. Kafka's delayed produce waits on through it - the smaller ISR is what
lets it complete. Ours answered NOT_LEADER_OR_FOLLOWER to every write in flight, although they
were in the log and committed a moment later (found by the cluster chaos suite: coordinator
appends reported failed that were durable, and an idempotent producer re-sending such a batch
under a new epoch).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.cluster.zk import ClusterZk
from tests.cluster.fault_helpers import TOPIC, by_id, create_topic, partition_states
from tests.cluster.helpers import await_replicas_identical, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

SESSION_MS = 3_000


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # replica.lag.time.max.ms stays long: the leader must not shrink the ISR itself first
    yield from running_cluster(zk_connect, tmp_path, **{"zookeeper.session.timeout.ms": str(SESSION_MS)})


@pytest.mark.slow
def test_write_parked_on_a_frozen_follower_completes_after_the_controllers_isr_shrink(
    cluster: list[Broker], zk: ClusterZk
) -> None:
    create_topic(cluster, zk)
    state = partition_states(zk)[0]
    controller = zk.controller_id()
    follower_id = next(b for b in state.isr if b not in (state.leader, controller))
    leader, follower = by_id(cluster, state.leader), by_id(cluster, follower_id)
    assert follower.pid is not None
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        with WireClient(leader.bootstrap, timeout=30) as client:
            request = produce_request(TOPIC, 0, simple_batch([b"parked"]), timeout_ms=20_000)
            answer = partition_response(client.send(request))
        after = partition_states(zk)[0]
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    # the shrink happened while the write was parked: same leader, newer epoch, no follower
    assert after.leader == state.leader and follower_id not in after.isr
    assert int(answer.error_code) == 0, answer
    wait_for(lambda: follower_id in partition_states(zk)[0].isr, timeout=30, what="the follower back")
    await_replicas_identical(leader.bootstrap, [TOPIC])
