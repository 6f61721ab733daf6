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
count), ``requests``.

**Idempotent mode** (``--idempotent``: the cluster bench's blocking load generator, beside
librdkafka). A fair acks=all idempotent producer as Kafka's Java producer is one: a producer id and
epoch from InitProducerId, each batch with the next base sequence (per partition, as the broker
checks them: a gap or a repeat would come back as OUT_OF_ORDER_SEQUENCE_NUMBER or as a duplicate's
old offset), a fresh CRC32C per batch (the sequence is inside the checksummed part), acks=all, at
most ``--in-flight`` (5) requests outstanding. Every answer's base offset must be the previous one
plus the previous batch's record count, so a batch stored twice or lost ends the run with an
error. The process blocks in ``recv`` while its 5 requests are out (Java's ``Selector.poll``
does the same); librdkafka 2.16's broker thread instead polls with timeout 0 in that state (see
bench/README.md, "librdkafka's in-flight spin"), which on this 2-core box takes a core from the
brokers. What it leaves out of the Java producer: no accumulator thread or record-by-record
append (the batches' records are encoded once, before the clock), no retries (an error ends the
run), one partition.

With ``--wait-go`` the process connects, builds its batches, prints ``ready`` and waits for a line
on stdin before the clock starts, so the harness can measure the brokers' CPU over the send phase
alone (``BatchProducerProcess``)."""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import crc32c

if __name__ == "__main__":  # run as a script: the bench directory is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.drivers import ClientRun, payload_pool
from exactly.client.wire import WireClient, error_name
from exactly.protocol.apis import ApiKey
from exactly.records.builder import Record, build_batch

PRODUCE = 0
VERSION = 7  # the last non-flexible Produce version: a fixed layout, hand-encoded below
_REQUEST_HEAD = struct.Struct(">ihhi")  # size, api key, api version, correlation id
_SIZE = struct.Struct(">i")
# v2 batch layout (offsets inside the batch): the CRC32C at 17 covers everything from 21 on; the
# producer id (8), epoch (2) and base sequence (4) sit at 43, 51 and 53
_CRC_AT, _CRC_FROM, _PID_AT, _SEQ_AT = 17, 21, 43, 53
_PRODUCER = struct.Struct(">qhi")
_CRC = struct.Struct(">I")


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


def batch_offset(topic: str, client_id: bytes = b"batch-producer") -> int:
    """Where the record batch starts in ``produce_request``'s frame (it is the request's last field)."""
    head = _REQUEST_HEAD.size + 2 + len(client_id)
    return head + 2 + 2 + 4 + 4 + 2 + len(topic.encode()) + 4 + 4 + 4


def check_response(payload: bytes, correlation: int) -> int:
    """The error code of a Produce v7 response to one partition (ValueError on the wrong id)."""
    return parse_response(payload, correlation)[0]


def parse_response(payload: bytes, correlation: int) -> tuple[int, int]:
    """(error code, base offset) of a Produce v7 response to one partition (ValueError on the
    wrong correlation id)."""
    (got,) = _SIZE.unpack_from(payload, 0)
    if got != correlation:
        raise ValueError(f"response to {got}, expected {correlation}")
    pos = 4 + 4  # correlation id, topics count (1)
    (name_len,) = struct.unpack_from(">h", payload, pos)
    pos += 2 + name_len + 4 + 4  # name, partitions count (1), partition index
    error, base_offset = struct.unpack_from(">hq", payload, pos)
    return int(error), int(base_offset)


def stamp_batch(frame: bytearray, batch_at: int, producer_id: int, epoch: int, sequence: int) -> None:
    """Write the producer id, epoch and base sequence into the batch at ``batch_at`` of ``frame``
    and its CRC32C over the covered part (in place: no copy of the records)."""
    _PRODUCER.pack_into(frame, batch_at + _PID_AT, producer_id, epoch, sequence)
    with memoryview(frame) as view:
        crc = crc32c.crc32c(view[batch_at + _CRC_FROM :])
    _CRC.pack_into(frame, batch_at + _CRC_AT, crc)


def init_producer_id(bootstrap: str) -> tuple[int, int]:
    """A producer id and epoch for an idempotent (non-transactional) producer."""
    with WireClient.connect(bootstrap, client_id="batch-producer") as client:
        response = client.call(
            ApiKey.INIT_PRODUCER_ID,
            client.version_for(ApiKey.INIT_PRODUCER_ID),
            transactional_id=None,
            transaction_timeout=datetime.timedelta(milliseconds=60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
    if response.error_code:
        raise RuntimeError(f"InitProducerId failed: {error_name(response.error_code)}")
    return int(response.producer_id), int(response.producer_epoch)


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
    return _result(out.returncode, out.stdout, out.stderr)


def _result(returncode: int, stdout: str, stderr: str) -> ClientRun:
    result = ClientRun()
    lines = stdout.strip().splitlines()
    if returncode != 0 or not lines or not lines[-1].startswith("{"):
        result.errors.append(f"batch producer exit {returncode}: {(stdout + stderr)[-500:]}")
        return result
    figures = json.loads(lines[-1])
    result.wall_s, result.client_cpu_s = figures["wall_s"], figures["cpu_s"]
    result.records, result.bytes = figures["records"], figures["bytes"]
    result.errors += [f"error code {e}" for e in figures.get("errors", [])]
    for key in ("requests", "producer_id", "first_offset", "last_offset"):
        if key in figures:
            result.extra[key] = figures[key]
    return result


class BatchProducerProcess:
    """The idempotent acks=all mode as a process that is ready (connected, producer id in hand,
    batches encoded) before ``go()`` starts its clock: the harness meters the send phase alone."""

    def __init__(self, bootstrap: str, topic: str, records: int, timeout: float) -> None:
        cmd = [
            sys.executable, __file__, bootstrap, topic, "--records", str(records),
            "--idempotent", "--acks", "-1", "--wait-go",
        ]  # fmt: skip
        self.timeout = timeout
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline()  # "ready", or the start of an error report

    def go(self) -> ClientRun:
        """Start the send phase and wait for the figures."""
        if self.first.strip() != "ready":
            out, err = self.proc.communicate(timeout=self.timeout)
            return _result(self.proc.returncode or 1, self.first + out, err)
        try:
            out, err = self.proc.communicate("go\n", timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            result = ClientRun()
            result.errors.append(f"batch producer did not finish in {self.timeout:.0f} s")
            return result
        return _result(self.proc.returncode, out, err)


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
    parser.add_argument("--idempotent", action="store_true", help="producer id + sequences (see above)")
    parser.add_argument("--wait-go", action="store_true", help="print 'ready', wait for a stdin line")
    parser.add_argument("--ca", help="CA file: connect with TLS (OpenSSL's defaults, TLS 1.2+)")
    args = parser.parse_args()
    producer_id, epoch = init_producer_id(args.bootstrap) if args.idempotent else (-1, -1)
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
        tail = produce_request(
            args.topic,
            build_batch([Record(v) for v in values], base_timestamp=int(time.time() * 1000)),
            args.acks,
        )
    else:
        tail = batches[(requests - 1) % len(batches)]
    if args.wait_go:
        print("ready", flush=True)
        sys.stdin.readline()
    outstanding: deque[tuple[int, int]] = deque()  # (correlation id, records)
    errors: list[int] = []
    acked = 0
    first_offset = next_offset = -1
    sequence = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for n in range(requests):
        frame = tail if n == requests - 1 else batches[n % len(batches)]
        count = last if n == requests - 1 else args.batch_records
        struct.pack_into(">i", frame, 8, n + 1)
        if args.idempotent:
            # the batch is the request's last field; sendall returns only once the kernel has the
            # bytes, so the frame can be stamped again for its next use
            stamp_batch(frame, batch_offset(args.topic), producer_id, epoch, sequence)
            sequence += count
        sock.sendall(frame)
        outstanding.append((n + 1, count))
        while len(outstanding) >= args.in_flight or (n == requests - 1 and outstanding):
            correlation, sent = outstanding.popleft()
            error, base_offset = parse_response(_recv_frame(sock), correlation)
            if error:
                errors.append(error)
                continue
            if first_offset < 0:
                first_offset = next_offset = base_offset
            if base_offset != next_offset:  # a batch stored twice, or one lost
                errors.append(-1000)
                print(f"base offset {base_offset}, expected {next_offset}", file=sys.stderr)
            next_offset = base_offset + sent
            acked += sent
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
                "producer_id": producer_id,
                "first_offset": first_offset,
                "last_offset": next_offset - 1,
                "errors": errors[:5],
            }
        )
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
