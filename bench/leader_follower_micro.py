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

``--produce`` (rf3cpu-s20): the acks=all message as the cluster serves it, through ``dispatch``:
a Produce v9 acks=-1 of one 1 KB record (parked for the ISR; its append wakes both parked
follower Fetches), then each follower's next Fetch at the new log end (recorded: the second
moves the HW, which completes the produce; both park again). ``--calls``: instead of timing, one
round under cProfile: Python calls per message and ``TopicPartition`` hashes / equality tests per
message (deterministic: comparable A vs B on a loaded box).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.storage.helpers

from tests.server.test_produce_fast import produce_frame
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


async def _rounds(
    iterations: int, rounds: int, produce: bool, profile: cProfile.Profile | None
) -> list[float]:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        broker = _open(Path(d))
        plog = broker.logs.get_partition(TP)
        assert plog is not None and broker.replicas is not None
        templates = _templates()
        correlation = 0
        batch = bytes(make_batch(1, value_size=1000))  # built once: the append copies and stamps it
        request = produce_frame([(TP.topic, [(TP.partition, batch)])], acks=-1)

        async def fetches(end: int) -> list[Any]:
            nonlocal correlation
            parked = []
            for r in (1, 2):
                correlation += 1
                frame = templates[r].fill(correlation, [(end, EPOCH, 0)])
                answer = await dispatch(broker, bytearray(frame[4:]), "micro", may_defer=True)
                assert isinstance(answer, Deferred), "not parked"
                parked.append(answer.answer)
            return parked

        out = []
        parked = await fetches(plog.log_end_offset) if produce else []
        for n in range(rounds + 1):  # the first round warms up
            if n == rounds and profile is not None:
                profile.enable()
            start = time.process_time()
            for _ in range(iterations):
                if produce:
                    acked = await dispatch(broker, bytearray(request), "micro", may_defer=True)
                    assert isinstance(acked, Deferred), "acks=all not parked"
                    for answer in parked:
                        assert answer.done()
                        answer.result()
                    parked = await fetches(plog.log_end_offset)
                    assert acked.answer.done(), "acks=all not completed by the followers' fetches"
                    acked.answer.result()
                    continue
                parked = await fetches(plog.log_end_offset)
                records = bytearray(batch)
                plog.append(records, BatchHeader.parse(records), leader_epoch=EPOCH, now_ms=NOW)
                broker.replicas.after_leader_append(plog)
                for answer in parked:
                    assert answer.done()
                    answer.result()
            out.append((time.process_time() - start) / iterations * 1e6)
            if profile is not None:
                profile.disable()
        broker.logs.close()
        return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--produce", action="store_true", help="acks=all Produce requests (see above)")
    ap.add_argument("--calls", action="store_true", help="count Python calls per message (see above)")
    args = ap.parse_args()
    if args.calls:
        profile = cProfile.Profile()
        asyncio.run(_rounds(args.iterations, 1, args.produce, profile))
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        n = args.iterations

        def count(name: str) -> float:
            return sum(v[0] for k, v in stats.items() if k[0] == "<string>" and k[2] == name) / n

        calls = sum(v[0] for v in stats.values()) / n
        print(f"calls_per_message={calls:.1f} tp_hash={count('__hash__'):.1f} tp_eq={count('__eq__'):.1f}")
        return
    per = asyncio.run(_rounds(args.iterations, args.rounds, args.produce, None))
    print(f"us_per_message={statistics.median(per):.1f} rounds={' '.join(f'{x:.1f}' for x in per)}")


if __name__ == "__main__":
    main()
