"""A producer that sends prebuilt record batches in whole requests: full-size TLS records.

Why it exists: librdkafka writes one TLS record per buffer segment, and its Produce buffers put
most 1 KB values of a batch in a segment of their own, so kcat's TLS produce stream carries ~450
records per MB instead of the ~61 a whole 1 MB request makes (bench/results/tls-s14.md). Both ends
pay per record. This client writes each request with one ``sendall``; over TLS OpenSSL cuts it
into maximum-size (16 KB) records, as the Java client, kafka-python and aiokafka do. Measured
beside kcat on both transports, it separates what the broker's TLS path costs per byte from what
librdkafka's fragmentation adds (bench/tls_ab.py's ``batch-producer`` rows).

What it sends: ``--records`` records of ``--record-size`` bytes (the bench's payload pool) as v2
batches of ``--batch-records`` records (a 1 MB batch at 1 KB, kcat's batch size), with no
producer id (not idempotent: the batches can be sent again unchanged), one batch per Produce v7
request, acks=1, up to ``--in-flight`` requests outstanding (librdkafka's 5). The batches are
built and checksummed before the clock starts; each request's correlation id is patched in place.
Every response is read and its error code checked, so the count of acknowledged records is
exact; any error ends the run with a non-zero exit.

Run as a process (its CPU is the client's, apart from the broker's):

    python bench/benchlib/batch_producer.py HOST:PORT TOPIC --records 300000 [--ca ca.pem]

It prints one JSON line: ``wall_s`` and ``cpu_s`` of the send phase (connection and batch
building excluded: Python's start-up would otherwise be a visible share of a 2 s run, which
kcat, a C program, does not pay), ``records``, ``bytes`` (record value bytes, as kcat's rows
count), ``requests``."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

if __name__ == "__main__":  # run as a script: the bench directory is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.drivers import ClientRun, payload_pool
from exactly.records.builder import Record, build_batch

PRODUCE = 0
VERSION = 7  # the last non-flexible Produce version: a fixed layout, hand-encoded below
_REQUEST_HEAD = struct.Struct(">ihhi")  # size, api key, api version, correlation id
_SIZE = struct.Struct(">i")


def produce_request(topic: str, batch: bytes, acks: int, client_id: bytes = b"batch-producer") -> bytearray:
    """A whole Produce v7 request frame (size prefix included) for ``batch`` to partition 0;
    correlation id 0 (patched per send)."""
    name = topic.encode()
    body = (
        struct.pack(">hhi", -1, acks, 30_000)  # transactional id null, acks, timeout
        + struct.pack(">ih", 1, len(name))
        + name
        + struct.pack(">iii", 1, 0, len(batch))  # one partition: index 0, records
        + batch
    )
    header = struct.pack(">h", len(client_id)) + client_id
    frame = bytearray(_REQUEST_HEAD.pack(0, PRODUCE, VERSION, 0) + header + body)
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    return frame


def check_response(payload: bytes, correlation: int) -> int:
    """The error code of a Produce v7 response to one partition (ValueError on the wrong id)."""
    (got,) = _SIZE.unpack_from(payload, 0)
    if got != correlation:
        raise ValueError(f"response to {got}, expected {correlation}")
    pos = 4 + 4  # correlation id, topics count (1)
    (name_len,) = struct.unpack_from(">h", payload, pos)
    pos += 2 + name_len + 4 + 4  # name, partitions count (1), partition index
    (error,) = struct.unpack_from(">h", payload, pos)
    return int(error)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        out += chunk
    return bytes(out)


def _recv_frame(sock: socket.socket) -> bytes:
    (size,) = _SIZE.unpack(_recv_exact(sock, 4))
    return _recv_exact(sock, size)


def run(bootstrap: str, topic: str, records: int, timeout: float, ca: Path | None = None) -> ClientRun:
    """Run this producer as a process against an existing ``topic``; its figures as a ClientRun
    (wall and CPU seconds of the send phase, acknowledged records and their value bytes)."""
    cmd = [sys.executable, __file__, bootstrap, topic, "--records", str(records)]
    if ca is not None:
        cmd += ["--ca", str(ca)]
    result = ClientRun()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        result.errors.append(f"batch producer did not finish in {timeout:.0f} s")
        return result
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        result.errors.append(f"batch producer exit {out.returncode}: {(out.stdout + out.stderr)[-500:]}")
        return result
    figures = json.loads(lines[-1])
    result.wall_s, result.client_cpu_s = figures["wall_s"], figures["cpu_s"]
    result.records, result.bytes = figures["records"], figures["bytes"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--batch-records", type=int, default=960, help="records per batch (~1 MB)")
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--acks", type=int, default=1)
    parser.add_argument("--ca", help="CA file: connect with TLS (OpenSSL's defaults, TLS 1.2+)")
    args = parser.parse_args()
    pool = payload_pool(args.record_size)
    batches: list[bytearray] = []
    for b in range(4):  # a few different batches, cycled (one would do; this keeps data varied)
        values = [pool[(b * args.batch_records + i) % len(pool)] for i in range(args.batch_records)]
        batch = build_batch([Record(v) for v in values], base_timestamp=int(time.time() * 1000))
        batches.append(produce_request(args.topic, batch, args.acks))
    host, port = args.bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if args.ca:
        context = ssl.create_default_context(cafile=args.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        sock = context.wrap_socket(sock, server_hostname=host)
    requests = -(-args.records // args.batch_records)
    last = args.records - (requests - 1) * args.batch_records
    if last != args.batch_records:  # the final request carries the remainder
        values = [pool[i % len(pool)] for i in range(last)]
        tail = produce_request(args.topic, build_batch([Record(v) for v in values]), args.acks)
    else:
        tail = batches[(requests - 1) % len(batches)]
    outstanding: deque[int] = deque()
    errors: list[int] = []
    acked = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for n in range(requests):
        frame = tail if n == requests - 1 else batches[n % len(batches)]
        struct.pack_into(">i", frame, 8, n + 1)
        sock.sendall(frame)
        outstanding.append(n + 1)
        while len(outstanding) >= args.in_flight or (n == requests - 1 and outstanding):
            correlation = outstanding.popleft()
            error = check_response(_recv_frame(sock), correlation)
            if error:
                errors.append(error)
            else:
                acked += last if correlation == requests else args.batch_records
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sock.close()
    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "records": acked,
                "bytes": acked * args.record_size,
                "requests": requests,
                "errors": errors[:5],
            }
        )
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
