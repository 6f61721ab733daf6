"""Micro-benchmark of a leader answering a reader that is more than max_bytes behind.

    PYTHONPATH=src .venv/bin/python bench/leader_read_micro.py [--batches 64] [--rounds 3]

A segment of ``--batches`` ~1 MB batches (1,000 records of 1 KB: the bench's produce batches)
is read from its start in ``max_bytes`` (1 MiB, replica.fetch.max.bytes) steps, so every read is
cut after one whole batch, and each answer is sent over TCP loopback to a child process that
drains it. *copy* = ``read_batches`` without ``slice_from`` (a max_bytes ``pread``, the cut copy,
``sendall``: what a cut read did before), *slice* = with ``slice_from`` (the cut found from
headers, ``os.sendfile`` from the segment). CPU seconds of this process (the leader's side;
``time.process_time``) per 10^9 bytes sent, alternating the two modes per round; and the drain's
(the reader's: a follower's receive), a fresh process per round, its Python start-up included. Figures: bench/results/rf3-ratio-s16.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.storage.helpers import make_batch

from exactly.records.batch import BatchHeader
from exactly.storage.file_slice import FileSlice
from exactly.storage.log_read import read_batches
from exactly.storage.segment import LogSegment

MAX_BYTES = 1 << 20
DRAIN = (
    "import socket,sys\n"
    "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])));b=bytearray(1<<20)\n"
    "while s.recv_into(b):pass\n"
)


def build(directory: Path, count: int) -> LogSegment:
    segment = LogSegment.create(directory, 0, index_interval_bytes=4096, index_max_bytes=1 << 20, now_ms=0)
    for _ in range(count):
        batch = make_batch(1000, value_size=1024)
        batch[0:8] = segment.next_offset.to_bytes(8, "big")
        segment.append(batch, BatchHeader.parse(batch))
    return segment


def serve(segment: LogSegment, conn: socket.socket, slice_from: int | None) -> tuple[float, int]:
    end = segment.next_offset
    offset, sent = 0, 0
    c0 = time.process_time()
    while offset < end:
        data, offset = read_batches([segment], [0], end, offset, end, MAX_BYTES, True, slice_from)
        if isinstance(data, FileSlice):
            done = 0
            while done < data.size:
                done += os.sendfile(conn.fileno(), data.fileno(), data.offset + done, data.size - done)
            sent += data.size
            data.close()
        else:
            conn.sendall(data)
            sent += len(data)
    return time.process_time() - c0, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="exactly-leader-micro-"))
    segment = build(directory, args.batches)
    listener = socket.create_server(("127.0.0.1", 0))
    figures: dict[str, list[tuple[float, float]]] = {"copy": [], "slice": []}
    for rnd in range(args.rounds):
        for mode in ("copy", "slice") if rnd % 2 == 0 else ("slice", "copy"):
            # a fresh drain per round, so its CPU (the reader's side: a follower's receive) is
            # its whole rusage
            drain = subprocess.Popen([sys.executable, "-c", DRAIN, str(listener.getsockname()[1])])
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            started = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu, sent = serve(segment, conn, None if mode == "copy" else 64 * 1024)
            conn.close()
            drain.wait(30)
            ended = resource.getrusage(resource.RUSAGE_CHILDREN)
            reader = ended.ru_utime + ended.ru_stime - started.ru_utime - started.ru_stime
            figures[mode].append((cpu / (sent / 1e9), reader / (sent / 1e9)))
    segment.close()
    shutil.rmtree(directory)
    for mode, values in figures.items():
        print(f"{mode:5s} CPU-s/GB leader side: " + ", ".join(f"{v:.3f}" for v, _ in values))
        print(
            f"{mode:5s} CPU-s/GB reader side (incl. its start-up): "
            + ", ".join(f"{r:.3f}" for _, r in values)
        )


if __name__ == "__main__":
    main()
