"""Physical-limit probes measured by the same harness: loopback TCP and page-cache write bandwidth."""

from __future__ import annotations

import os
import socket
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
