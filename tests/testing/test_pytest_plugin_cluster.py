"""``exactly_cluster`` as a user's test would use it: kill the leader of a replicated partition
while an idempotent producer writes, see a new leader take over, restart the killed broker."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

RECORDS = 200


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)[1])
    finally:
        consumer.close()


def test_killing_the_leader_moves_the_partition_and_loses_nothing(exactly_cluster):
    bootstrap = exactly_cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("orders", 1, 3, config={"min.insync.replicas": "2"})])["orders"].result(30)
    old_leader = exactly_cluster.wait_for_leader("orders")

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    failed: list[str] = []

    def report(err, _msg):
        if err is not None:
            failed.append(str(err))

    for i in range(RECORDS // 2):
        producer.produce("orders", str(i).encode(), on_delivery=report)
    assert producer.flush(30) == 0

    exactly_cluster.kill(old_leader)
    new_leader = exactly_cluster.wait_for_leader("orders", not_on=old_leader)
    assert new_leader != old_leader

    for i in range(RECORDS // 2, RECORDS):
        producer.produce("orders", str(i).encode(), on_delivery=report)
    assert producer.flush(60) == 0
    assert failed == []
    assert high_watermark(exactly_cluster.live_bootstrap(), "orders") == RECORDS

    exactly_cluster.restart(old_leader)  # returns once the metadata lists it again
    assert exactly_cluster.broker(old_leader).running
    assert exactly_cluster.live_broker_ids() == {0, 1, 2}
