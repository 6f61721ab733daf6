"""A transactional librdkafka producer whose Produce answer is lost, then an abort.

The broker wrote the batch; the client saw its connection close and queued the batch for a
retry. librdkafka's ``abort_transaction`` purges that queue and advances the partition's sequence
base past the purged records, so the next transaction's first batch carries the aborted batch's
sequence numbers. The broker, as Kafka's does, takes it for a retry of that batch (same producer
id, epoch and sequence range as one of the producer's last five batches) and acknowledges it
without writing it: the next transaction commits without its records. This lost a copier's input
range in the cluster hard-bounce test (tests/cluster/test_cluster_txn_bounce.py);
``flush_before_abort`` is what the copier does about it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.helpers import wait_for
from tests.cluster.txn_bounce_helpers import flush_before_abort
from tests.support.clients import create_topic
from tests.support.proxy import ProxiedBroker
from tests.support.txn_helpers import (
    end_offsets,
    fresh_config,
    produce_flush,
    read_to_end,
    txn_producer,
    values,
)

API_PRODUCE = 0


@pytest.mark.timeout(120)
def test_an_abort_after_a_lost_produce_answer_keeps_the_next_transaction(
    proxied_broker: Any, topic: str
) -> None:
    pb: ProxiedBroker = proxied_broker(**fresh_config())
    create_topic(pb.bootstrap, topic)
    producer = txn_producer(
        pb.bootstrap,
        f"{topic}-txn",
        **{
            # the lost batch waits in librdkafka's queue for its retry while the test aborts
            "retry.backoff.ms": 2000,
            "retry.backoff.max.ms": 2000,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 100,
        },
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    connections = pb.proxy.stats.connections
    pb.proxy.drop_responses(1, api_keys=API_PRODUCE, close=True)
    for i in range(10):
        producer.produce(topic, value=b"aborted-%d" % i, partition=0)
    producer.poll(0)
    wait_for(
        lambda: pb.proxy.stats.dropped_by_api.get(API_PRODUCE, 0) == 1, what="the Produce answer dropped"
    )
    written = end_offsets(pb.bootstrap, topic, [0], "read_uncommitted")
    assert written == {0: 10}, "the broker wrote the batch whose answer was lost"
    # librdkafka reconnects only after it failed the lost request (and queued its batch again)
    wait_for(lambda: pb.proxy.stats.connections > connections, what="the producer to reconnect")

    assert flush_before_abort(producer, 30)
    producer.abort_transaction(30)

    producer.begin_transaction()
    produce_flush(producer, [(topic, 0, b"committed-%d" % i) for i in range(10)])
    producer.commit_transaction(30)
    got = read_to_end(pb.bootstrap, topic, [0], "read_committed")
    assert values(got) == [b"committed-%d" % i for i in range(10)]
