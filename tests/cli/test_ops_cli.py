"""`exactly txn|producers|groups` run as subprocesses against the real broker, with real
transactional producers and consumer groups (confluent-kafka)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer

from exactly.client.wire import ApiKey, WireClient
from tests.support.broker import Broker, child_env
from tests.support.clients import consume, create_topic, member_that_committed, produce_values

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- helpers
def exactly(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        input=b"",
        capture_output=True,
        timeout=timeout,
        env=env,
    )
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


def ok(*args: str) -> str:
    proc = exactly(*args)
    assert proc.returncode == 0, f"exactly {' '.join(args)} -> {proc.returncode}: {proc.stderr.decode()}"
    return proc.stdout.decode()


def fails(*args: str) -> str:
    """A command that must fail with exit 1 and exactly one error line; returns that line."""
    proc = exactly(*args)
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}: {proc.stderr.decode()}"
    errors = [line for line in proc.stderr.decode().splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr.decode()
    return errors[0]


def table(text: str) -> list[dict[str, str]]:
    """A tab-separated table with a header line -> one dict per row."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def txn_producer(bootstrap: str, tid: str, **conf: Any) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "linger.ms": 5,
            "log_level": 0,
            **conf,
        }
    )
    p.init_transactions(30)
    return p


def open_transaction(p: Producer, topic: str, values: list[bytes], partition: int = 0) -> None:
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v, partition=partition)
    assert p.flush(30) == 0


def offsets(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    """(high watermark, last stable offset) from ListOffsets read_uncommitted / read_committed."""
    out = []
    with WireClient.connect(bootstrap, timeout=10) as client:
        mod = client.module(ApiKey.LIST_OFFSETS, 5)
        for isolation in (0, 1):
            response = client.call(
                ApiKey.LIST_OFFSETS,
                5,
                replica_id=-1,
                isolation_level=isolation,
                topics=(
                    mod.ListOffsetsTopic(
                        name=topic,
                        partitions=(
                            mod.ListOffsetsPartition(
                                partition_index=partition, current_leader_epoch=-1, timestamp=-1
                            ),
                        ),
                    ),
                ),
            )
            (part,) = response.topics[0].partitions
            assert part.error_code == 0, part
            out.append(int(part.offset))
    return out[0], out[1]


def committed_values(bootstrap: str, topic: str, sentinel: bytes) -> list[bytes | None]:
    """Everything a read_committed consumer gets from the start, after writing ``sentinel``
    non-transactionally (so the read has a known end even when nothing else is visible)."""
    produce_values(bootstrap, topic, [sentinel])
    got = consume(bootstrap, topic, 1000, timeout=30, idle=3, isolation_level="read_committed")
    return [g.value for g in got]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------- txn list/describe
def test_txn_list_describe_and_find_hanging_show_an_open_transaction(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic, partitions=2)
    t = tid("list")
    p = txn_producer(broker.bootstrap, t, **{"transaction.timeout.ms": 45_000})
    open_transaction(p, topic, [b"a", b"b"], partition=1)

    rows = {r["TransactionalId"]: r for r in table(ok("txn", "list", *bs))}
    assert rows[t]["TransactionState"] == "Ongoing"
    producer_id = rows[t]["ProducerId"]
    assert int(producer_id) >= 0
    assert t in {r["TransactionalId"] for r in table(ok("txn", "list", "--state", "Ongoing", *bs))}
    assert t not in {r["TransactionalId"] for r in table(ok("txn", "list", "--state", "CompleteCommit", *bs))}
    by_pid = table(ok("txn", "list", "--producer-id", producer_id, *bs))
    assert [r["TransactionalId"] for r in by_pid] == [t]
    assert t not in {r["TransactionalId"] for r in table(ok("txn", "list", "--duration-ms", "600000", *bs))}

    (desc,) = table(ok("txn", "describe", t, *bs))
    assert desc["TransactionState"] == "Ongoing"
    assert desc["ProducerId"] == producer_id
    assert desc["ProducerEpoch"] == "0"
    assert desc["TransactionTimeoutMs"] == "45000"
    assert desc["TopicPartitions"] == f"{topic}-1"
    start = int(desc["CurrentTransactionStartTimeMs"])
    assert abs(start - time.time() * 1000) < 60_000
    assert int(desc["TransactionDurationMs"]) > 0

    # open, but its coordinator will end it on that partition: not hanging (Kafka's definition)
    assert table(ok("txn", "find-hanging", "--max-age-ms", "0", *bs)) == []
    assert (
        table(ok("txn", "find-hanging", "--max-age-ms", "0", "--topic", topic, "--partition", "1", *bs)) == []
    )

    p.commit_transaction(30)
    (desc,) = table(ok("txn", "describe", t, *bs))
    assert desc["TransactionState"] == "CompleteCommit"
    assert desc["TransactionDurationMs"] == "None"
    assert t not in {r["TransactionalId"] for r in table(ok("txn", "list", "--state", "Ongoing", *bs))}
    assert "transactional id(s) not found: nope-" in fails("txn", "describe", t, f"nope-{t}", *bs)


# ---------------------------------------------------------------------------- txn abort
def test_txn_abort_by_transactional_id_aborts_and_fences(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    t = tid("fence")
    p = txn_producer(broker.bootstrap, t)
    open_transaction(p, topic, [b"doomed-1", b"doomed-2"])
    high, lso = offsets(broker.bootstrap, topic)
    assert (high, lso) == (2, 0)

    out = ok("txn", "abort", "--transactional-id", t, *bs)
    assert "Aborted the Ongoing transaction" in out and "fenced" in out, out
    assert f"partitions {topic}-0" in out

    (desc,) = table(ok("txn", "describe", t, *bs))
    assert desc["TransactionState"] != "Ongoing"
    assert int(desc["ProducerEpoch"]) > 0
    high, lso = offsets(broker.bootstrap, topic)
    assert high == lso == 3  # two records + the ABORT marker, nothing unstable left

    assert committed_values(broker.bootstrap, topic, b"sentinel") == [b"sentinel"]

    with pytest.raises(KafkaException) as info:
        p.commit_transaction(30)
    err = info.value.args[0]
    assert err.name() in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), err
    assert "fenced" in err.str().lower() or err.name() == "INVALID_PRODUCER_EPOCH", err

    # nothing open now: a second abort only bumps the epoch again
    out = ok("txn", "abort", "--transactional-id", t, *bs)
    assert "had no open transaction" in out, out


def test_txn_abort_partition_ends_a_transaction_the_coordinator_still_tracks(
    broker: Broker, topic: str
) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    t = tid("hang")
    p = txn_producer(broker.bootstrap, t)
    open_transaction(p, topic, [b"stuck-1", b"stuck-2", b"stuck-3"])
    assert offsets(broker.bootstrap, topic) == (3, 0)
    (prod,) = table(ok("producers", topic, "0", *bs))
    assert prod["CurrentTransactionStartOffset"] == "0"

    out = ok("txn", "abort", "--topic", topic, "--partition", "0", *bs)
    assert f"producer {prod['ProducerId']}" in out and f"on {topic}-0" in out, out
    assert "started at offset 0" in out

    high, lso = offsets(broker.bootstrap, topic)
    assert high == lso == 4, (high, lso)
    (prod,) = table(ok("producers", topic, "0", *bs))
    assert prod["CurrentTransactionStartOffset"] == "None"
    # the coordinator was not involved: it still has the transaction open
    (desc,) = table(ok("txn", "describe", t, *bs))
    assert desc["TransactionState"] == "Ongoing"
    assert committed_values(broker.bootstrap, topic, b"sentinel") == [b"sentinel"]
    assert "no open transaction on" in fails("txn", "abort", "--topic", topic, "--partition", "0", *bs)
    p.abort_transaction(30)


def test_txn_abort_partition_picks_the_given_producer(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    p1 = txn_producer(broker.bootstrap, tid("one"))
    p2 = txn_producer(broker.bootstrap, tid("two"))
    open_transaction(p1, topic, [b"one"])
    open_transaction(p2, topic, [b"two"])
    producers = table(ok("producers", topic, "0", *bs))
    assert len(producers) == 2
    assert all(r["CurrentTransactionStartOffset"] != "None" for r in producers)
    line = fails("txn", "abort", "--topic", topic, "--partition", "0", *bs)
    assert "2 producers have open transactions" in line and "--producer-id" in line
    assert offsets(broker.bootstrap, topic) == (2, 0)

    first = min(producers, key=lambda r: int(r["CurrentTransactionStartOffset"]))
    ok("txn", "abort", "--topic", topic, "--partition", "0", "--producer-id", first["ProducerId"], *bs)
    # the other transaction (from offset 1) still holds the LSO
    assert offsets(broker.bootstrap, topic) == (3, 1)
    p2.commit_transaction(30)
    assert offsets(broker.bootstrap, topic) == (4, 4)
    assert committed_values(broker.bootstrap, topic, b"sentinel") == [b"two", b"sentinel"]
    p1.abort_transaction(30)


def test_txn_errors_are_one_line(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    missing = tid("missing")
    assert f"transactional id '{missing}' not found" in fails(
        "txn", "abort", "--transactional-id", missing, *bs
    )
    # the failed abort must not have created the id
    assert "not found" in fails("txn", "describe", missing, *bs)
    assert "no open transaction" in fails("txn", "abort", "--topic", topic, "--partition", "0", *bs)
    assert "has no partition 7" in fails("txn", "abort", "--topic", topic, "--partition", "7", *bs)
    assert "--transactional-id" in fails("txn", "abort", "--topic", topic, *bs)
    assert "cannot be combined" in fails(
        "txn", "abort", "--transactional-id", "x", "--topic", topic, "--partition", "0", *bs
    )
    assert "unknown transaction state(s): Bogus" in fails("txn", "list", "--state", "Bogus", *bs)
    assert "cannot connect" in fails("txn", "list", "--bootstrap-server", f"127.0.0.1:{free_port()}")
    assert "invalid bootstrap address" in fails("txn", "find-hanging", "--bootstrap-server", "nohost")
    assert "not an integer" in fails("txn", "find-hanging", "--max-age-ms", "soon", *bs)
    assert "--partition needs --topic" in fails("txn", "find-hanging", "--partition", "0", *bs)
    assert "has no partition 5" in fails("txn", "find-hanging", "--topic", topic, "--partition", "5", *bs)
    assert "has no partition 3" in fails("producers", topic, "3", *bs)
    assert "has no partition 0" in fails("producers", f"no-such-{topic}", "0", *bs)


# ---------------------------------------------------------------------------- producers
def test_producers_lists_idempotent_and_transactional_producers(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    assert table(ok("producers", topic, "0", *bs)) == []
    produce_values(broker.bootstrap, topic, [b"x", b"y", b"z"])
    (idem,) = table(ok("producers", topic, "0", *bs))
    assert idem["ProducerEpoch"] == "0"
    assert idem["LastSequence"] == "2"
    assert idem["CurrentTransactionStartOffset"] == "None"
    assert abs(int(idem["LastTimestamp"]) - time.time() * 1000) < 60_000

    p = txn_producer(broker.bootstrap, tid("prod"))
    open_transaction(p, topic, [b"t1"])
    rows = {r["ProducerId"]: r for r in table(ok("producers", topic, "0", *bs))}
    assert len(rows) == 2
    (txn_row,) = [r for pid, r in rows.items() if pid != idem["ProducerId"]]
    assert txn_row["CurrentTransactionStartOffset"] == "3"
    p.commit_transaction(30)
    rows = {r["ProducerId"]: r for r in table(ok("producers", topic, "0", *bs))}
    assert rows[txn_row["ProducerId"]]["CurrentTransactionStartOffset"] == "None"
    assert rows[txn_row["ProducerId"]]["CoordinatorEpoch"] != "None"


# ---------------------------------------------------------------------------- groups
def test_groups_list_and_describe_after_a_commit(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [f"v{i}".encode() for i in range(5)])
    group = tid("group")
    with member_that_committed(broker.bootstrap, topic, group, "ops-test-client") as c:  # committed offset 3
        groups = table(ok("groups", "list", *bs))
        assert {"GROUP": group, "STATE": "Stable"} in groups

        out = ok("groups", "describe", group, *bs)
        summary, rest = out.split("\n", 1)
        assert summary.startswith(f"Group: {group}\tState: Stable\t")
        assert "Members: 1" in summary and "Assignor: range" in summary
        (row,) = table(rest)
        assert (row["TOPIC"], row["PARTITION"]) == (topic, "0")
        assert (row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"]) == ("3", "5", "2")
        assert row["CONSUMER-ID"] == c.memberid()
        assert row["CLIENT-ID"] == "ops-test-client"

    out = ok("groups", "describe", group, *bs)
    summary, rest = out.split("\n", 1)
    assert "State: Empty" in summary and "Members: 0" in summary
    (row,) = table(rest)
    assert (row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"], row["CONSUMER-ID"]) == (
        "3",
        "5",
        "2",
        "-",
    )
    assert f"consumer group 'nope-{group}' does not exist" in fails(
        "groups", "describe", f"nope-{group}", *bs
    )
    unreachable = ("--bootstrap-server", f"127.0.0.1:{free_port()}", "--request-timeout", "2")
    assert "groups list" in fails("groups", "list", *unreachable)
