#!/usr/bin/env python3
"""What a follower's receive-and-append of a 1 MB Fetch answer costs in CPU, by way (fsplice-s21).

    .venv/bin/python bench/splice_micro.py [--answers 100] [--rounds 5] [--size 1048576] [--dir D]

Why: at RF 3 most of a follower's CPU per GB is the kernel moving bytes (``rf3cpu-s20.md``: socket
receive ``_copy_to_iter`` 13-19%, segment ``pwrite`` 9-11%). This asks, on this kernel and file
system, what each way of getting one answer's records from the leader's socket into the segment
file costs, so that a change to the follower is made only for a measured gain.

A sender process plays the leader as the broker does it: per request (4 bytes) it answers with a
size-prefixed frame whose head (response and partition headers, ~70 bytes) goes with ``send``, the
records (one v2 batch) with ``os.sendfile`` from a file (the leader's page cache) and the trailer
(tags) with ``send``. The receiver (this process, blocking socket, no event loop: the kernel's
share is what is asked) takes each answer one of these ways, alternating ways round by round,
and reports its own CPU (``getrusage``: user + system) per MB of records:

- ``streams``: ``recv`` of 256 KB chunks appended to a bytearray, the frame taken out as bytes
  (asyncio streams' ``readexactly``), records ``pwrite`` to the file.
- ``recv_into``: the frame received straight into a reusable frame-sized buffer (what
  ``replica_channel`` does today through uvloop's ``BufferedProtocol``), records ``pwrite``.
- ``recv_into+crc``: the same, plus crc32c of the batch (Kafka's follower checks it).
- ``splice``: head and trailer received into a buffer; the records ``os.splice``d socket -> pipe
  (1 MB) -> file at the segment position; the batch header read back with ``pread`` (61 bytes).
- ``splice+crc pread``: the same, plus the records read back with ``preadv`` into a reusable
  buffer and crc32c over it.
- ``splice+crc mmap``: the same, plus crc32c over an ``mmap`` of the just-written range.

Each round writes a new file in ``--dir`` (default: a temporary directory under /tmp, ext4 on
this box) and removes it after, so every way pays the same page-cache allocation.
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import resource
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from multiprocessing import Process

import crc32c

HEAD = 70  # response + partition headers before the records (Fetch v12, one partition)
TRAIL = 3  # partition, topic and response tags
BATCH_HEADER = 61
F_SETPIPE_SZ = 1031


def _serve(port_file: str, size: int, data_dir: str) -> None:
    """The leader: answer each 4-byte request with one frame, records with sendfile."""
    path = os.path.join(data_dir, "leader.log")
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.rename(port_file + ".tmp", port_file)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = struct.pack(">i", HEAD + size + TRAIL) + bytes(HEAD)
    trail = bytes(TRAIL)
    while True:
        req = conn.recv(4)
        if len(req) < 4:
            return
        conn.sendall(head)
        sent = 0
        while sent < size:
            sent += os.sendfile(conn.fileno(), fd, sent, size - sent)
        conn.sendall(trail)


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    n = len(view)
    while got < n:
        r = sock.recv_into(view[got:])
        if r == 0:
            raise ConnectionError("closed")
        got += r


class Receiver:
    """One connection to the leader, one file per round."""

    def __init__(self, sock: socket.socket, size: int, data_dir: str) -> None:
        self.sock = sock
        self.size = size
        self.dir = data_dir
        self.frame = bytearray(4 + HEAD + size + TRAIL)
        self.back = bytearray(size)
        self.small = bytearray(HEAD + 4)
        self.pipe_r, self.pipe_w = os.pipe()
        fcntl.fcntl(self.pipe_w, F_SETPIPE_SZ, size)
        self.fd = -1
        self.null = os.open(os.devnull, os.O_WRONLY)
        self.pos = 0
        self.recvs = 0

    def new_file(self, name: str) -> None:
        self.fd = os.open(os.path.join(self.dir, name), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.pos = 0

    def drop_file(self, name: str) -> None:
        os.close(self.fd)
        os.unlink(os.path.join(self.dir, name))

    def ask(self) -> None:
        self.sock.sendall(b"\0\0\0\1")

    # ---- the ways ------------------------------------------------------------------------
    def streams(self) -> None:
        self.ask()
        buf = bytearray()
        need = 4 + HEAD + self.size + TRAIL
        while len(buf) < need:
            chunk = self.sock.recv(262144)
            self.recvs += 1
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        frame = bytes(buf[4:need])
        del buf[:need]
        with memoryview(frame) as v:
            os.pwrite(self.fd, v[HEAD : HEAD + self.size], self.pos)
        self.pos += self.size

    def _recv_frame(self) -> memoryview:
        self.ask()
        view = memoryview(self.frame)
        got = 0
        n = len(view)
        while got < n:
            r = self.sock.recv_into(view[got:])
            self.recvs += 1
            if r == 0:
                raise ConnectionError("closed")
            got += r
        return view

    def recv_into(self) -> None:
        with self._recv_frame() as view:
            os.pwrite(self.fd, view[4 + HEAD : 4 + HEAD + self.size], self.pos)
        self.pos += self.size

    def recv_only(self) -> None:
        """The receive alone (the records not written: the split of ``recv_into``)."""
        self._recv_frame().release()

    def splice_only(self) -> None:
        """Socket -> pipe only, the pipe drained to /dev/null (the split of ``splice``)."""
        self.ask()
        with memoryview(self.small) as v:
            _recv_exact_into(self.sock, v)
        left = self.size
        sock = self.sock.fileno()
        while left:
            n = os.splice(sock, self.pipe_w, left)
            self.recvs += 1
            if n == 0:
                raise ConnectionError("closed")
            left -= n
            while n:
                n -= os.splice(self.pipe_r, self.null, n)
        with memoryview(self.small) as v:
            _recv_exact_into(self.sock, v[:TRAIL])

    def recv_into_crc(self) -> None:
        with self._recv_frame() as view:
            records = view[4 + HEAD : 4 + HEAD + self.size]
            crc32c.crc32c(records[21:])
            os.pwrite(self.fd, records, self.pos)
            records.release()
        self.pos += self.size

    def _splice(self) -> int:
        self.ask()
        with memoryview(self.small) as v:
            _recv_exact_into(self.sock, v)
        start = self.pos
        left = self.size
        sock = self.sock.fileno()
        while left:
            n = os.splice(sock, self.pipe_w, left)
            self.recvs += 1
            if n == 0:
                raise ConnectionError("closed")
            while n:
                w = os.splice(self.pipe_r, self.fd, n, offset_dst=self.pos)
                self.pos += w
                n -= w
                left -= w
        with memoryview(self.small) as v:
            _recv_exact_into(self.sock, v[:TRAIL])
        os.pread(self.fd, BATCH_HEADER, start)
        return start

    def splice(self) -> None:
        self._splice()

    def splice_crc_pread(self) -> None:
        start = self._splice()
        os.preadv(self.fd, [self.back], start)
        with memoryview(self.back) as v:
            crc32c.crc32c(v[21:])

    def splice_crc_mmap(self) -> None:
        start = self._splice()
        base = start - start % mmap.ALLOCATIONGRANULARITY
        with (
            mmap.mmap(self.fd, self.pos - base, offset=base, access=mmap.ACCESS_READ) as m,
            memoryview(m) as v,
        ):
            crc32c.crc32c(v[start - base + 21 :])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=1_048_576)
    ap.add_argument("--dir", default=None)
    ap.add_argument(
        "--ways", default="streams,recv_into,recv_into_crc,splice,splice_crc_pread,splice_crc_mmap"
    )
    args = ap.parse_args()
    data_dir = args.dir or tempfile.mkdtemp(prefix="fsplice-micro-", dir="/tmp")
    port_file = os.path.join(data_dir, "port")
    server = Process(target=_serve, args=(port_file, args.size, data_dir), daemon=True)
    server.start()
    while not os.path.exists(port_file):
        time.sleep(0.01)
    with open(port_file) as f:
        port = int(f.read())
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rx = Receiver(sock, args.size, data_dir)
    ways: dict[str, Callable[[], None]] = {w: getattr(rx, w) for w in args.ways.split(",")}
    per_mb: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
    recvs: dict[str, list[float]] = {w: [] for w in ways}
    mb = args.answers * args.size / 1e6
    for way in ways.values():  # warm-up
        rx.new_file("warm")
        for _ in range(5):
            way()
        rx.drop_file("warm")
    for r in range(args.rounds):
        order = list(ways.items()) if r % 2 == 0 else list(reversed(ways.items()))
        for name, way in order:
            rx.new_file(name)
            rx.recvs = 0
            before = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(args.answers):
                way()
            after = resource.getrusage(resource.RUSAGE_SELF)
            rx.drop_file(name)
            user = (after.ru_utime - before.ru_utime) / mb * 1e6
            system = (after.ru_stime - before.ru_stime) / mb * 1e6
            per_mb[name].append((user + system, user, system))
            recvs[name].append(rx.recvs / args.answers)
    print(
        f"load {os.getloadavg()[0]:.1f}; {args.answers} answers of {args.size} B per round, {args.rounds} rounds"
    )
    print(f"{'way':<18} {'µs CPU/MB':>10} {'(min-max)':>14} {'user':>7} {'sys':>7} {'reads/answer':>13}")
    for name in ways:
        tot = [t for t, _, _ in per_mb[name]]
        print(
            f"{name:<18} {statistics.median(tot):10.0f} ({min(tot):5.0f}-{max(tot):5.0f}) "
            f"{statistics.median(u for _, u, _ in per_mb[name]):7.0f} "
            f"{statistics.median(s for _, _, s in per_mb[name]):7.0f} {statistics.median(recvs[name]):13.1f}"
        )
    sock.close()
    server.join(timeout=5)
    os.close(rx.pipe_r)
    os.close(rx.pipe_w)


if __name__ == "__main__":
    main()
