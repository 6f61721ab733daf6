#!/usr/bin/env python3
"""In-process micro-benchmark of the broker's request path below the socket: ``dispatch()``.

    PYTHONPATH=src .venv/bin/python bench/dispatch_micro.py [--n 20000] [--profile produce]

CPU µs (``time.process_time``) per request for the small requests of ``bench/request_rate.py``
(the same frames: an idempotent Produce v9 of one 100 B record with acks=all, a consumer Fetch
v11 at the log end that finds the batch just appended, a Heartbeat v4 of a group's only member),
handed to ``exactly.server.dispatch.dispatch`` of a broker opened in this process, as the
connection does minus the socket. No event loop wake-ups, no syscalls but the segment write:
what it shows is the Python work per request that header parsing, handlers, storage and
response encoding cost, steadier than the broker-process figure on a busy box. Run it with
another checkout's ``src`` first on PYTHONPATH to compare two versions.
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
    args = ap.parse_args()
    print(f"exactly from {Path(exactly.__file__).parent}")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory(prefix="exactly-micro-", dir="/dev/shm") as tmp:
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
        producer = ProduceFrames(client, 0)  # type: ignore[arg-type]
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

        async def produce_one() -> None:
            await run(broker, producer.next())

        async def fetch_one(frame: bytes) -> None:
            chunks = await run(broker, frame)
            assert len(chunks) >= 2

        async def heartbeat_one() -> None:
            chunks = await run(broker, beat)
            assert struct.unpack_from(">h", bytes(chunks[1]), 5)[0] == 0

        async def bench(kind: str, n: int) -> float:
            frames = [fetch_frame()] if kind == "fetch" else []
            t0 = time.process_time()
            for _ in range(n):
                if kind == "produce":
                    await produce_one()
                elif kind == "fetch":
                    await fetch_one(frames[0])
                else:
                    await heartbeat_one()
            return (time.process_time() - t0) / n * 1e6

        loop.run_until_complete(bench("produce", 2000))  # warm up, and something to fetch
        for kind in ("produce", "fetch", "heartbeat") * 2:
            print(f"{kind:10} {loop.run_until_complete(bench(kind, args.n)):6.1f} µs CPU / request")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            loop.run_until_complete(bench(args.profile, args.n))
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        broker.logs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
