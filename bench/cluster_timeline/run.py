#!/usr/bin/env python3
"""Run one traced 1,000 msg/s acks=all RF 3 workload on an instrumented copy of src.

    python bench/cluster_timeline/instrument.py /tmp/traced
    PYTHONPATH=src python bench/cluster_timeline/run.py /tmp/traced/src OUT [SECONDS] [PRODUCER_CONF_JSON]
    python bench/cluster_timeline/analyze.py OUT

ZooKeeper + 3 brokers (``benchlib.cluster``, broker 0 leads), an RF 3 topic (min.insync.replicas
2), an idempotent producer (linger.ms 0, acks all) at 1,000 records/s with a consumer reading
along, as ``cluster-latency-1k`` does. Writes OUT/client.json (each record's offset, send and
delivery time on CLOCK_MONOTONIC) next to the brokers' trace-<pid>.txt; prints the client's
percentiles and each broker's CPU microseconds per record. ``WIRE=1``: the client is a raw
open-loop Produce sender instead (no librdkafka, no consumer; ``_wire_loop``). ``S14_PROF=1`` also runs the brokers
under ``benchlib/cprofile_site`` (CPU-time cProfile between the two signals).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sched_trace  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition  # noqa: E402

from benchlib import drivers, kafka  # noqa: E402
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster  # noqa: E402
from benchlib.cluster_workloads import _place  # noqa: E402
from benchlib.workloads import LATENCY_POLL_MIN_S  # noqa: E402


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main() -> None:
    src, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 8.0
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    out.mkdir(parents=True, exist_ok=True)
    os.environ["EXACTLY_TRACE"] = str(out)
    profile = bool(os.environ.get("S14_PROF"))
    if profile:
        os.environ["EXACTLY_CPROFILE"] = str(out / "prof")
        os.environ["PYTHONPATH"] = str(BENCH / "benchlib" / "cprofile_site")
    scratch = Path(tempfile.mkdtemp(prefix="cluster-timeline-"))
    cluster = Cluster(scratch / "c", 3, DEFAULT_SESSION_TIMEOUT_MS, {}, src=src).start()
    try:
        pids = {i: b.pid for i, b in enumerate(cluster.brokers) if b.pid is not None}
        topic = _place(cluster, "timeline", 3)
        stop = threading.Event()

        def consume() -> None:
            consumer = kafka.consumer(cluster.bootstrap)
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            while not stop.is_set():
                consumer.poll(0.05)
            consumer.close()

        wire = bool(os.environ.get("WIRE"))
        reader = threading.Thread(target=consume, daemon=True)
        if not wire:
            reader.start()
        acks: dict[int, tuple[int, int]] = {}
        to_mono = time.monotonic_ns() - time.perf_counter_ns()

        def on_delivery(err: Any, msg: Any) -> None:
            now = time.perf_counter_ns()
            if err is None:
                sent = struct.unpack_from(">Q", msg.value())[0]
                acks[msg.offset()] = (sent + to_mono, now + to_mono)

        if wire:
            _wire_loop(cluster, topic, seconds, acks, pids, out)
            return
        conf = {"bootstrap.servers": cluster.bootstrap, **drivers.PRODUCE_CONF, "linger.ms": 0}
        producer = Producer({**conf, **kafka.QUIET, **extra})
        producer.list_topics(topic, timeout=30)
        time.sleep(1.0)
        pad = b"x" * 1016
        total = int(1000 * seconds)
        if profile:
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR1)
        cpu0 = {b: cpu_ticks(pid) for b, pid in pids.items()}
        tracer = sched_trace.start() if os.environ.get("SCHED_TRACE") else None
        start = time.perf_counter()
        for i in range(total):
            due = start + i / 1000
            while (left := due - time.perf_counter()) > 0:
                producer.poll(max(min(left, 0.001), LATENCY_POLL_MIN_S))
            producer.produce(topic, struct.pack(">Q", time.perf_counter_ns()) + pad, on_delivery=on_delivery)
            producer.poll(0)
        producer.flush(30)
        if tracer is not None:
            zk = cluster.zookeeper_pid() if hasattr(cluster, "zookeeper_pid") else None
            sched_trace.stop(
                tracer, out, {"client": os.getpid(), **{str(b): p for b, p in pids.items()}, "zk": zk}
            )
        cpu1 = {b: cpu_ticks(pid) for b, pid in pids.items()}
        print("broker CPU us per record", {b: (cpu1[b] - cpu0[b]) * 1e4 / total for b in pids})
        if profile:
            for pid in pids.values():
                os.kill(pid, signal.SIGUSR2)
            time.sleep(1)
        stop.set()
        reader.join(5)
        lat = sorted((b - a) / 1e6 for a, b in acks.values())
        n = len(lat)
        print(
            f"acks {n}: p50 {lat[n // 2]:.2f} p99 {lat[int(n * 0.99)]:.2f} p99.9 {lat[int(n * 0.999)]:.2f} "
            f"max {lat[-1]:.2f} ms; load {os.getloadavg()}"
        )
        (out / "client.json").write_text(
            json.dumps({"pids": pids, "acks": {str(k): v for k, v in acks.items()}})
        )
    finally:
        cluster.stop()


def _wire_loop(
    cluster: Cluster,
    topic: str,
    seconds: float,
    acks: dict[int, tuple[int, int]],
    pids: dict[int, int],
    out: Path,
) -> None:
    """``WIRE=1``: the client is a raw Produce v9 (one 1 KB record, acks=all) every 1 ms from a
    sleeping sender thread, answers read by another (``bench/rf3_openloop.py``'s ``wire``): no
    librdkafka, no consumer, the client's own legs as short as ``cluster_rtt_ab.py``'s."""
    import socket

    from benchlib.batch_producer import _recv_frame
    from cluster_rtt_ab import produce_v9
    from exactly.records.builder import Record, build_batch

    host, port = cluster.brokers[0].bootstrap.rsplit(":", 1)
    frame = produce_v9(topic, build_batch([Record(b"x" * 1024)], base_timestamp=int(time.time() * 1000)), -1)
    total = int(1000 * seconds)
    sent = [0] * total
    name = len(topic.encode())
    at = 4 + 1 + 1 + 1 + name + 1 + 4  # the error code (check_response_v9), then the base offset
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(frame)
        _recv_frame(sock)

        def read() -> None:
            for _ in range(total):
                answer = _recv_frame(sock)
                t = time.monotonic_ns()
                i = int.from_bytes(answer[:4], "big")
                assert int.from_bytes(answer[at : at + 2], "big") == 0
                acks[int.from_bytes(answer[at + 2 : at + 10], "big")] = (sent[i], t)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        tracer = sched_trace.start() if os.environ.get("SCHED_TRACE") else None
        start = time.perf_counter()
        for i in range(total):
            left = start + i / 1000 - time.perf_counter()
            if left > 0:
                time.sleep(left)
            frame[8:12] = i.to_bytes(4, "big")
            sent[i] = time.monotonic_ns()
            sock.sendall(frame)
        reader.join(30)
    if tracer is not None:
        sched_trace.stop(tracer, out, {"client": os.getpid(), **{str(b): p for b, p in pids.items()}})
    lat = sorted((b - a) / 1e6 for a, b in acks.values())
    n = len(lat)
    print(f"wire acks {n}: p50 {lat[n // 2]:.2f} p99 {lat[int(n * 0.99)]:.2f} ms; load {os.getloadavg()}")
    (out / "client.json").write_text(json.dumps({"pids": pids, "acks": {str(k): v for k, v in acks.items()}}))


if __name__ == "__main__":
    main()
