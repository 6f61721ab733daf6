#!/usr/bin/env python3
"""Micro-benchmark of the leader's delayed acks=all produces, two versions in one process.

    PYTHONPATH=src .venv/bin/python bench/delayed_produce_micro.py --base /tmp/perf-base/src

CPU microseconds (``time.process_time``) per completed produce with ``--inflight`` produces
parked on one partition (librdkafka keeps 5 in flight) and two followers whose fetches each
move the HW by one produce, as at RF 3 under load: ``--base``'s ``delayed_produce`` module
(A) and this checkout's (B), alternating. Event-loop turns are included (each produce is a task
that parks and is answered), the network and the log are not. A module with ``park`` (the
callback form the produce handler uses since it has no task per produce) is measured that way
too ("park").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.leader import LeaderPartition
from exactly.types import TopicPartition

SRC = Path(__file__).resolve().parents[1] / "src"
TP = TopicPartition("t", 0)


def load(src: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, src / "exactly" / "server" / "delayed_produce.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def per_produce_us(module: ModuleType, rounds: int, inflight: int) -> float:
    delayed = module.DelayedProduces()
    leader = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 0, (1, 2, 3), 1),
        zk_version=0,
        replicas=(1, 2, 3),
        leader_log_end_offset=0,
        high_watermark=0,
        now_ms=0,
    )
    parked: list[asyncio.Future[object]] = []
    start = time.process_time()
    for end in range(1, rounds + 1):
        leader.on_leader_append(end, now_ms=end)
        parked.append(asyncio.ensure_future(delayed.wait(TP, leader, lambda: True, end, 2, 30.0)))
        await asyncio.sleep(0)
        if len(parked) < inflight:
            continue
        target = end - inflight + 1  # both followers fetch past the oldest produce
        for follower in (2, 3):
            if leader.on_follower_fetch(follower, target, 0, now_ms=end).high_watermark_advanced:
                delayed.wake(TP)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if not parked.pop(0).done():
            raise AssertionError("the oldest produce was not answered")
    return (time.process_time() - start) / (rounds - inflight + 1) * 1e6


async def per_produce_park_us(module: ModuleType, rounds: int, inflight: int) -> float:
    """The same produces through ``park``: a completion callback, no task per produce."""
    delayed = module.DelayedProduces()
    leader = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 0, (1, 2, 3), 1),
        zk_version=0,
        replicas=(1, 2, 3),
        leader_log_end_offset=0,
        high_watermark=0,
        now_ms=0,
    )
    answered: list[object] = []
    start = time.process_time()
    for end in range(1, rounds + 1):
        leader.on_leader_append(end, now_ms=end)
        delayed.park(TP, leader, lambda: True, end, 2, 30.0, answered.append)
        if end < inflight:
            continue
        target = end - inflight + 1
        for follower in (2, 3):
            if leader.on_follower_fetch(follower, target, 0, now_ms=end).high_watermark_advanced:
                delayed.wake(TP)
        await asyncio.sleep(0)
        if len(answered) != target:
            raise AssertionError("the oldest produce was not answered")
    return (time.process_time() - start) / (rounds - inflight + 1) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="src dir of version A")
    ap.add_argument("--rounds", type=int, default=20_000)
    ap.add_argument("--inflight", type=int, default=5)
    args = ap.parse_args()
    sides = {"A": load(args.base.resolve(), "delayed_produce_a"), "B": load(SRC, "delayed_produce_b")}
    for side in ("A", "B", "A", "B"):
        us = asyncio.run(per_produce_us(sides[side], args.rounds, args.inflight))
        print(f"{side}: {us:.1f} us CPU per completed produce ({args.inflight} in flight)")
        if hasattr(sides[side], "Parked"):
            us = asyncio.run(per_produce_park_us(sides[side], args.rounds, args.inflight))
            print(f"{side} park: {us:.1f} us CPU per completed produce ({args.inflight} in flight)")


if __name__ == "__main__":
    main()
