#!/usr/bin/env python3
"""CPU per MB of the two byte-moving system calls of a replicated append, outside the broker.

    python bench/write_send_micro.py write [--mb 256] [--rounds 10] [--dir DIR]
    python bench/write_send_micro.py send [--mb 256] [--rounds 10] [--dir DIR]
    python bench/write_send_micro.py shape [--mb 256] [--rounds 12] [--dir DIR]

Why: ``rf3cpu-s20.md`` found 85-90% of an RF 3 cluster's CPU per GB in the kernel: the segment
``pwrite`` on every broker and the leader's loopback ``sendfile`` of each follower answer. Before
changing either, this measures what the alternatives cost on this kernel and file system.
Variants alternate round by round (order reversed every other round), so a loaded box shifts
them alike; each row gives the median (min-max) and, against the row the broker does today, the
median of the per-round ratios and the rounds it was lower in.

- ``write``: appending ``--mb`` MB in 1 MB (``--write-kb``) ``pwrite``s to a new file in
  ``--dir``: growing (no reservation), ``keep16``/``keep64`` (``fallocate(FALLOC_FL_KEEP_SIZE)``
  16 or 64 MB past each write that passes the reservation: what ``storage.file_write.BlockReserve``
  does today with 16), ``full_fallocate`` (the whole file reserved and sized up front), Kafka's
  ``log.preallocate`` (``RandomAccessFile.setLength``: ``ftruncate`` to the full size, a sparse
  file) and ``overwrite`` (the same bytes into pages already in the page cache: the copy alone,
  the floor). This thread's CPU (RUSAGE_THREAD), so the kernel's writeback threads are not in it,
  as they are not in a broker's CPU.
- ``send``: a page-cached file sent over loopback TCP as the leader answers a follower: the
  follower sends a 100-byte request, the leader answers with a ``sendfile`` of the next 1 MB on a
  non-blocking socket (the rest, on EAGAIN, copied as ``plain_write.send_slice`` does, counted).
  Leader-side socket options (SO_SNDBUF, TCP_CORK), larger answers, follower receive buffers.
  Each side's process CPU (RUSAGE_SELF): loopback runs the receiver's TCP input in the sender's
  context, so the leader's figure includes it, as the broker's does.
- ``shape``: the answer as ``plain_write`` writes it (72-byte header, 1 MB slice, 3-byte trailer),
  corked (today), uncorked, or the header with MSG_MORE; leader CPU and follower reads per answer.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import resource
import select
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MB = 1 << 20
_LIBC = ctypes.CDLL(None, use_errno=True)
_FALLOCATE = _LIBC.fallocate
_FALLOCATE.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_FALLOCATE.restype = ctypes.c_int
KEEP_SIZE = 1


def _thread_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _report(rows: dict[str, list[tuple[float, ...]]], today: str, labels: tuple[str, ...]) -> None:
    """Median (min-max) of each figure; per-round ratio of the first figure to ``today``'s."""
    for name, runs in rows.items():
        parts = []
        for i, label in enumerate(labels):
            xs = [r[i] for r in runs]
            parts.append(f"{label} {statistics.median(xs):7.1f} ({min(xs):.1f}-{max(xs):.1f})")
        ratios = [a[0] / b[0] for a, b in zip(runs, rows[today], strict=True)]
        lower = sum(x < 1 for x in ratios)
        print(
            f"{name:18s} "
            + "  ".join(parts)
            + f"  vs {today}: {statistics.median(ratios):.3f}, lower {lower}/{len(ratios)}"
        )


def _alternate(
    variants: list[str], rounds: int, run: Callable[[str], tuple[float, ...]]
) -> dict[str, list[tuple[float, ...]]]:
    rows: dict[str, list[tuple[float, ...]]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            rows[v].append(run(v))
    return rows


# --- write ------------------------------------------------------------------------------------
WRITE_VARIANTS = ["grow", "keep16", "keep64", "full_fallocate", "kafka_ftruncate", "overwrite"]


def _write_once(directory: Path, total: int, write_size: int, variant: str) -> tuple[float, ...]:
    path = directory / "segment.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    data = os.urandom(write_size)
    try:
        if variant == "full_fallocate":
            os.posix_fallocate(fd, 0, total)
        elif variant == "kafka_ftruncate":
            os.ftruncate(fd, total)
        elif variant == "overwrite":
            for pos in range(0, total, write_size):
                os.pwrite(fd, data, pos)
        ahead = {"keep16": 16 * MB, "keep64": 64 * MB}.get(variant, 0)
        upto = 0
        start = _thread_cpu()
        for pos in range(0, total, write_size):
            if ahead and pos + write_size > upto:
                _FALLOCATE(fd, KEEP_SIZE, pos, write_size + ahead)
                upto = pos + write_size + ahead
            os.pwrite(fd, data, pos)
        used = _thread_cpu() - start
    finally:
        os.close(fd)
        path.unlink()
    os.sync()  # the next variant starts without this one's dirty pages in flight
    time.sleep(0.2)
    return (used / (total / MB) * 1e6,)


# --- send -------------------------------------------------------------------------------------
SEND_VARIANTS: dict[str, dict[str, Any]] = {
    "1M (today)": {},
    "1M sndbuf 4M": {"sndbuf": 4 * MB},
    "1M cork": {"cork": 1},
    "2M answers": {"answer": 2 * MB},
    "4M answers": {"answer": 4 * MB},
    "1M rcvbuf 4M": {"rcvbuf": 4 * MB},
    "1M recv 256K": {"recv": 256 * 1024},
}


def _follower(
    port: int, out: mp.Queue[tuple[float, int]], total: int, answer: int, rcvbuf: int, recv: int, extra: int
) -> None:
    """Ask for an answer, read all of it (``recv`` bytes a read at most), repeat."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(bytearray(answer + extra))
    got = reads = 0
    start = _process_cpu()
    while got < total:
        s.send(b"x" * 100)
        have = 0
        while have < answer + extra:
            n = s.recv_into(view[have : have + recv])
            if not n:
                raise ConnectionError("leader closed")
            have += n
            reads += 1
        got += answer
    out.put((_process_cpu() - start, reads))
    s.close()


def _serve(
    source: Path,
    total: int,
    *,
    answer: int = MB,
    sndbuf: int = 0,
    rcvbuf: int = 0,
    recv: int = MB,
    cork: int = 0,
    shape: str = "",
) -> tuple[float, ...]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    extra = 75 if shape else 0
    out: mp.Queue[tuple[float, int]] = mp.Queue()
    proc = mp.Process(
        target=_follower,
        args=(listener.getsockname()[1], out, total, answer, rcvbuf, min(recv, answer + extra), extra),
    )
    proc.start()
    conn, _ = listener.accept()
    listener.close()
    if sndbuf:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setblocking(False)
    fd, sock = os.open(source, os.O_RDONLY), conn.fileno()
    copied = pos = 0
    start = _process_cpu()
    while pos < total:
        select.select([sock], [], [])
        conn.recv(100)
        if cork or shape == "cork":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        if shape:
            conn.send(b"h" * 72, socket.MSG_MORE if shape == "more" else 0)
        sent = 0
        try:
            while sent < answer:
                sent += os.sendfile(sock, fd, pos + sent, answer - sent)
        except BlockingIOError:  # plain_write.send_slice: the rest goes as a copy
            rest = memoryview(os.pread(fd, answer - sent, pos + sent))
            copied += len(rest)
            while rest:
                try:
                    rest = rest[conn.send(rest) :]
                except BlockingIOError:
                    select.select([], [sock], [])
        if shape:
            conn.send(b"t" * 3)
        if cork or shape == "cork":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        pos += answer
    leader = _process_cpu() - start
    follower, reads = out.get()
    proc.join()
    conn.close()
    os.close(fd)
    mbs = total / MB
    return leader / mbs * 1e6, follower / mbs * 1e6, reads / (total // answer), copied / total


def _source(directory: Path, total: int) -> Path:
    path = directory / "source.log"
    if not path.exists() or path.stat().st_size != total:
        with path.open("wb") as f:
            for _ in range(total // MB):
                f.write(os.urandom(MB))
    with path.open("rb") as f:  # in the page cache, as a just-appended batch is
        while f.read(16 * MB):
            pass
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["write", "send", "shape"])
    ap.add_argument("--mb", type=int, default=256, help="MB moved per variant and round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--write-kb", type=int, default=1024, help="write size (write)")
    ap.add_argument("--dir", type=Path, help="a directory on the file system the brokers use")
    args = ap.parse_args()
    total = args.mb * MB
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        print(
            f"kernel {os.uname().release}, {args.mb} MB per variant, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}"
        )
        if args.what == "write":
            size = args.write_kb * 1024
            rows = _alternate(WRITE_VARIANTS, args.rounds, lambda v: _write_once(directory, total, size, v))
            _report(rows, "keep16", ("us/MB",))
        elif args.what == "send":
            source = _source(directory, total)
            rows = _alternate(
                list(SEND_VARIANTS), args.rounds, lambda v: _serve(source, total, **SEND_VARIANTS[v])
            )
            _report(rows, "1M (today)", ("leader us/MB", "follower us/MB", "reads/answer", "copied"))
        else:
            source = _source(directory, total)
            rows = _alternate(
                ["cork", "nocork", "more"], args.rounds, lambda v: _serve(source, total, shape=v)
            )
            _report(rows, "cork", ("leader us/MB", "follower us/MB", "reads/answer", "copied"))
        print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
