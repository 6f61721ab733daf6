"""Leader-epoch changes a leader lives through without losing its leadership, and the reads of
a leader whose high watermark has not caught up with its own epoch yet.

* The controller removes a dead follower from the ISR with a leader-epoch bump while the leader
  stays. An acks=all produce parked on that follower then completes with its offset once the
  smaller ISR has the records, as Kafka answers (the leader's ``Partition`` keeps its delayed
  produces across its own re-election); it must not fail with NOT_LEADER_OR_FOLLOWER, which
  would make a non-idempotent producer write the records twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.helpers import running_cluster, wait_for
from tests.cluster.partition_view import by_id, wait_for_view
from tests.support.broker import Broker
from tests.support.wire import WireClient, fetch_records, partition_response, produce_request, simple_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "epochs"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # A long replica lag: only the controller (on the follower's session expiry) shrinks the ISR.
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "60000"})


def create_topic(brokers: list[Broker]) -> None:
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=1, replica_assignment=[[0, 1, 2]], config={"min.insync.replicas": "2"}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)


def test_acks_all_parked_on_a_dead_follower_completes_after_the_controller_shrinks_the_isr(
    cluster: list[Broker],
) -> None:
    create_topic(cluster)
    leader, follower, dead = by_id(cluster, 0), by_id(cluster, 1), by_id(cluster, 2)
    before = wait_for_view(follower, TOPIC, lambda v: v.leader == 0 and len(v.isr) == 3, what="full ISR")
    with WireClient(leader.bootstrap) as wire:
        first = partition_response(wire.send(produce_request(TOPIC, 0, simple_batch([b"before"]), acks=-1)))
    assert (int(first.error_code), int(first.base_offset)) == (0, 0)

    dead.kill()
    # Broker 2 is still in the ISR until its session expires: this produce parks on it.
    answer: list[tuple[int, int]] = []

    def produce() -> None:
        with WireClient(leader.bootstrap, timeout=60) as wire:
            request = produce_request(TOPIC, 0, simple_batch([b"parked"]), acks=-1, timeout_ms=45_000)
            part = partition_response(wire.send(request))
            answer.append((int(part.error_code), int(part.base_offset)))

    sender = threading.Thread(target=produce)
    sender.start()
    shrunk = wait_for_view(
        follower, TOPIC, lambda v: sorted(v.isr) == [0, 1], timeout=60, what="the controller to drop broker 2"
    )
    sender.join(60)
    assert shrunk.leader == 0 and shrunk.leader_epoch > before.leader_epoch  # same leader, new epoch
    assert answer == [(0, 1)]
    with WireClient(leader.bootstrap) as wire:
        assert [r.value for r in fetch_records(wire, TOPIC, 0, 0)] == [b"before", b"parked"]
