"""Compaction on a three-broker cluster with a follower away for longer than
``delete.retention.ms`` (reference Part B, note B5): the replicas that stay clean their logs past
the horizon but keep the tombstones and the abort marker the absent follower has not fetched;
it comes back, catches up and has them, so once it leads a consumer reading from it sees the keys
deleted and no aborted record; once every replica has them they are removed everywhere."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from exactly.cluster.zk import ClusterZk
from exactly.records.batch import iter_batches
from exactly.records.builder import decode_batch
from exactly.records.control import ControlType, read_control_marker
from exactly.testing.wait import wait_until
from exactly.types import TopicPartition
from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.clients import producer, watermarks
from tests.support.txn_helpers import read_to_end, txn_producer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPIC = "horizon"
KEYS = [b"k%02d" % i for i in range(10)]
DELETED = [b"k00", b"k03", b"k06"]
LIVE = [k for k in KEYS if k not in DELETED]
RETENTION_MS = 1500
PAD = b"." * 150


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # (the cleaner's whole core: its default fifth of one is slow on a loaded test box)
    yield from running_cluster(
        zk_connect, tmp_path, **{"log.cleaner.backoff.ms": "100", "log.cleaner.cpu.max.share": "1.0"}
    )


@dataclass(frozen=True)
class OnDisk:
    """What one replica's segment files hold."""

    tombstones: frozenset[bytes]
    abort_markers: int
    aborted_values: int
    base_offsets: tuple[int, ...]


def on_disk(broker: Broker) -> OnDisk:
    """Read the replica's segments straight from its files (a swap may rename one under us: the
    read is retried)."""
    for _ in range(20):
        try:
            return _read(broker.partition_dir(TOPIC))
        except FileNotFoundError:
            time.sleep(0.05)
    return _read(broker.partition_dir(TOPIC))


def _read(directory: Path) -> OnDisk:
    tombstones: set[bytes] = set()
    aborts = aborted = 0
    bases: list[int] = []
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        for header in iter_batches(data):
            bases.append(header.base_offset)
            if header.is_control:
                if header.record_count and read_control_marker(data, header).type is ControlType.ABORT:
                    aborts += 1
                continue
            for record in decode_batch(data, header.position)[1]:
                if record.value is None and record.key is not None:
                    tombstones.add(bytes(record.key))
                elif record.value is not None and bytes(record.value).startswith(b"aborted"):
                    aborted += 1
    return OnDisk(frozenset(tombstones), aborts, aborted, tuple(bases))


def leader_and_isr(zk: ClusterZk) -> tuple[int, tuple[int, ...]]:
    observed = zk.partition_state(TopicPartition(TOPIC, 0))
    if observed is None:
        return -1, ()
    state = observed.state.leader_and_isr
    return state.leader, tuple(sorted(state.isr))


PASS_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*cleaned " + TOPIC + r"-0 up to (\d+): .* in ([\d.]+) s$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Pass:
    start_s: float  # when it was described (the ``now`` it cleaned at), at the latest
    end_s: float
    up_to: int


def passes(broker: Broker) -> list[Pass]:
    """The broker's finished cleaner passes over the topic, from its log lines."""
    out = []
    for stamp, up_to, elapsed in PASS_LINE.findall(broker.log_text()):
        end = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append(Pass(end - float(elapsed) - 0.5, end, int(up_to)))
    return out


def cleaned_past_horizon(broker: Broker, end_offset: int) -> bool:
    """A pass covered [0, end_offset) and a later one covered it again at least
    ``delete.retention.ms`` after the first ended: the horizons the first gave have passed."""
    covering = [x for x in passes(broker) if x.up_to >= end_offset]
    if not covering:
        return False
    first_end = min(x.end_s for x in covering)
    return any(x.start_s >= first_end + RETENTION_MS / 1000 for x in covering)


def fill(p: Producer, round_: int) -> None:
    """One value for every live key, one flush: new dirty data (and new segments)."""
    for key in LIVE:
        p.produce(TOPIC, key=key, value=b"f%d-" % round_ + PAD)
    p.flush(30)


def wait_cleaned_past_horizon(brokers: list[Broker], p: Producer, round_: int, end_offset: int) -> int:
    """Write a round every couple of seconds (the log gets dirty again, and its active segment
    rolls past ``end_offset``) until every broker cleaned [0, end_offset) past the horizon."""
    rounds = [round_]

    def cleaned() -> bool:
        if all(cleaned_past_horizon(b, end_offset) for b in brokers):
            return True
        rounds[0] += 1
        fill(p, rounds[0])
        return False

    wait_until(cleaned, 240, f"cleaner passes past the horizon on {[b.name for b in brokers]}", interval=2.0)
    return rounds[0]


def test_a_follower_away_past_the_horizon_still_gets_every_tombstone_and_marker(
    cluster: list[Broker], zk: ClusterZk
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC,
        num_partitions=1,
        replica_assignment=[[0, 1, 2]],
        config={
            "cleanup.policy": "compact",
            "segment.bytes": "2048",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": str(RETENTION_MS),
            "min.insync.replicas": "1",
        },
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for(lambda: leader_and_isr(zk) == (0, (0, 1, 2)), what="leader 0 with a full ISR")
    b0, b1, b2 = (by_id(cluster, i) for i in range(3))

    # Every replica holds a value of every key.
    p = producer(bootstrap(cluster), linger_ms=0)
    for round_ in range(3):
        for key in KEYS:
            p.produce(TOPIC, key=key, value=b"v%d-" % round_ + PAD)
        p.flush(30)
    wait_for(lambda: len(on_disk(b2).base_offsets) >= 3, what="broker 2 replicated the first values")
    wait_for(lambda: leader_and_isr(zk)[1] == (0, 1, 2), what="a full ISR")
    # (__transaction_state is created now, while its three replicas can be placed)
    tx = txn_producer(bootstrap(cluster), "horizon-tx")
    tx.init_transactions(30)

    # Broker 2 goes away; keys are deleted and a transaction aborted while it is gone.
    b2.stop()
    wait_for(lambda: leader_and_isr(zk) == (0, (0, 1)), what="broker 2 out of the ISR")
    for key in DELETED:
        p.produce(TOPIC, key=key, value=None)
    p.flush(30)
    tx.begin_transaction()
    for key in KEYS:
        tx.produce(TOPIC, key=key, value=b"aborted")
    tx.flush(30)  # written before the abort (librdkafka's abort purges what it has not sent)
    tx.abort_transaction(30)
    tx.begin_transaction()  # its last entry is then a COMMIT: the ABORT marker may go in the end
    tx.produce(TOPIC, key=LIVE[0], value=b"committed")
    tx.commit_transaction(30)
    end_offset = watermarks(bootstrap(cluster), TOPIC)[1]
    round_ = wait_cleaned_past_horizon([b0, b1], p, 10, end_offset)
    # Kafka would have removed them now (nothing but time protects them); here they stay, since
    # broker 2 has not fetched them.
    for b in (b0, b1):
        view = on_disk(b)
        assert view.tombstones >= set(DELETED), (b.name, view)
        assert view.abort_markers == 1, (b.name, view)
        assert view.aborted_values == 0, (b.name, view)  # aborted data goes at once

    # Broker 2 returns and catches up: it has every tombstone and the marker.
    b2.start()
    wait_for(lambda: leader_and_isr(zk)[1] == (0, 1, 2), timeout=60, what="broker 2 back in the ISR")
    view = on_disk(b2)
    assert view.tombstones >= set(DELETED), view
    assert view.abort_markers == 1, view

    # Broker 2 leads: a read_committed consumer reading from it sees the keys deleted and no
    # aborted record (and is not stalled by a transaction without its marker).
    b0.stop()
    b1.stop()
    wait_for(lambda: leader_and_isr(zk)[0] == 2, timeout=60, what="broker 2 leading")
    for isolation in ("read_committed", "read_uncommitted"):
        got = read_to_end(b2.bootstrap, TOPIC, [0], isolation, timeout=60)
        latest = {r.key: r.value for r in got}
        assert all(latest.get(key) is None for key in DELETED), latest
        assert not [r for r in got if r.value == b"aborted"] or isolation == "read_uncommitted"
        assert set(LIVE) <= {k for k, v in latest.items() if v is not None}

    # Every replica has them now: they are removed, on every replica.
    b0.start()
    b1.start()
    wait_for(lambda: leader_and_isr(zk)[1] == (0, 1, 2), timeout=60, what="a full ISR again")
    p2 = producer(bootstrap(cluster), linger_ms=0)
    rounds = [round_]

    def removed_everywhere() -> bool:
        views = [on_disk(b) for b in (b0, b1, b2)]
        if all(not (v.tombstones & set(DELETED)) and v.abort_markers == 0 for v in views):
            return True
        rounds[0] += 1
        fill(p2, rounds[0])
        return False

    wait_until(removed_everywhere, 300, "tombstones and the abort marker removed everywhere", interval=2.0)
