#!/usr/bin/env python3
"""In-process micro-benchmark of the broker's request path below the socket: ``dispatch()``.

    PYTHONPATH=src .venv/bin/python bench/dispatch_micro.py [--n 20000] [--profile produce]
    PYTHONPATH=src .venv/bin/python bench/dispatch_micro.py --records 3000 --n 200 --sweep-mb 4 --data-parent /tmp

CPU µs (``time.process_time``) per request for the small requests of ``bench/request_rate.py``
(the same frames: an idempotent Produce v9 of one 100 B record with acks=all, a consumer Fetch
v11 at the log end that finds the batch just appended, a Heartbeat v4 of a group's only member),
handed to ``exactly.server.dispatch.dispatch`` of a broker opened in this process, as the
connection does minus the socket. No event loop wake-ups, no syscalls but the segment write:
what it shows is the Python work per request that header parsing, handlers, storage and
response encoding cost, steadier than the broker-process figure on a busy box. Run it with
another checkout's ``src`` first on PYTHONPATH to compare two versions.

``--records N`` makes each Produce one batch of N 100 B records (a bulk producer's request);
``--sweep-mb M`` copies M MB of memory between requests (its own time not counted), which pushes
the interpreter's working set out of the CPU caches as a broker's socket, CRC and page-cache
traffic does: the difference to a run without it is what cold caches add per request.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import exactly  # the checkout on PYTHONPATH, before request_rate puts this one's src on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exactly.client.wire import decode_response, encode_request
from exactly.protocol.fetch_request import FetchPosition, encode_replica_fetch
from exactly.server.broker import Broker, Endpoint
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig
from exactly.server.dispatch import dispatch
from request_rate import TOPIC, ProduceFrames, heartbeat_frame


class InProcessClient:
    """What ProduceFrames and heartbeat_frame need of a WireClient, answered by dispatch()."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker, self.loop = broker, loop

    def module(self, api_key: int, version: int) -> Any:
        from exactly.client.wire import _codec

        return _codec(int(api_key), version).request_module

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        from exactly.client.wire import WireClient

        return WireClient.request(self, api_key, version, **fields)  # type: ignore[arg-type]

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        frame = encode_request(self.request(api_key, version, **fields), 1, "micro")
        chunks = self.loop.run_until_complete(run(self.broker, frame))
        return decode_response(int(api_key), version, b"".join(bytes(c) for c in chunks)[4:])[1]


async def run(broker: Broker, frame: bytes) -> Any:
    return await dispatch(broker, bytearray(frame[4:]), "micro")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--profile", choices=("produce", "fetch", "heartbeat"))
    ap.add_argument(
        "--calls",
        action="store_true",
        help="with --profile: Python calls per request of each function, with its callers (the call tree)",
    )
    ap.add_argument("--records", type=int, default=1, help="100 B records per Produce batch")
    ap.add_argument("--sweep-mb", type=int, default=0, help="MB of memory copied between requests")
    ap.add_argument(
        "--data-parent",
        default="/dev/shm",
        help="where the log goes (with --records, a disk: tmpfs zero-fills each preallocated segment)",
    )
    args = ap.parse_args()
    print(f"exactly from {Path(exactly.__file__).parent}")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory(prefix="exactly-micro-", dir=args.data_parent) as tmp:
        conf = {"log.dirs": tmp, "group.initial.rebalance.delay.ms": "0"}
        broker = Broker.open(BrokerConfig.load(None, conf), Path(tmp))
        broker.advertised = Endpoint("127.0.0.1", 9092)
        broker.groups.load()
        broker.txn.load()

        async def start() -> list[Any]:
            return [*broker.groups.start_tasks(), *broker.txn.start_tasks()]

        tasks = loop.run_until_complete(start())
        broker.logs.create_topic(TOPIC, 1, {}, now_ms=now_ms())
        client = InProcessClient(broker, loop)
        producer = ProduceFrames(client, 0, args.records)  # type: ignore[arg-type]
        sweep_from, sweep_to = bytearray(args.sweep_mb << 20), bytearray(args.sweep_mb << 20)
        beat = heartbeat_frame(client, "micro-group")  # type: ignore[arg-type]

        def fetch_frame() -> bytes:
            return encode_replica_fetch(
                11,
                1,
                "micro",
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=1,
                max_bytes=1_048_576,
                topics=[(TOPIC, [FetchPosition(0, -1, producer.sequence - 1, 0, 1_048_576)])],
            )

        # --profile: the profiler runs around dispatch() only (not the frame building or sweep)
        profiled: list[cProfile.Profile | None] = [None]

        async def profiled_dispatch(payload: bytearray) -> Any:
            # may_defer as the connection passes it (the Fetch fast path takes only such callers)
            prof = profiled[0]
            if prof is None:
                return await dispatch(broker, payload, "micro", may_defer=True)
            prof.enable()
            try:
                return await dispatch(broker, payload, "micro", may_defer=True)
            finally:
                prof.disable()

        async def produce_one(payload: bytearray) -> None:
            await profiled_dispatch(payload)

        async def fetch_one(frame: bytes) -> None:
            chunks = await profiled_dispatch(bytearray(frame[4:]))
            assert len(chunks) >= 2

        async def heartbeat_one() -> None:
            chunks = await profiled_dispatch(bytearray(beat[4:]))
            assert struct.unpack_from(">h", bytes(chunks[1]), 5)[0] == 0

        async def bench(kind: str, n: int) -> float:
            frames = [fetch_frame()] if kind == "fetch" else []
            # produce frames are sequenced (and their CRC computed) before the clock starts: that
            # is the client's work, and at --records 3000 it would be a tenth of the figure
            payloads = [bytearray(producer.next()[4:]) for _ in range(n)] if kind == "produce" else []
            swept = 0.0
            t0 = time.process_time()
            for i in range(n):
                if args.sweep_mb:
                    s0 = time.process_time()
                    sweep_to[:] = sweep_from
                    swept += time.process_time() - s0
                if kind == "produce":
                    await produce_one(payloads[i])
                elif kind == "fetch":
                    await fetch_one(frames[0])
                else:
                    await heartbeat_one()
            return (time.process_time() - t0 - swept) / n * 1e6

        loop.run_until_complete(bench("produce", min(2000, args.n)))  # warm up, and something to fetch
        for kind in ("produce", "fetch", "heartbeat") * 2:
            print(f"{kind:10} {loop.run_until_complete(bench(kind, args.n)):6.1f} µs CPU / request")
        if args.profile:
            prof = cProfile.Profile()
            profiled[0] = prof
            loop.run_until_complete(bench(args.profile, args.n))
            profiled[0] = None
            stats = pstats.Stats(prof)
            if args.calls:
                print_calls(stats, args.n)
            else:
                stats.sort_stats("tottime").print_stats(30)
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        broker.logs.close()
    return 0


def print_calls(stats: pstats.Stats, n: int) -> None:
    """Calls per request of every function the profiled requests ran (most called first), each
    with its callers and their calls per request: the request's call tree, flattened."""
    rows = stats.stats  # type: ignore[attr-defined]
    total = sum(ncalls for (_cc, ncalls, _tt, _ct, _callers) in rows.values())
    print(f"{total / n:.1f} Python calls per request ({len(rows)} functions)")

    def name(func: tuple[str, int, str]) -> str:
        path, line, fn = func
        short = path.split("/src/", 1)[-1] if "/src/" in path else Path(path).name
        return f"{fn} ({short}:{line})" if line else fn

    for func, (_cc, ncalls, tottime, _ct, callers) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        by = ", ".join(
            f"{name(caller)} x{c[1] / n:g}" for caller, c in sorted(callers.items(), key=lambda kv: -kv[1][1])
        )
        print(f"{ncalls / n:6.2f}  {tottime / n * 1e6:6.1f} µs  {name(func)}  <- {by}")


if __name__ == "__main__":
    sys.exit(main())
