"""``exactly.cli.local_cluster``: the replicated defaults and which broker a mid-run crash kills."""

from __future__ import annotations

from exactly.cli.local_cluster import choose_victim, internal_topic_defaults, replicated_defaults
from exactly.client.cluster_status import BrokerInfo, RawPartition, summarize


def _partition(topic: str, partition: int, leader: int) -> RawPartition:
    return RawPartition(topic, partition, leader, 0, (0, 1, 2), (0, 1, 2), ())


def test_replication_is_capped_at_the_number_of_brokers() -> None:
    assert replicated_defaults(3) == {
        "offsets.topic.replication.factor": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
    }
    assert internal_topic_defaults(1)["transaction.state.log.min.isr"] == "1"
    assert replicated_defaults(2)["default.replication.factor"] == "2"


def test_the_victim_is_the_coordinator_of_the_most_transaction_log_partitions() -> None:
    brokers = [BrokerInfo(i, "127.0.0.1", 9000 + i) for i in range(3)]
    partitions = [
        _partition("__transaction_state", 0, 2),
        _partition("__transaction_state", 1, 1),
        _partition("__transaction_state", 2, 2),
        _partition("category-sales", 0, 1),
        _partition("category-sales", 1, 1),
        _partition("total-sales", 0, 2),
        _partition("order-completed", 0, 0),  # an input: not counted
        _partition("order-completed", 1, 0),
        _partition("order-completed", 2, 0),
    ]
    victim = choose_victim(summarize(None, 0, brokers, partitions), ("category-sales", "total-sales"))
    assert victim.broker_id == 2
    assert victim.roles == (
        "transaction coordinator of 2/3 __transaction_state partitions",
        "leader of total-sales-0",
    )
    assert victim.describe().startswith("broker 2 (transaction coordinator of 2/3")


def test_without_coordinators_the_leader_of_the_most_outputs_and_ties_to_the_lowest_id_and_the_controller_is_named() -> (
    None
):
    brokers = [BrokerInfo(i, "127.0.0.1", 9000 + i) for i in range(3)]
    partitions = [_partition("total-sales", 0, 1), _partition("category-sales", 0, 2)]
    victim = choose_victim(summarize(None, 1, brokers, partitions), ("category-sales", "total-sales"))
    assert victim.broker_id == 1
    assert victim.roles == ("leader of total-sales-0", "controller")
    partitions.append(_partition("category-sales", 1, 2))
    assert (
        choose_victim(summarize(None, 1, brokers, partitions), ("category-sales", "total-sales")).broker_id
        == 2
    )
