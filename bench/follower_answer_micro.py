#!/usr/bin/env python3
"""The follower's handling of one Fetch answer, alone, in one process (rf3p99-s19).

    PYTHONPATH=src .venv/bin/python bench/follower_answer_micro.py [--answers N] [--rounds R]

Why: at RF 3 every replicated message costs each follower one Fetch answer, taken inside the
replica channel's receive callback (``LeaderFetcher._on_frame``: read the answer, append its
batches, move the HW, write the next Fetch). The cluster A/Bs on a loaded box cannot resolve a
change of a few µs there. This feeds a ``LeaderFetcher`` (a stand-in manager holding one real
partition log on /dev/shm, as ``tests/server/test_replica_fetcher_fast.py`` does) the leader's
answers of one 1 KB idempotent record each, built beforehand, and reports CPU time
(``time.process_time``) per answer, median of the rounds. Run it with each side's ``src`` on
PYTHONPATH, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.storage.helpers

from tests.storage.helpers import make_batch

from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.replication.truncation import TruncationDecision
from exactly.server.replica_fetcher import FETCH_VERSION, LeaderFetcher
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

TP = TopicPartition("events", 0)
EPOCH = 3


@dataclass
class _Logs:
    logs: dict[TopicPartition, PartitionLog]

    def get_partition(self, tp: TopicPartition) -> PartitionLog | None:
        return self.logs.get(tp)


class _Waiters:
    def notify(self, tp: TopicPartition) -> None:
        pass


@dataclass
class _Broker:
    logs: _Logs
    waiters: _Waiters


@dataclass
class _Manager:
    broker: _Broker
    broker_id: int = 1
    fetch_timeout_s: float = 30.0


def _truncated(fetcher: LeaderFetcher, plog: PartitionLog) -> None:
    """Past the new epoch's truncation (to the empty log's end), as the task leaves it."""
    try:
        from exactly.server.replica_truncation import apply_truncation

        apply_truncation(fetcher.partitions[TP], plog, TruncationDecision(0, True))
    except ImportError:  # before the truncation moved out of the fetcher
        fetcher._apply_truncation(fetcher.partitions[TP], plog, TruncationDecision(0, True))  # type: ignore[attr-defined]


def _answers(count: int) -> list[bytes]:
    out = []
    for i in range(count):
        batch = make_batch(1, value_size=1000, producer_id=7, epoch=0, seq=i)
        batch[0:8] = i.to_bytes(8, "big")
        batch[12:16] = EPOCH.to_bytes(4, "big")
        part = FetchPartitionResult(0, 0, i, i, 0, None, bytes(batch), None)
        body = encode_fetch_response(FETCH_VERSION, 0, 0, [(TP.topic, [part])])
        out.append(b"\x00" + b"".join(bytes(c) for c in body))  # type: ignore[arg-type]
    return out


def _round(answers: list[bytes]) -> float:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        plog = PartitionLog.open(Path(d) / "events-0", TP, LogConfig(), recovery_point=0, now_ms=0)
        manager: Any = _Manager(_Broker(_Logs({TP: plog}), _Waiters()))
        fetcher = LeaderFetcher(manager, leader=0)
        fetcher.follow(TP, EPOCH)
        _truncated(fetcher, plog)
        fetcher._build(list(fetcher.partitions.values()))
        start = time.process_time()
        for answer in answers:
            outcome = fetcher._on_frame(bytearray(struct.pack(">i", fetcher._correlation) + answer))
            assert isinstance(outcome, bytearray), outcome  # the next Fetch
        spent = time.process_time() - start
        plog.close()
        return spent / len(answers) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    answers = _answers(args.answers)
    _round(answers[:1000])  # warm-up
    per = [_round(answers) for _ in range(args.rounds)]
    print(f"us_per_answer={statistics.median(per):.1f} rounds={' '.join(f'{x:.1f}' for x in per)}")


if __name__ == "__main__":
    main()
