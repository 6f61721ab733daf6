#!/usr/bin/env python3
"""CPU per bulk Produce through ``KafkaConnection`` on uvloop, in process: the 100 B workload's
request (one idempotent batch of ~6,000 x 100 B records, ~660 KB) fed to the connection as the
socket delivers it (a 4 KB head read, then the rest in 256 KB reads), answered, the frame's
buffer handed back. No socket and no client: the segment write is a real one (ext4 under the
temp dir; not tmpfs, where the segments' 16 MB preallocation zero-fills), so the figure holds
the page-cache write too, but what differs between two checkouts is their Python per request.

    PYTHONPATH=src .venv/bin/python bench/bulk_produce_micro.py [--n 400] [--records 6000] [--reps 5]
        [--no-write]

Why: on the shared box a paired A/B of the 100 B workload moves 20-40% with the client's speed,
so a change of a few µs per request (~1,800 requests per GB) cannot show there; this measures
process CPU per request (``time.process_time``) with the client's part taken out. Run it with the
other checkout's ``src`` first on PYTHONPATH to compare, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package

import crc32c
import uvloop
from tests.server.test_produce_fast import TOPIC, _open, batch, produce_frame

from exactly.server.connection import KafkaConnection

READ = 256 * 1024
HEAD = 4096


class _Transport:
    def __init__(self) -> None:
        self.writes = 0

    def writelines(self, chunks: list[Any]) -> None:
        self.writes += 1

    def write(self, data: Any) -> None:
        self.writes += 1

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _frames(n: int, records: int) -> list[bytes]:
    """``n`` framed Produce requests of one producer, sequences following on."""
    one = bytearray(batch(records, pid=1000, epoch=0, seq=0, size=100))
    frames = []
    for i in range(n):
        struct.pack_into(">i", one, 53, i * records)  # base sequence
        struct.pack_into(">I", one, 17, crc32c.crc32c(memoryview(one)[21:]))
        body = produce_frame([(TOPIC, [(0, bytes(one))])], correlation_id=i)
        frames.append(struct.pack(">i", len(body)) + bytes(body))
    return frames


async def _run(frames: list[bytes], data: Path) -> float:
    broker = _open(data, True)
    conn = KafkaConnection(broker)
    transport = _Transport()
    conn.transport = transport  # type: ignore[assignment]
    conn._task = asyncio.get_running_loop().create_task(conn._process())
    for _ in range(5):
        await asyncio.sleep(0)
    warm = 20
    t0 = 0.0
    for i, raw in enumerate(frames):
        if i == warm:
            t0 = time.process_time()
        view = memoryview(raw)
        pos, end = 0, len(raw)
        first = True
        while pos < end:
            buf = conn.get_buffer(-1)
            n = min(len(buf), end - pos, HEAD if first else READ)
            first = False
            buf[:n] = view[pos : pos + n]
            buf.release()
            conn.buffer_updated(n)
            pos += n
        want = i + 1
        while transport.writes < want:
            await asyncio.sleep(0)
    spent = time.process_time() - t0
    conn._task.cancel()
    broker.logs.close()
    return spent / (len(frames) - warm) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--records", type=int, default=6000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the log goes (default: the temp dir)")
    ap.add_argument(
        "--no-write",
        action="store_true",
        help="the segment pwrite returns at once (the page-cache write's time varies 2x between runs "
        "on this VM and dwarfs a change of the Python per request)",
    )
    args = ap.parse_args()
    if args.no_write:
        import types

        from exactly.storage import file_write

        file_write.os = types.SimpleNamespace(  # type: ignore[assignment]
            pwrite=lambda _fd, data, _pos: len(data), ftruncate=file_write.os.ftruncate
        )
    frames = _frames(args.n, args.records)
    got = []
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            got.append(uvloop.run(_run(frames, Path(d))))
    print(
        f"us per request: median {statistics.median(got):.1f} (min {min(got):.1f}, max {max(got):.1f}); "
        f"{len(frames[0]) / 1e3:.0f} KB per request"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
