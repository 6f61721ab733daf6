"""Diagnostic for issue #11's rare ~500 ms busy-window stall: ``cleaner-produce-latency``'s
windows (worker resumed / stopped, ABBA) in a long series on one broker, with the broker's
event-loop lag monitor (``benchlib/looplag_site``: late loop turns, faulthandler stack dumps of
a stalled loop, slow GC runs) on the client's clock, so that each client-side stall (a run of
acks >= ``--stall-ms``) is matched with what the broker's loop did meanwhile.

Ad-hoc tool, not part of ``run.py``::

    PYTHONPATH=src:bench .venv/bin/python bench/cleaner_loop_stall.py --windows 24 --seconds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from benchlib import drivers, kafka
from benchlib.compaction_latency import worker_pid
from benchlib.compaction_workloads import backlog_broker, passes_of, scrape, warm_coordinator
from benchlib.workloads import Context, warm_up_producer

SITE = Path(__file__).resolve().parent / "benchlib" / "looplag_site"
LAG = re.compile(r"^lag (?P<ts>[\d.]+) ms (?P<ms>[\d.]+)")
GC = re.compile(r"^gc (?P<ts>[\d.]+) gen (?P<gen>\d) took_ms (?P<ms>[\d.]+)")


def stall_runs(acks: list[tuple[int, int]], stall_ms: float) -> list[tuple[float, float, float]]:
    """(first slow send s, last ack s, max ack ms) per run of consecutive acks >= stall_ms."""
    runs: list[tuple[float, float, float]] = []
    cur: list[float] | None = None
    for s, a in acks:
        ms = (a - s) / 1e6
        if ms >= stall_ms:
            if cur is None:
                cur = [s / 1e9, a / 1e9, ms]
            else:
                cur[1], cur[2] = max(cur[1], a / 1e9), max(cur[2], ms)
        elif cur is not None:
            runs.append((cur[0], cur[1], cur[2]))
            cur = None
    if cur is not None:
        runs.append((cur[0], cur[1], cur[2]))
    return runs


def window(
    bootstrap: str,
    topic: str,
    seconds: float,
    rate: int,
    pad: bytes,
    stats: list[tuple[float, dict[str, Any]]],
    *,
    warm_up: bool = True,
) -> list[tuple[int, int]]:
    """``cleaner_stall_trace.window`` (``fixed_rate_latency``'s loop) with librdkafka's statistics
    every 100 ms appended to ``stats`` as (client time s, the broker's entry): its round-trip
    times (request sent -> response read, what the broker and the network took), internal queue
    latency (produce() -> request sent: the client), retries, timeouts and errors. ``warm_up``:
    ``fixed_rate_latency``'s warm-up record first (without it, the client's ~500 ms wait for a
    producer id shows up now and then at a window's start)."""
    acks: list[tuple[int, int]] = []
    stop = threading.Event()

    def consume() -> None:
        c = kafka.consumer(bootstrap)
        try:
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            while not stop.is_set():
                c.poll(0.05)
        finally:
            c.close()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acks.append((struct.unpack_from(">Q", msg.value())[0], time.perf_counter_ns()))

    def on_stats(text: str) -> None:
        for b in json.loads(text).get("brokers", {}).values():
            if b.get("nodeid", -1) >= 0:
                keep = (
                    "rtt",
                    "int_latency",
                    "outbuf_latency",
                    "txretries",
                    "req_timeouts",
                    "txerrs",
                    "rxerrs",
                    "waitresp_cnt",
                    "outbuf_cnt",
                    "tx",
                    "rx",
                )
                stats.append((time.perf_counter(), {k: b.get(k) for k in keep}))

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            **drivers.PRODUCE_CONF,
            "linger.ms": 0,
            **kafka.QUIET,
            "statistics.interval.ms": 100,
            "stats_cb": on_stats,
        }
    )
    p.list_topics(topic, timeout=30)
    if warm_up:
        warm_up_producer(p, topic, pad)
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(0.5)
    total, interval = int(rate * seconds), 1.0 / rate
    start = time.perf_counter()
    for i in range(total):
        due = start + i * interval
        while (left := due - time.perf_counter()) > 0:
            p.poll(min(left, 0.001))
        p.produce(topic, struct.pack(">Q", time.perf_counter_ns()) + pad, on_delivery=on_delivery)
        p.poll(0)
    p.flush(30)
    stop.set()
    reader.join(10)
    return acks


def loop_events(stem: str) -> list[tuple[float, str]]:
    """(ts s, line) of every lag and gc line of the broker's monitor files."""
    out: list[tuple[float, str]] = []
    for path in Path(stem).parent.glob(Path(stem).name + "-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            m = LAG.match(line) or GC.match(line)
            if m:
                out.append((float(m["ts"]), line))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=24, help="windows, ABBA from idle")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--backlog-mb", type=float, default=0.0, help="default: 8 MB per busy second")
    ap.add_argument("--stall-ms", type=float, default=50.0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "cleaner-loop-stall")
    ap.add_argument("--broker-opt", action="append", default=[])
    ap.add_argument("--no-warm-up", action="store_true", help="the producer as before 2026-11-25 (s20)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = str(args.out / f"looplag-{uuid.uuid4().hex[:6]}")
    os.environ["EXACTLY_LOOPLAG"] = stem
    os.environ["PYTHONPATH"] = f"{SITE}:{os.environ.get('PYTHONPATH', '')}"
    ctx = Context(
        quick=False,
        records=0,
        repeat=1,
        scratch=args.out,
        kcat_env={},
        latency_seconds=args.seconds,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=args.broker_opt,
        pool=drivers.payload_pool(1024),
    )
    busy_windows = args.windows // 2
    backlog = args.backlog_mb or 8.0 * busy_windows * args.seconds
    work = args.out / f"work-{uuid.uuid4().hex[:6]}"
    b, _, _ = backlog_broker(ctx, work, int(backlog * 1e6), 100)
    del os.environ["EXACTLY_LOOPLAG"]  # the clients' processes need no monitor
    result: dict[str, Any] = {"windows": [], "stem": stem}
    try:
        pid = worker_pid(b)
        os.kill(pid, signal.SIGSTOP)
        names = ["idle", "busy", "busy", "idle"]
        seq = [names[i % 4] for i in range(args.windows)]
        topics = [f"stall-{i}-{uuid.uuid4().hex[:6]}" for i in range(len(seq))]
        for t in topics:
            kafka.create_topic(b.bootstrap, t, 1)
        warm_coordinator(b.bootstrap, topics[0])
        pad = ctx.pool[0][8:]
        for i, (name, topic) in enumerate(zip(seq, topics, strict=True)):
            if name == "busy":
                os.kill(pid, signal.SIGCONT)
            t0 = time.perf_counter_ns()
            stats: list[tuple[float, dict[str, Any]]] = []
            acks = window(b.bootstrap, topic, args.seconds, 1000, pad, stats, warm_up=not args.no_warm_up)
            t1 = time.perf_counter_ns()
            if name == "busy":
                os.kill(pid, signal.SIGSTOP)
            lat = sorted((a - s) / 1e6 for s, a in acks)
            p99 = lat[int(0.99 * (len(lat) - 1))] if lat else None
            runs = stall_runs(acks, args.stall_ms)
            passes = passes_of(scrape(b))
            print(
                f"window {i} {name}: p99 {p99:.2f} ms max {lat[-1]:.1f} ms stalls>={args.stall_ms:.0f}ms "
                f"{[(round(s, 3), round(m, 1)) for s, _, m in runs]} passes {passes:.0f} "
                f"load {os.getloadavg()[0]:.2f}",
                file=sys.stderr,
                flush=True,
            )
            result["windows"].append(
                {
                    "name": name,
                    "t0": t0 / 1e9,
                    "t1": t1 / 1e9,
                    "p99": p99,
                    "max": lat[-1],
                    "runs": runs,
                    "passes": passes,
                    "stats": stats,
                }
            )
    finally:
        b.stop()
        with contextlib.suppress(OSError):
            shutil.copy(b.log_path, args.out / "broker.log")
        shutil.rmtree(work, ignore_errors=True)
    events = loop_events(stem)
    result["loop_events"] = events
    (args.out / "result.json").write_text(json.dumps(result))
    for w in result["windows"]:
        for s, e, m in w["runs"]:
            near = [line for ts, line in events if s - 0.2 <= ts <= e + 0.2]
            print(f"stall {w['name']} {s:.3f}-{e:.3f} max {m:.1f} ms; loop: {near or 'nothing late'}")
            if m >= 200:
                for ts, st in w["stats"]:
                    if s - 0.3 <= ts <= e + 1.5:
                        rtt, il = st["rtt"] or {}, st["int_latency"] or {}
                        print(
                            f"   client stats {ts:.3f}: rtt max {rtt.get('max', 0) / 1000:.1f} ms "
                            f"p99 {rtt.get('p99', 0) / 1000:.1f}; int_latency max {il.get('max', 0) / 1000:.1f} ms; "
                            f"retries {st['txretries']} timeouts {st['req_timeouts']} txerrs {st['txerrs']} "
                            f"rxerrs {st['rxerrs']} waitresp {st['waitresp_cnt']} outbuf {st['outbuf_cnt']} tx {st['tx']} rx {st['rx']}"
                        )
    print(f"loop events total {len(events)}; files {stem}-*.log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
