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

from tests.server.test_fetch_fast import TOPIC, TP0, _open, fetch_frame
from tests.server.test_produce_fast import batch, produce_frame

from exactly.protocol.framing import frame
from exactly.server.connection import KafkaConnection


class _Transport:
    def __init__(self) -> None:
        self.writes = 0

    def writelines(self, chunks: list[Any]) -> None:
        self.writes += 1

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


async def _run(shape: str, n: int, verbose: bool, timed: bool = False) -> None:
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
        plog = broker.logs.get_partition(TP0)
        assert plog is not None
        warm = 50
        end = plog.log_end_offset
        wait = 500 if shape == "woken" else 0
        # every frame built before the profiler starts: only the broker's calls are counted
        frames = [
            (
                frame(produce_frame([(TOPIC, [(0, batch(1))])], acks=-1 if wait else 1)),
                frame(fetch_frame([(TOPIC, [(0, end + i)])], max_wait_ms=wait)),
            )
            for i in range(n + warm)
        ]
        prof = cProfile.Profile()
        started = 0.0
        for i, (produce, fetch) in enumerate(frames):
            if i == warm:
                if timed:
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
                _feed(conn, produce)
            for _ in range(3):
                await asyncio.sleep(0)
        prof.disable()
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
        stats = pstats.Stats(prof)
        print(f"{shape}: {stats.total_calls / n:.1f} calls per exchange ({writes} writes)")  # type: ignore[attr-defined]
        if verbose:
            stats.sort_stats("ncalls").print_stats(40)


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
    args = ap.parse_args()
    if args.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    for shape in ("inline", "queued", "woken"):
        asyncio.run(_run(shape, args.n, args.v, args.time))


if __name__ == "__main__":
    main()
