"""Physical-limit probes measured by the same harness: loopback TCP and page-cache write bandwidth,
and the request/response round-trip floor at a fixed rate (next to latency-1k)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchlib import procstat
from benchlib.drivers import ClientRun

MB = 1 << 20


def loopback_tcp(seconds: float = 2.0, chunk: int = MB) -> ClientRun:
    """One TCP connection over 127.0.0.1, a thread pushing ``chunk``-byte sendall()s for ``seconds``,
    another draining with recv_into() — the ceiling any broker+client pair on this box shares."""
    run = ClientRun()
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname(), timeout=30)
    conn, _ = srv.accept()
    conn.settimeout(30)
    received = [0]

    def drain() -> None:
        buf = bytearray(chunk)
        view = memoryview(buf)
        for _ in range(10_000_000):
            n = conn.recv_into(view)
            if not n:
                return
            received[0] += n

    reader = threading.Thread(target=drain, daemon=True)
    data = os.urandom(chunk)
    c0, t0 = procstat.self_cpu_seconds(), time.perf_counter()
    reader.start()
    end = t0 + seconds
    for _ in range(10_000_000):
        cli.sendall(data)
        if time.perf_counter() >= end:
            break
    cli.shutdown(socket.SHUT_WR)
    reader.join(60)
    run.wall_s = time.perf_counter() - t0
    run.client_cpu_s = procstat.self_cpu_seconds() - c0
    for s in (cli, conn, srv):
        s.close()
    run.bytes = received[0]
    run.records = run.bytes // chunk
    return run


def pagecache_write(directory: Path, total: int, chunk: int = MB) -> ClientRun:
    """Write ``total`` bytes in ``chunk``-byte writes to a fresh file in ``directory``, no fsync."""
    run = ClientRun()
    path = directory / f"pagecache-{os.getpid()}.bin"
    data = os.urandom(chunk)
    c0, t0 = procstat.self_cpu_seconds(), time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        for _ in range(total // chunk):
            written += os.write(fd, data)
    finally:
        os.close(fd)
    run.wall_s = time.perf_counter() - t0
    run.client_cpu_s = procstat.self_cpu_seconds() - c0
    path.unlink(missing_ok=True)
    run.bytes = written
    run.records = written // chunk
    return run


_ECHO_SERVER = """
import asyncio, sys
try:
    import uvloop
except ImportError:
    uvloop = None

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(data)

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

(uvloop.run if uvloop else asyncio.run)(main())
"""


def echo_rtt(rate: int, seconds: float, size: int = 1024) -> tuple[list[float], float, float]:
    """The round-trip floor of this box at ``rate`` requests/s: a ``size``-byte request to a
    one-line asyncio (uvloop) echo server in its own process, answered before the next is sent,
    from a blocking client socket. Returns (sorted RTTs in ms, wall s, server CPU s). What a
    broker adds on top of this is its own; the rest is the kernel and the scheduler of a shared
    machine (the latency-1k client additionally runs librdkafka threads and a consumer)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = os.urandom(size)
        buf = bytearray(size)
        view = memoryview(buf)
        rtts: list[float] = []
        total = int(rate * seconds)
        cpu0 = procstat.cpu_seconds(proc.pid)
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            left = due - time.perf_counter()
            if left > 0:
                time.sleep(left)
            t0 = time.perf_counter_ns()
            sock.sendall(payload)
            got = 0
            for _ in range(100_000):
                if got >= size:
                    break
                n = sock.recv_into(view[got:])
                if not n:
                    raise ConnectionError("echo server closed the connection")
                got += n
            rtts.append((time.perf_counter_ns() - t0) / 1e6)
        wall = time.perf_counter() - start
        cpu = procstat.cpu_seconds(proc.pid) - cpu0
        sock.close()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    rtts.sort()
    return rtts, wall, cpu
