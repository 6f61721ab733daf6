#!/usr/bin/env python3
"""Python calls per Produce+Fetch exchange through ``KafkaConnection``, counted with cProfile.

    PYTHONPATH=src .venv/bin/python bench/connection_calls.py [--n 2000] [-v]

A real broker opened in this process (the fixture of tests/server/test_fetch_fast.py) behind a
connection with a recording transport, no socket: each exchange is an acks=1 Produce of one
record and a Fetch (max_wait 0) at the log end. Two shapes: ``inline`` (each frame arrives in a
read of its own, so the read callback answers it: ``RequestTask._answer_inline``), ``queued``
(both frames in one read) and ``woken`` (latency-1k's exchange: an acks=all Produce on one
connection wakes the Fetch parked at the log end on another, whose answer goes out on the next
loop turn). The frames are built before the profiler starts (s18; before, their building was
counted too); the event loop's own calls are counted, so compare two checkouts, not absolute
figures: run it with the other checkout's ``src`` on PYTHONPATH. A count, not a time: steady on
a busy box. ``--uvloop`` runs it on the broker's loop (whose own calls are C, so not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package

from tests.server.test_fetch_fast import TOPIC, _open, fetch_frame
from tests.server.test_produce_fast import batch, produce_frame

from exactly.protocol.framing import frame
from exactly.server.connection import KafkaConnection
from exactly.types import TopicPartition


class _Transport:
    def __init__(self) -> None:
        self.writes = 0
        self.on_write: Any = None  # ``--split``: called on each write (the ack's moment)

    def writelines(self, chunks: list[Any]) -> None:
        self.writes += 1
        if self.on_write is not None:
            self.on_write()

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _feed(conn: KafkaConnection, data: bytes) -> None:
    conn.get_buffer(-1)[: len(data)] = data
    conn.buffer_updated(len(data))


class _Split:
    """``--split``: calls (Python and C, ``sys.setprofile``) of a woken exchange counted in two
    parts: from the Produce's read callback to the ack handed to the transport (what the ack's
    latency waits for), and after it (the Fetch wake-up, its read, encode and write)."""

    def __init__(self) -> None:
        self.before = 0
        self.after = 0
        self.acked = True

    def ack(self) -> None:
        self.acked = True

    def __call__(self, _frame: Any, event: str, _arg: Any) -> None:
        if event == "call" or event == "c_call":
            if self.acked:
                self.after += 1
            else:
                self.before += 1


async def _run(
    shape: str, n: int, verbose: bool, timed: bool = False, split: bool = False, isolation: int = 0
) -> None:
    with tempfile.TemporaryDirectory() as d:
        broker = _open(Path(d), True)
        conn = KafkaConnection(broker)
        transport = _Transport()
        conn.transport = transport  # type: ignore[assignment]
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        # ``woken``: the consumer's own connection, whose Fetch parks before each Produce
        consumer = KafkaConnection(broker)
        consumer_transport = _Transport()
        consumer.transport = consumer_transport  # type: ignore[assignment]
        consumer_task = consumer._task = asyncio.get_running_loop().create_task(consumer._process())
        for _ in range(5):
            await asyncio.sleep(0)
        # read_committed: partition 1 (partition 0 holds an open transaction: its LSO stays put)
        part = 1 if isolation else 0
        plog = broker.logs.get_partition(TopicPartition(TOPIC, part))
        assert plog is not None
        warm = 50
        end = plog.log_end_offset
        wait = 500 if shape == "woken" else 0
        # every frame built before the profiler starts: only the broker's calls are counted
        frames = [
            (
                frame(produce_frame([(TOPIC, [(part, batch(1))])], acks=-1 if wait else 1)),
                frame(fetch_frame([(TOPIC, [(part, end + i)])], max_wait_ms=wait, isolation=isolation)),
            )
            for i in range(n + warm)
        ]
        prof = cProfile.Profile()
        started = 0.0
        counter = _Split()
        transport.on_write = counter.ack if split else None
        for i, (produce, fetch) in enumerate(frames):
            if i == warm:
                if split:
                    sys.setprofile(counter)
                elif timed:
                    started = time.process_time()
                else:
                    prof.enable()
            if shape == "inline":
                _feed(conn, produce)
                _feed(conn, fetch)
            elif shape == "queued":
                _feed(conn, produce + fetch)
            else:  # the consumer's Fetch parks at the log end, the Produce wakes it
                _feed(consumer, fetch)
                counter.acked = False
                _feed(conn, produce)
            for _ in range(3):
                await asyncio.sleep(0)
        prof.disable()
        sys.setprofile(None)
        spent = time.process_time() - started
        conn.abort()
        consumer.abort()
        await task
        await consumer_task
        broker.logs.close()
        writes = transport.writes + consumer_transport.writes
        assert plog.log_end_offset == end + n + warm
        assert writes == 2 * (n + warm) if shape != "queued" else writes > 0
        if timed:
            print(f"{shape}: {spent / n * 1e6:.1f} CPU µs per exchange (process time, no profiler)")
            return
        if split:
            print(
                f"{shape}: calls per exchange (setprofile, Python + C): up to the ack's write "
                f"{counter.before / n:.1f}, after it {counter.after / n:.1f}"
            )
            return
        stats = pstats.Stats(prof)
        print(f"{shape}: {stats.total_calls / n:.1f} calls per exchange ({writes} writes)")  # type: ignore[attr-defined]
        if verbose:
            stats.sort_stats("ncalls").print_stats(int(__import__("os").environ.get("CC_TOP", "40")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("-v", action="store_true", help="print the most called functions")
    ap.add_argument(
        "--uvloop",
        action="store_true",
        help="run on uvloop (the broker's loop: its timers and call_soon are C, not counted)",
    )
    ap.add_argument(
        "--time",
        action="store_true",
        help="CPU time per exchange instead of calls (load-sensitive: alternate A/B)",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="woken shape only: calls up to the Produce's ack write and after it (sys.setprofile)",
    )
    ap.add_argument(
        "--read-committed",
        action="store_true",
        help="the Fetch reads read_committed (librdkafka's default, so latency-1k's consumer's)",
    )
    args = ap.parse_args()
    if args.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    for shape in ("woken",) if args.split else ("inline", "queued", "woken"):
        asyncio.run(_run(shape, args.n, args.v, args.time, args.split, 1 if args.read_committed else 0))


if __name__ == "__main__":
    main()
