#!/usr/bin/env python3
"""The RF 3 acks=all ack latency at 1,000 msg/s, open loop, by client variant, on one cluster.

    PYTHONPATH=src .venv/bin/python bench/rf3_openloop.py [--src SRC] [--seconds 10] [--rounds 2] \
        [--variants ck,ck-noc,wire,wire-spin]

Why: ``cluster-latency-1k`` (confluent-kafka, 1,000 msg/s, a consumer reading along, the producing
loop spinning in ``poll(0)``) reads an ack p99 ~15x the closed-loop round trip of
``cluster_rtt_ab.py`` (one raw Produce in flight). This runs the open loop with the client
swapped piece by piece against one cluster (RF 3 topic led by broker 0, min.insync.replicas 2),
variants alternating per round, and prints per variant: ack p50/p99/p99.9 and each broker's and
the client process's CPU per record, so what the open loop adds can be told from what the
brokers do.

- ``ck``: ``cluster-latency-1k``'s loop (confluent-kafka, linger.ms 0, idempotent, a consumer
  thread reading along, the loop spinning ``poll(0)`` until each record is due);
- ``ck-noc``: the same without the consumer;
- ``ck-block``: ``ck`` with ``poll`` blocking at least 1 ms (the loop sleeps in librdkafka);
- ``ck-idle``: ``ck`` with the producing loop's thread at SCHED_IDLE while it runs (it spins as
  before, but any woken broker thread preempts it at once);
- ``wire``: one raw Produce v9 (one 1 KB record, acks=all) every 1 ms from a sleeping sender
  thread, answers read by another thread (any number in flight): no librdkafka, no consumer;
- ``closed``: ``cluster_rtt_ab.py``'s closed loop (one raw Produce in flight), as many requests as
  the open loops send (its CPU per record is the same work without the open loop's idle gaps);
- ``wire@R``: ``wire`` at R records/s (the open loop's tail against the offered load);
- ``wire-c``: ``wire`` with a consumer thread reading along (as ``ck``);
- ``wire-spin``: ``wire`` plus a process spinning on a core for the whole window (what ``ck``'s
  producing loop does to the box; its CPU is not in the client column).

``+short`` after any variant: the brokers' threads ask for a 0.1 ms scheduler slice during it
(sched_setattr's sched_runtime; the default is 0.7 ms x (1 + log2 cpus)), so that a woken broker
preempts a CPU-bound task at once instead of waiting for its slice to run out.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(BENCH.parent / "src"))

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition  # noqa: E402

from benchlib import drivers, kafka  # noqa: E402
from benchlib.batch_producer import _recv_frame  # noqa: E402
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster  # noqa: E402
from benchlib.cluster_workloads import LEADER, _place  # noqa: E402
from cluster_rtt_ab import check_response_v9, produce_v9  # noqa: E402
from exactly.records.builder import Record, build_batch  # noqa: E402

_CORRELATION_AT = 8


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _spin_process() -> subprocess.Popen[bytes]:
    """A process spinning on a core (a thread would hold this process's GIL)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_ck(
    cluster: Cluster, topic: str, seconds: float, consumer: bool, poll_min: float, idle: bool = False
) -> list[float]:
    total = int(1000 * seconds)
    ack: list[float] = []
    stop = threading.Event()
    now_ns = time.perf_counter_ns

    def consume() -> None:
        c = kafka.consumer(cluster.bootstrap)
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while not stop.is_set():
            c.poll(0.05)
        c.close()

    def on_delivery(err: Any, msg: Any) -> None:
        t = now_ns()
        if err is None:
            ack.append((t - struct.unpack_from(">Q", msg.value())[0]) / 1e6)

    p = Producer(
        {"bootstrap.servers": cluster.bootstrap, **drivers.PRODUCE_CONF, "linger.ms": 0, **kafka.QUIET}
    )
    p.list_topics(topic, timeout=30)
    reader = threading.Thread(target=consume, daemon=True)
    if consumer:
        reader.start()
        time.sleep(1.0)
    pad = drivers.payload_pool()[0][8:1024]
    for _ in range(200):  # warm-up
        p.produce(topic, struct.pack(">Q", now_ns()) + pad)
        p.poll(0.001)
    p.flush(10)
    ack.clear()
    tid = threading.get_native_id()
    if idle:  # the spinning loop only takes a core nobody else wants
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    start = time.perf_counter()
    for i in range(total):
        due = start + i * 0.001
        while True:
            left = due - time.perf_counter()
            if left <= 0:
                break
            p.poll(max(min(left, 0.001), poll_min))
        p.produce(topic, struct.pack(">Q", now_ns()) + pad, on_delivery=on_delivery)
        p.poll(0)
    p.flush(30)
    if idle:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    stop.set()
    if consumer:
        reader.join(10)
    return ack


def _consume(bootstrap: str, topic: str, stop: threading.Event) -> None:
    c = kafka.consumer(bootstrap)
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    while not stop.is_set():
        c.poll(0.05)
    c.close()


def run_closed(cluster: Cluster, topic: str, seconds: float) -> list[float]:
    """One raw Produce in flight at a time for 1,000 x ``seconds`` requests (cluster_rtt_ab's loop)."""
    total = int(1000 * seconds)
    host, port = cluster.brokers[LEADER].bootstrap.rsplit(":", 1)
    value = drivers.payload_pool()[0][:1024]
    batch = build_batch([Record(value)], base_timestamp=int(time.time() * 1000))
    frame = produce_v9(topic, batch, -1)
    rtts: list[float] = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(200 + total):
            frame[_CORRELATION_AT : _CORRELATION_AT + 4] = i.to_bytes(4, "big")
            t0 = time.perf_counter_ns()
            sock.sendall(frame)
            if check_response_v9(_recv_frame(sock), i, topic):
                raise RuntimeError("produce error")
            if i >= 200:
                rtts.append((time.perf_counter_ns() - t0) / 1e6)
    return rtts


def run_wire(
    cluster: Cluster, topic: str, seconds: float, spin: bool, consumer: bool, rate: int = 1000
) -> list[float]:
    total = int(rate * seconds)
    host, port = cluster.brokers[LEADER].bootstrap.rsplit(":", 1)
    value = drivers.payload_pool()[0][:1024]
    batch = build_batch([Record(value)], base_timestamp=int(time.time() * 1000))
    frame = produce_v9(topic, batch, -1)
    sent = [0] * total
    acked = [0] * total
    stop = threading.Event()
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(200):  # warm-up, closed loop
            frame[_CORRELATION_AT : _CORRELATION_AT + 4] = (1 << 30 | i).to_bytes(4, "big")
            sock.sendall(frame)
            check_response_v9(_recv_frame(sock), 1 << 30 | i, topic)

        def read() -> None:
            for _ in range(total):
                answer = _recv_frame(sock)
                t = time.perf_counter_ns()
                i = int.from_bytes(answer[:4], "big")
                if check_response_v9(answer, i, topic):
                    raise RuntimeError("produce error")
                acked[i] = t

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if consumer:
            threading.Thread(target=_consume, args=(cluster.bootstrap, topic, stop), daemon=True).start()
            time.sleep(1.0)
        spinner = _spin_process() if spin else None
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            left = due - time.perf_counter()
            if left > 0:
                time.sleep(left)
            frame[_CORRELATION_AT : _CORRELATION_AT + 4] = i.to_bytes(4, "big")
            sent[i] = time.perf_counter_ns()
            sock.sendall(frame)
        reader.join(30)
        stop.set()
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return [(a - s) / 1e6 for s, a in zip(sent, acked, strict=True) if a]


_SYS_SCHED_SETATTR = 314  # x86_64


def set_slice(pid: int, ns: int) -> int:
    """Every thread of ``pid`` asks the scheduler for a ``ns`` slice (0: the default): EEVDF lets a
    woken task with a shorter slice preempt the one running (PREEMPT_SHORT, Linux 6.12+); returns
    how many threads took it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    done = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        tid = int(task)
        attr = struct.pack("=IIQiIQQQ", 48, 0, 0, os.getpriority(os.PRIO_PROCESS, tid), 0, ns, 0, 0)
        if libc.syscall(_SYS_SCHED_SETATTR, tid, ctypes.create_string_buffer(attr), 0) == 0:
            done += 1
    return done


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=BENCH.parent / "src")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="ck,ck-noc,wire,wire-spin")
    args = ap.parse_args()
    variants = args.variants.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="exactly-rf3-openloop-"))
    cluster = Cluster(scratch / "c", 3, DEFAULT_SESSION_TIMEOUT_MS, {}, src=args.src.resolve()).start()
    print(f"-- src {args.src}", flush=True)
    try:
        for rnd in range(args.rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                topic = _place(cluster, "openloop", 3)
                short = v.endswith("+short")
                if short:
                    for b in cluster.brokers:
                        assert b.pid is not None
                        set_slice(b.pid, 100_000)
                cpu0, self0, load0 = cluster.broker_cpu(), _self_cpu(), os.getloadavg()[0]
                v = v.removesuffix("+short")
                if v == "ck":
                    acks = run_ck(cluster, topic, args.seconds, True, 0.0)
                elif v == "ck-noc":
                    acks = run_ck(cluster, topic, args.seconds, False, 0.0)
                elif v == "ck-idle":
                    acks = run_ck(cluster, topic, args.seconds, True, 0.0, idle=True)
                elif v == "ck-block":
                    acks = run_ck(cluster, topic, args.seconds, True, 0.001)
                elif v == "wire":
                    acks = run_wire(cluster, topic, args.seconds, False, False)
                elif v == "closed":
                    acks = run_closed(cluster, topic, args.seconds)
                elif v.startswith("wire@"):
                    acks = run_wire(cluster, topic, args.seconds, False, False, int(v[5:]))
                elif v == "wire-c":
                    acks = run_wire(cluster, topic, args.seconds, False, True)
                elif v == "wire-spin":
                    acks = run_wire(cluster, topic, args.seconds, True, False)
                else:
                    raise SystemExit(f"unknown variant {v}")
                cpu1, self1 = cluster.broker_cpu(), _self_cpu()
                if short:
                    v += "+short"
                    for b in cluster.brokers:
                        assert b.pid is not None
                        set_slice(b.pid, 0)
                n = max(1, len(acks))
                per = {b: (cpu1[b] - cpu0.get(b, 0.0)) / n * 1e6 for b in cpu1}
                print(
                    f"{rnd} {v:9s} load={load0:.2f} n={len(acks)} p50={pct(acks, 0.5):.2f} "
                    f"p90={pct(acks, 0.9):.2f} p99={pct(acks, 0.99):.2f} p999={pct(acks, 0.999):.2f} ms "
                    f"cpu_us/rec "
                    + " ".join(f"b{b}={u:.0f}" for b, u in sorted(per.items()))
                    + f" client={(self1 - self0) / n * 1e6:.0f}",
                    flush=True,
                )
                cluster.delete_topic(topic)
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
