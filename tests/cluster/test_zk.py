"""The kazoo shell against a real ZooKeeper: registration, controller election and failover,
/controller_epoch fencing, conditional partition-state writes, re-registration after session loss."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from exactly.cluster import znodes as zn
from exactly.cluster.zk import BrokerIdInUseError, ClusterZk, ControllerMovedError
from exactly.cluster.znodes import BrokerRegistration, Endpoint, LeaderAndIsr, TopicAssignment
from exactly.controller.decisions import NEW_ZNODE, ChangeReason, StateChange
from exactly.types import TopicPartition
from tests.cluster.helpers import expire_session, wait_for

Factory = Callable[[], ClusterZk]
TP = TopicPartition("orders", 0)


def registration(broker_id: int, port: int = 9092) -> BrokerRegistration:
    return BrokerRegistration(broker_id, (Endpoint("PLAINTEXT", "127.0.0.1", port),), timestamp_ms=1)


def test_start_creates_chroot_and_kafkas_persistent_paths(cluster_zk: Factory) -> None:
    zk = cluster_zk()
    for path in zn.PERSISTENT_PATHS:
        assert zk.client.exists(path) is not None, path
    data, _ = zk.client.get(zn.LATEST_PRODUCER_ID_BLOCK)
    assert data == b""


def test_registration_is_ephemeral_with_czxid_as_broker_epoch(cluster_zk: Factory) -> None:
    a, b = cluster_zk(), cluster_zk()
    epoch = a.register_broker(registration(1))
    stat = a.client.exists(zn.broker_path(1))
    assert stat is not None and stat.czxid == epoch and stat.ephemeralOwner == a.session_id
    assert json.loads(a.client.get(zn.broker_path(1))[0])["endpoints"] == ["PLAINTEXT://127.0.0.1:9092"]
    assert b.broker_registration(1) == registration(1)
    with pytest.raises(BrokerIdInUseError):
        b.register_broker(registration(1, 9999))
    assert a.register_broker(registration(1)) == epoch  # idempotent for the owner
    b.register_broker(registration(2))
    assert set(a.live_brokers()) == {1, 2}
    a.stop()
    wait_for(lambda: set(b.live_brokers()) == {2}, what="broker 1's ephemeral node to go")
    assert b.register_broker(registration(1)) > epoch  # a new incarnation: a larger broker epoch


def test_controller_election_one_winner_epoch_in_plain_text(cluster_zk: Factory) -> None:
    a, b = cluster_zk(), cluster_zk()
    lease = a.elect_controller(1)
    assert lease is not None and lease.epoch == 1
    assert b.elect_controller(2) is None
    assert b.controller_id() == 1
    assert b.client.get(zn.CONTROLLER_EPOCH)[0] == b"1"
    assert json.loads(b.client.get(zn.CONTROLLER)[0])["brokerid"] == 1
    a.resign_controller(lease)  # e.g. controlled shutdown: hand the role over at once
    assert b.controller_id() is None
    again = b.elect_controller(2)
    assert again is not None and again.epoch == 2
    with pytest.raises(ControllerMovedError):
        a.write_partition_states(
            lease, [StateChange(TP, LeaderAndIsr(1, 0, (1,), 1), NEW_ZNODE, ChangeReason.NEW_PARTITION)]
        )


@pytest.mark.parametrize("how", ["close", "expire"])
def test_controller_failover_when_its_session_dies(cluster_zk: Factory, how: str) -> None:
    a, b = cluster_zk(), cluster_zk()
    old = a.elect_controller(1)
    assert old is not None
    leases = []
    won = threading.Event()

    def on_controller(controller: int | None) -> None:
        if controller is None:
            lease = b.elect_controller(2)
            if lease is not None:
                leases.append(lease)
                won.set()

    b.watch_controller(on_controller)
    if how == "close":
        a.stop()
    else:
        expire_session(a)
    assert won.wait(15), "broker 2 did not take over"
    assert leases[0].epoch == old.epoch + 1
    assert b.controller_id() == 2


def test_stale_controller_writes_are_fenced(cluster_zk: Factory) -> None:
    a, b = cluster_zk(), cluster_zk()
    old = a.elect_controller(1)
    assert old is not None
    a.create_topic("orders", TopicAssignment({0: (1, 2)}), {})
    create = StateChange(TP, LeaderAndIsr(1, 0, (1, 2), old.epoch), NEW_ZNODE, ChangeReason.NEW_PARTITION)
    [result] = a.write_partition_states(old, [create])
    assert result.new_zk_version == 0
    expire_session(a)  # a zombie: paused past its session, still believes it is controller
    wait_for(lambda: b.controller_id() is None, what="the old /controller to vanish")
    new = b.elect_controller(2)
    assert new is not None and new.epoch == old.epoch + 1
    wait_for(lambda: a.client.connected, what="the zombie to reconnect with a new session")
    stale = StateChange(TP, LeaderAndIsr(1, 1, (1,), old.epoch), 0, ChangeReason.ISR_REMOVAL)
    with pytest.raises(ControllerMovedError):
        a.write_partition_states(old, [stale])
    observed = b.partition_state(TP)
    assert observed is not None and observed.state.leader_and_isr == LeaderAndIsr(1, 0, (1, 2), old.epoch)
    fresh = StateChange(TP, LeaderAndIsr(2, 1, (2,), new.epoch), 0, ChangeReason.OFFLINE_ELECTION)
    assert [r.new_zk_version for r in b.write_partition_states(new, [fresh])] == [1]


def test_state_writes_are_conditional_on_the_zk_version(cluster_zk: Factory) -> None:
    zk = cluster_zk()
    lease = zk.elect_controller(1)
    assert lease is not None
    orphan = StateChange(
        TopicPartition("nope", 0), LeaderAndIsr(1, 0, (1,), 1), NEW_ZNODE, ChangeReason.NEW_PARTITION
    )
    assert [r.new_zk_version for r in zk.write_partition_states(lease, [orphan])] == [None]  # no topic
    zk.create_topic("orders", TopicAssignment({0: (1, 2)}), {"min.insync.replicas": "2"})
    assert zk.topic_assignment("orders") == TopicAssignment({0: (1, 2)})
    assert zn.decode_topic_config(zk.client.get(zn.topic_config_path("orders"))[0]) == {
        "min.insync.replicas": "2"
    }
    initial = LeaderAndIsr(1, 0, (1, 2), lease.epoch)
    zk.write_partition_states(lease, [StateChange(TP, initial, NEW_ZNODE, ChangeReason.NEW_PARTITION)])
    # the leader shrinks the ISR at the version it holds: accepted once, then stale
    shrunk = LeaderAndIsr(1, 0, (1,), lease.epoch)
    assert zk.update_isr(TP, shrunk, expected_zk_version=0) == 1
    assert zk.update_isr(TP, initial, expected_zk_version=0) is None
    # a controller decision computed against version 0 is refused too, and reported, not raised
    late = StateChange(TP, LeaderAndIsr(2, 1, (2,), lease.epoch), 0, ChangeReason.OFFLINE_ELECTION)
    [result] = zk.write_partition_states(lease, [late])
    assert result.new_zk_version is None
    observed = zk.partition_state(TP)
    assert observed is not None
    assert observed.state.leader_and_isr == shrunk and observed.state.zk_version == 1
    assert observed.modified_zxid > 0


def test_broker_registers_again_after_its_session_is_lost(cluster_zk: Factory) -> None:
    a, observer = cluster_zk(), cluster_zk()
    epochs: list[int] = []
    a.on_registered = epochs.append
    first = a.register_broker(registration(1))
    old_session = a.session_id
    expire_session(a)
    wait_for(lambda: len(epochs) == 2, what="re-registration after session loss")
    assert epochs[1] > first
    assert a.session_id != old_session
    stat = observer.client.exists(zn.broker_path(1))
    assert stat is not None and stat.czxid == epochs[1] and stat.ephemeralOwner == a.session_id
    assert observer.live_brokers() == {1: epochs[1]}


def test_watches_deliver_states_and_broker_sets(cluster_zk: Factory) -> None:
    controller, broker = cluster_zk(), cluster_zk()
    lease = controller.elect_controller(1)
    assert lease is not None
    controller.create_topic("orders", TopicAssignment({0: (1, 2)}), {})
    seen: list[int | None] = []
    broker.watch_partition_state(
        TP, lambda o: seen.append(None if o is None else o.state.leader_and_isr.leader_epoch)
    )
    brokers: list[dict[int, int]] = []
    controller.watch_brokers(brokers.append)
    first = LeaderAndIsr(1, 0, (1, 2), lease.epoch)
    controller.write_partition_states(lease, [StateChange(TP, first, NEW_ZNODE, ChangeReason.NEW_PARTITION)])
    wait_for(lambda: seen[-1:] == [0], what="the state's creation")
    second = first.new_leader_and_isr(2, (2,), lease.epoch)
    controller.write_partition_states(lease, [StateChange(TP, second, 0, ChangeReason.OFFLINE_ELECTION)])
    wait_for(lambda: seen[-1:] == [1], what="the new epoch")
    assert seen[0] is None  # watched before it existed
    epoch = broker.register_broker(registration(2))
    wait_for(lambda: brokers[-1:] == [{2: epoch}], what="the broker set")


def test_assignment_rewrites_are_conditional_and_watched(cluster_zk: Factory) -> None:
    admin, other, watcher = cluster_zk(), cluster_zk(), cluster_zk()
    admin.create_topic("orders", TopicAssignment({0: (1, 2)}, topic_id="AAAAAAAAAAAAAAAAAAAAAQ"), {})
    seen: list[int | None] = []
    watcher.watch_topic_assignment("orders", lambda a: seen.append(None if a is None else len(a.partitions)))
    read = admin.topic_assignment_at("orders")
    assert read is not None
    assignment, version = read
    grown = TopicAssignment({0: (1, 2), 1: (2, 1)}, topic_id=assignment.topic_id)
    assert other.set_topic_assignment("orders", grown, version)
    # A second writer that read the same version loses: its partitions would drop the first's.
    assert not admin.set_topic_assignment("orders", TopicAssignment({0: (1, 2), 1: (1, 2)}), version)
    assert admin.topic_assignment("orders") == grown
    assert not admin.set_topic_assignment("nope", grown, 0)
    wait_for(lambda: seen == [1, 2], what="the watch to see the growth")
    assert not admin.topic_marked_for_deletion("orders")
    admin.mark_topic_for_deletion("orders")
    assert admin.topic_marked_for_deletion("orders")
