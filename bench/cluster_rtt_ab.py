#!/usr/bin/env python3
"""Paired A/B of the acks=all replication round trip: one Produce in flight, closed loop.

    PYTHONPATH=src .venv/bin/python bench/cluster_rtt_ab.py --base /tmp/base-s17/src [--pairs 6] [--requests 2000] [--version 9]

Why beside ``cluster_ab.py``: its 1,000 msg/s librdkafka loop batches records whenever the box is
loaded (a late ack lets the client queue several records into one request), so its CPU per record
and its percentiles change regime with the load. Here a blocking socket sends one Produce v7 of
one 1 KB record (acks=all, not idempotent) to broker 0, the leader of a fresh RF 3 topic
(min.insync.replicas=2), waits for its answer, and sends the next: every request is one full
replication round trip (leader append, both followers' fetch answers, their next fetches, HW,
answer), whatever the load. Figures per side and round: round-trip p50/p99 (ms) and the three
brokers' CPU per request (µs), with B/A per pair. Both clusters (A = ``--base`` src, B = this
checkout's) stay up for the session; the order alternates per pair. ``--version 9`` sends the
flexible Produce v9 librdkafka sends (the shape the produce fast paths take) instead of v7.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(BENCH.parent / "src"))

from benchlib import drivers  # noqa: E402
from benchlib.batch_producer import _recv_frame, produce_request  # noqa: E402
from benchlib.batch_producer import check_response as check_v7  # noqa: E402
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster  # noqa: E402
from benchlib.cluster_workloads import LEADER, _place  # noqa: E402
from exactly.protocol.primitives import write_uvarint  # noqa: E402
from exactly.records.builder import Record, build_batch  # noqa: E402

_CORRELATION_AT = 8


def produce_v9(topic: str, batch: bytes, acks: int, client_id: bytes = b"batch-producer") -> bytearray:
    """A whole Produce v9 request frame (size prefix included) for ``batch`` to partition 0, as
    librdkafka writes it: flexible, no transactional id, empty tag sections; correlation id 0."""
    name = topic.encode()
    body = (
        b"\x00"  # header tags
        + b"\x00"  # transactional id: null
        + struct.pack(">hi", acks, 30_000)
        + bytes([2, len(name) + 1])
        + name
        + bytes([2])
        + struct.pack(">i", 0)
        + write_uvarint(len(batch) + 1)
        + batch
        + b"\x00\x00\x00"  # partition, topic and request tags
    )
    frame = bytearray(struct.pack(">ihhih", 0, 0, 9, 0, len(client_id)) + client_id + body)
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return frame


def check_response_v9(payload: bytes, correlation: int, topic: str) -> int:
    """The error code of a Produce v9 answer to one partition (ValueError on the wrong id)."""
    got = int.from_bytes(payload[0:4], "big")
    if got != correlation:
        raise ValueError(f"correlation id {got}, expected {correlation}")
    at = 4 + 1 + 1 + 1 + len(topic.encode()) + 1 + 4  # header tags, topics, name, partitions, index
    return int.from_bytes(payload[at : at + 2], "big", signed=True)


def one(cluster: Cluster, requests: int, value: bytes, version: int) -> dict[str, float]:
    topic = _place(cluster, "rtt", 3)
    host, port = cluster.brokers[LEADER].bootstrap.rsplit(":", 1)
    batch = build_batch([Record(value)], base_timestamp=int(time.time() * 1000))
    frame = produce_v9(topic, batch, -1) if version == 9 else produce_request(topic, batch, -1)

    def check_response(answer: bytes, correlation: int) -> int:
        if version == 9:
            return check_response_v9(answer, correlation, topic)
        return check_v7(answer, correlation)

    rtts: list[float] = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(50):  # warm-up: connections, the followers' first fetches
            frame[_CORRELATION_AT : _CORRELATION_AT + 4] = i.to_bytes(4, "big")
            sock.sendall(frame)
            check_response(_recv_frame(sock), i)
        cpu0 = cluster.broker_cpu()
        start = time.perf_counter()
        for i in range(50, 50 + requests):
            frame[_CORRELATION_AT : _CORRELATION_AT + 4] = i.to_bytes(4, "big")
            t0 = time.perf_counter_ns()
            sock.sendall(frame)
            code = check_response(_recv_frame(sock), i)
            rtts.append((time.perf_counter_ns() - t0) / 1e6)
            if code:
                raise RuntimeError(f"produce error {code}")
        wall = time.perf_counter() - start
        cpu1 = cluster.broker_cpu()
    cluster.delete_topic(topic)
    rtts.sort()
    cpu = sum(cpu1[b] - cpu0.get(b, 0.0) for b in cpu1)
    return {
        "load1": os.getloadavg()[0],
        "rtt_p50_ms": rtts[len(rtts) // 2],
        "rtt_p99_ms": rtts[int(len(rtts) * 0.99)],
        "cpu_us_per_request": cpu / requests * 1e6,
        "leader_cpu_us_per_request": (cpu1[LEADER] - cpu0.get(LEADER, 0.0)) / requests * 1e6,
        "requests_per_s": requests / wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--version", type=int, choices=(7, 9), default=7, help="the Produce version sent")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="exactly-bench-rtt-ab-"))
    sides = {"A": args.base.resolve(), "B": BENCH.parent / "src"}
    clusters: dict[str, Cluster] = {}
    rows: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    value = drivers.payload_pool()[0][:1024]
    try:
        for side, src in sides.items():
            clusters[side] = Cluster(scratch / side, 3, DEFAULT_SESSION_TIMEOUT_MS, {}, src=src).start()
            print(f"-- {side}: {src}", flush=True)
        for rep in range(args.pairs):
            for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                row = one(clusters[side], args.requests, value, args.version)
                rows[side].append(row)
                print(f"{rep} {side} " + " ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n| figure | A ({args.base}) | B (this checkout) | B/A per pair (median, min-max) | B better |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for fig in rows["A"][0]:
        a = [r[fig] for r in rows["A"]]
        b = [r[fig] for r in rows["B"]]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]
        higher_better = fig == "requests_per_s"
        better = sum((r > 1) if higher_better else (r < 1) for r in ratios)
        print(
            f"| {fig} | {statistics.median(a):.3f} ({min(a):.3f}-{max(a):.3f}) | {statistics.median(b):.3f}"
            f" ({min(b):.3f}-{max(b):.3f}) | {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            f" | {'-' if fig == 'load1' else f'{better}/{len(ratios)}'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
