"""Fixtures of the web console's tests: a broker that keeps a timed-out transaction open, a
scenario with an open, a committed and two kinds of hanging transaction plus a consumer group,
and ``exactly console`` itself run as a subprocess.

Both hanging transactions are real:

* the *overdue* one's producer asked for a 1 s transaction timeout, and the broker's
  timed-out-transaction sweep runs once an hour, so it stays open past its timeout: an open
  transaction its coordinator has not ended although it should have. The open one asks for the
  usual 60 s and is not flagged.
* the *orphan* (KIP-664) is made the way it happens in production: a producer's transaction is
  committed, then a late transactional write of the same producer lands on the partition. With
  KIP-890 verification off (as before Kafka 3.6) the leader takes it, no coordinator knows of
  it, and the partition's LSO is stuck there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from exactly.testing.wait import wait_until
from tests.support.broker import Broker, child_env
from tests.support.clients import create_topic
from tests.support.txn_helpers import (
    txn_batch,
    wire_add_partitions,
    wire_end_txn,
    wire_init_producer_id,
    wire_list_offset,
    wire_produce,
)
from tests.support.wire import WireClient

HANGING_TIMEOUT_MS = 1000
SWEEP_NEVER = {
    "group.initial.rebalance.delay.ms": "0",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "3600000",
    "transaction.partition.verification.enable": "false",
}


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return dict(SWEEP_NEVER)


@dataclass
class Scenario:
    """What the console should show: ``topic`` partition 0 holds a committed transaction of 3
    records (offsets 0-2, marker 3) and then the open one (first offset 4); partition 1 holds the
    overdue one (first offset 0). ``group`` committed offset 1 on partition 0 and has one live
    member, so its read_committed lag there is LSO 4 - 1 = 3. ``stuck_topic`` partition 0 holds
    ``late_id``'s committed record (0, marker 1) and then producer ``late_pid``'s orphan open
    transaction (first offset 2)."""

    bootstrap: str
    topic: str
    group: str
    committed_id: str
    open_id: str
    hanging_id: str
    stuck_topic: str
    late_id: str
    late_pid: int = -1
    clients: list[Any] = field(default_factory=list)


def _txn_producer(bootstrap: str, tid: str, **conf: Any) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "log_level": 0, **conf})
    p.init_transactions(30)
    return p


@pytest.fixture
def scenario(module_broker: Broker, unique_name: Callable[[str], str]) -> Iterator[Scenario]:
    bs = module_broker.bootstrap
    s = Scenario(
        bs,
        unique_name("orders"),
        unique_name("billing"),
        unique_name("committed"),
        unique_name("open"),
        unique_name("hanging"),
        unique_name("stuck"),
        unique_name("late"),
    )
    create_topic(bs, s.topic, partitions=2)
    create_topic(bs, s.stuck_topic)
    s.late_pid = make_orphan(bs, s.stuck_topic, s.late_id)
    committed = _txn_producer(bs, s.committed_id)
    committed.begin_transaction()
    for i in range(3):
        committed.produce(s.topic, value=b"c%d" % i, partition=0)
    committed.commit_transaction(30)
    hanging = _txn_producer(bs, s.hanging_id, **{"transaction.timeout.ms": HANGING_TIMEOUT_MS})
    hanging.begin_transaction()
    hanging.produce(s.topic, value=b"h", partition=1)
    assert hanging.flush(30) == 0
    open_ = _txn_producer(bs, s.open_id)
    open_.begin_transaction()
    open_.produce(s.topic, value=b"o", partition=0)
    assert open_.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": s.group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.subscribe([s.topic])
    wait_until(lambda: (consumer.poll(0.1), consumer.assignment())[1], 30, "the group's assignment")
    consumer.commit(offsets=[TopicPartition(s.topic, 0, 1)], asynchronous=False)
    s.clients = [committed, hanging, open_, consumer]
    yield s
    consumer.close()
    for p in (committed, hanging, open_):
        p.purge()
        p.flush(0)


def make_orphan(bootstrap: str, topic: str, tid: str) -> int:
    """Commit one record of ``tid`` on ``topic``-0, then write another with the same producer
    id and epoch: an open transaction there that no coordinator will end. Returns the id."""
    with WireClient(bootstrap) as wc:
        error, pid, epoch = wire_init_producer_id(wc, tid)
        assert error == 0
        assert wire_add_partitions(wc, tid, pid, epoch, {topic: [0]}) == {(topic, 0): 0}
        assert wire_produce(wc, topic, 0, txn_batch([b"in-txn"], pid, epoch, 0), tid) == (0, 0)
        assert wire_end_txn(wc, tid, pid, epoch, commit=True) == 0
        wait_until(
            lambda: wire_list_offset(wc, topic, 0, -1, isolation_level=1)[2] == 2, 30, "the commit marker"
        )
        assert wire_produce(wc, topic, 0, txn_batch([b"late"], pid, epoch, 1), tid) == (0, 2)
    return pid


@dataclass
class RunningConsole:
    url: str
    process: subprocess.Popen[str]


ConsoleFactory = Callable[..., RunningConsole]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[ConsoleFactory]:
    """``console(bootstrap, *extra_args)`` -> a running ``exactly console --port 0`` and its URL;
    stopped after the test. Its stderr goes to a file (a pipe nobody reads could fill up)."""
    started: list[RunningConsole] = []

    def start(bootstrap: str, *extra: str) -> RunningConsole:
        stderr_path = tmp_path / f"console-{len(started)}.stderr"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exactly",
                "console",
                "--bootstrap-server",
                bootstrap,
                "--port",
                "0",
                "--refresh-ms",
                "300",
                "--request-timeout",
                "5",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr_path.open("w"),
            text=True,
            env=child_env(),
        )
        running = RunningConsole("", proc)
        started.append(running)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"serving (http://127\.0\.0\.1:\d+/) for ", line)
        assert found, f"unexpected first line {line!r}; stderr: {stderr_path.read_text()}"
        running.url = found.group(1)
        return running

    yield start
    for running in started:
        running.process.terminate()
        try:
            running.process.wait(10)
        except subprocess.TimeoutExpired:
            running.process.kill()
            running.process.wait()
