"""Transaction coordinator crash and restart.

``EXACTLY_FAULT=crash-after-prepare`` makes the broker SIGKILL itself right after a PrepareCommit /
PrepareAbort record is durable in ``__transaction_state`` and before any marker is written. Restarted
without the fault on the same data dir, the coordinator must load the decided-but-unfinished
transaction and complete it: markers on every partition, LSO at the end, the transactional.id usable
again. Also: an open (Ongoing) transaction survives a crash and is aborted by its timeout afterwards.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException

from tests.conftest import BrokerFactory
from tests.support.broker import Broker
from tests.support.clients import create_topic
from tests.support.txn_helpers import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    end_offsets,
    fresh_config,
    log_entries,
    produce_flush,
    read_to_end,
    txn_producer,
    values,
    wait_until,
)
from tests.support.wire import WireClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

FAULT = {"EXACTLY_FAULT": "crash-after-prepare"}


def _layout(b: Broker, topic: str, partition: int) -> list[str]:
    with WireClient(b.bootstrap) as wc:
        return [e.kind for e in log_entries(wc, topic, partition)]


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_coordinator_crash_between_prepare_and_markers_completes_after_restart(
    fresh_broker: BrokerFactory, unique_name: Callable[[str], str], outcome: str
) -> None:
    b = fresh_broker(env=FAULT, **fresh_config())
    topics = [unique_name("ca"), unique_name("cb")]
    for t in topics:
        create_topic(b.bootstrap, t, partitions=2)
    tps = [(t, p) for t in topics for p in (0, 1)]
    tid = unique_name("crash-tx")

    p = txn_producer(b.bootstrap, tid, **{"message.timeout.ms": 5000, "transaction.timeout.ms": 60_000})
    p.init_transactions(15)
    p.begin_transaction()
    items = [(t, part, f"{outcome}-{t}-{part}-{i}".encode()) for t, part in tps for i in range(3)]
    produce_flush(p, items)
    with pytest.raises(KafkaException):  # the broker dies under the EndTxn
        if outcome == "commit":
            p.commit_transaction(2)
        else:
            p.abort_transaction(2)
    wait_until(lambda: not b.running, 10, "broker killed by the crash-after-prepare fault")
    assert b.returncode == -9, f"broker exit code {b.returncode}, expected SIGKILL"
    assert "crash-after-prepare" in b.log_text()

    b.env.pop("EXACTLY_FAULT")
    log_from = b.log_size()
    b.restart()
    restart_log = b.log_text(log_from)
    assert "1 transactions to complete" in restart_log, restart_log[-2000:]

    marker = "COMMIT" if outcome == "commit" else "ABORT"
    for t, part in tps:
        assert _layout(b, t, part) == ["data", "data", "data", marker], (t, part)
        assert end_offsets(b.bootstrap, t, [part], READ_COMMITTED) == {part: 4}, "LSO not at the end"
    committed = Counter(
        v for t in topics for v in values(read_to_end(b.bootstrap, t, (0, 1), READ_COMMITTED))
    )
    everything = Counter(
        v for t in topics for v in values(read_to_end(b.bootstrap, t, (0, 1), READ_UNCOMMITTED))
    )
    assert everything == Counter(v for _, _, v in items)
    assert committed == (everything if outcome == "commit" else Counter())

    # the transactional.id works again at once (no CONCURRENT_TRANSACTIONS left behind)
    p2 = txn_producer(b.bootstrap, tid)
    p2.init_transactions(15)
    p2.begin_transaction()
    produce_flush(p2, [(topics[0], 0, b"after-restart")])
    p2.commit_transaction(15)
    assert values(read_to_end(b.bootstrap, topics[0], [0], READ_COMMITTED))[-1] == b"after-restart"


def test_open_transaction_survives_a_crash_and_times_out_after_restart(
    fresh_broker: BrokerFactory, topic: str, unique_name: Callable[[str], str]
) -> None:
    b = fresh_broker(**fresh_config())
    create_topic(b.bootstrap, topic, partitions=1)
    p = txn_producer(b.bootstrap, unique_name("open-tx"), **{"transaction.timeout.ms": 3000})
    p.init_transactions(15)
    p.begin_transaction()
    produce_flush(p, [(topic, 0, b"open-0"), (topic, 0, b"open-1")])
    assert end_offsets(b.bootstrap, topic, [0], READ_COMMITTED) == {0: 0}
    crashed_at = time.monotonic()
    b.kill()
    b.restart()
    # recovery rebuilt the ongoing transaction: the LSO still holds at its first offset...
    lso = end_offsets(b.bootstrap, topic, [0], READ_COMMITTED)
    if time.monotonic() - crashed_at < 2.5:
        assert lso == {0: 0}, "LSO after restart ignores the open transaction"
    # ...until the coordinator aborts it (its timeout was loaded from __transaction_state)
    wait_until(
        lambda: _layout(b, topic, 0) == ["data", "data", "ABORT"], 15, "ABORT of the timed-out transaction"
    )
    assert end_offsets(b.bootstrap, topic, [0], READ_COMMITTED) == {0: 3}
    assert values(read_to_end(b.bootstrap, topic, [0], READ_COMMITTED)) == []
