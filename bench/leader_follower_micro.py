#!/usr/bin/env python3
"""The cluster leader's serving of its followers' Fetches, alone, in one process (replcpu-s18).

    PYTHONPATH=src .venv/bin/python bench/leader_follower_micro.py [--iterations N] [--rounds R]

Why: the cluster A/Bs (``cluster_ab.py``) on a box at load 10-17 cannot resolve a change of a few
percent of the leader. This drives the code under test without sockets or other processes: one
cluster broker (ZooKeeper never contacted; metadata and partition state fed as
``tests/server/test_follower_fetch_fast.py`` does), and per iteration what an RF 3 acks=1 message
costs the leader's replication path at steady state: two followers' Fetches at the log end (parsed,
checked, recorded, parked), one leader append of a one-record 1 KB batch (built once, copied per append) (which wakes both: re-check,
read, answer framed), the answers collected. CPU time (``time.process_time``) per iteration,
median of the rounds. Run it with each side's ``src`` on PYTHONPATH, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.storage.helpers

from tests.storage.helpers import NOW, make_batch

from exactly.cluster.zk_base import ObservedState
from exactly.cluster.znodes import LeaderAndIsr, PartitionState, TopicAssignment
from exactly.protocol.fetch_request import FetchPosition, ReplicaFetchTemplate
from exactly.records.batch import BatchHeader
from exactly.server.broker import Broker, Endpoint
from exactly.server.config import BrokerConfig
from exactly.server.deferred_response import Deferred
from exactly.server.dispatch import dispatch
from exactly.server.metadata_cache import BrokerEndpoint, CachedTopic
from exactly.types import TopicPartition

TP = TopicPartition("events", 0)
EPOCH = 3


def _open(data_dir: Path) -> Broker:
    conf = {"log.dirs": str(data_dir), "broker.id": "0", "zookeeper.connect": "127.0.0.1:1"}
    broker = Broker.open(BrokerConfig.load(None, conf), data_dir)
    broker.advertised = Endpoint("127.0.0.1", 9092)
    rm = broker.replicas
    assert rm is not None
    rm.leading._write_isr = lambda tp, leader, update: None
    rm._set_brokers(
        {b: BrokerEndpoint(b, "127.0.0.1", 9100 + b) for b in (0, 1, 2)}, {b: 100 + b for b in (0, 1, 2)}
    )
    rm._set_topic(
        CachedTopic(TP.topic, TopicAssignment({0: (0, 1, 2)}, topic_id="AAAAAAAAAAAAAAAAAAAAAA"), {})
    )
    rm._on_state(TP, ObservedState(PartitionState(LeaderAndIsr(0, EPOCH, (0, 1, 2), 1), 1), 1))
    return broker


def _templates() -> dict[int, ReplicaFetchTemplate]:
    return {
        r: ReplicaFetchTemplate.build(
            12, f"replica-{r}", replica_id=r, max_wait_ms=500, min_bytes=1, max_bytes=10 * 1024 * 1024,
            topics=[(TP.topic, [FetchPosition(0, EPOCH, 0, 0, 1024 * 1024, last_fetched_epoch=EPOCH)])],
        )
        for r in (1, 2)
    }  # fmt: skip


async def _rounds(iterations: int, rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        broker = _open(Path(d))
        plog = broker.logs.get_partition(TP)
        assert plog is not None and broker.replicas is not None
        templates = _templates()
        correlation = 0
        batch = bytes(make_batch(1, value_size=1000))  # built once: the append copies and stamps it
        out = []
        for _ in range(rounds + 1):  # the first round warms up
            start = time.process_time()
            for _ in range(iterations):
                parked: list[Any] = []
                end = plog.log_end_offset
                for r in (1, 2):
                    correlation += 1
                    frame = templates[r].fill(correlation, [(end, EPOCH, 0)])
                    answer = await dispatch(broker, bytearray(frame[4:]), "micro", may_defer=True)
                    assert isinstance(answer, Deferred), "not parked"
                    parked.append(answer.answer)
                records = bytearray(batch)
                plog.append(records, BatchHeader.parse(records), leader_epoch=EPOCH, now_ms=NOW)
                broker.replicas.after_leader_append(plog)
                for answer in parked:
                    assert answer.done()
                    answer.result()
            out.append((time.process_time() - start) / iterations * 1e6)
        broker.logs.close()
        return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    per = asyncio.run(_rounds(args.iterations, args.rounds))
    print(f"us_per_message={statistics.median(per):.1f} rounds={' '.join(f'{x:.1f}' for x in per)}")


if __name__ == "__main__":
    main()
