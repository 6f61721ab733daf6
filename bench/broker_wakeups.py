#!/usr/bin/env python3
"""Event-loop wake-ups per broker process of an RF 3 cluster, idle and at 1,000 msg/s (rf3hop-s21).

    PYTHONPATH=src .venv/bin/python bench/broker_wakeups.py [--src SRC] [--seconds 10]

Why: on a 2-core box every wake-up of a broker process that is not the message path competes
for the core an ack's next hop waits for. Two phases, ``--seconds`` each: (1) idle (an RF 3
topic led by broker 0, nothing produced: every wake-up is a timer, a follower Fetch's max-wait
expiry or ZooKeeper), (2) at ``--rate`` one-record acks=all Produce v9 a second from a paced
raw-socket client. In both, ``perf stat`` on the epoll_pwait tracepoint counts the event
loop's blocking waits (timeout != 0: each ends in a wake-up) and all its epoll_pwait calls,
per broker (kernel counters: the brokers run at their own speed). Idle only (strace stops the
traced process at each system call: a busy broker would never sleep), ``strace -f`` of
epoll_pwait gives the blocking waits that came back with no event (nothing but a timer woke
the process) by the timeout the loop had asked for (ms: the next timer's distance).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(BENCH.parent / "src"))

from benchlib.batch_producer import _recv_frame  # noqa: E402
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster  # noqa: E402
from benchlib.cluster_workloads import LEADER, _place  # noqa: E402
from cluster_rtt_ab import produce_v9  # noqa: E402
from exactly.records.builder import Record, build_batch  # noqa: E402

# the event loop's own wait (uvloop: epoll_pwait(fd, events, 1024, timeout, NULL, 8)), also
# when strace split it into "<unfinished ...>" and "<... epoll_pwait resumed>"
_LINE = re.compile(r"(?:\]|\[\]), 1024, (-?\d+), NULL, 8\)\s+= (\d+)")


def _trace(pids: list[int], seconds: float, out: Path) -> list[Path]:
    procs, files = [], []
    for pid in pids:
        f = out.with_name(f"{out.name}-{pid}.strace")
        files.append(f)
        procs.append(
            subprocess.Popen(
                ["strace", "-f", "-qq", "-e", "trace=epoll_wait,epoll_pwait", "-o", str(f), "-p", str(pid)],
                stderr=subprocess.DEVNULL,
            )
        )
    time.sleep(seconds)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    return files


def _perf_counts(pids: list[int], seconds: float) -> list[tuple[float, float]]:
    """Per pid: the loop's blocking waits (epoll_pwait with a timeout != 0) and all its
    epoll_pwait calls, per second, counted by the kernel's tracepoints (``perf stat``: no
    stop per system call, unlike strace, so the brokers run at their own speed)."""
    procs = [
        subprocess.Popen(
            [
                "perf", "stat", "-x", ",", "-e", "syscalls:sys_enter_epoll_pwait", "--filter", "timeout != 0",
                "-e", "syscalls:sys_enter_epoll_pwait", "-p", str(pid), "--", "sleep", str(seconds),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for pid in pids
    ]  # fmt: skip
    out = []
    for p in procs:
        _, err = p.communicate()
        counts = [float(line.split(",")[0]) for line in err.splitlines() if "epoll_pwait" in line]
        out.append((counts[0] / seconds, counts[1] / seconds) if len(counts) == 2 else (-1.0, -1.0))
    return out


def _summary(path: Path, seconds: float) -> str:
    """Blocking waits (timeout != 0: the loop had nothing ready) per second, those that came
    back with no event (a timer was due: nothing but a timer woke the process), and the
    timeouts asked for, bucketed in ms."""
    blocking = timer_only = 0
    timeouts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        t, n = int(m.group(1)), int(m.group(2))
        if t == 0:
            continue  # a poll with callbacks ready: not a wake-up
        blocking += 1
        if n == 0:
            timer_only += 1
            bucket = (
                "inf"
                if t < 0
                else "<=10"
                if t <= 10
                else "<=99"
                if t < 100
                else "100"
                if t == 100
                else ">100"
            )
            timeouts[bucket] += 1
    hist = " ".join(f"{k}:{v / seconds:.1f}" for k, v in sorted(timeouts.items()))
    return f"wakeups/s={blocking / seconds:.1f} timer_only/s={timer_only / seconds:.1f} timer_only_by_timeout_ms[{hist}]"


def _produce(cluster: Cluster, topic: str, rate: int, stop: threading.Event, done: list[int]) -> None:
    host, port = cluster.brokers[LEADER].bootstrap.rsplit(":", 1)
    batch = build_batch([Record(b"x" * 1024)], base_timestamp=int(time.time() * 1000))
    frame = produce_v9(topic, batch, -1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent = [0]

    def reader() -> None:
        while True:
            try:
                _recv_frame(sock)
            except OSError:
                return

    threading.Thread(target=reader, daemon=True).start()
    start = time.perf_counter()
    while not stop.is_set():
        sock.sendall(frame)
        sent[0] += 1
        delay = start + sent[0] / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    sock.close()
    done.append(sent[0])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, default=BENCH.parent / "src")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=1000)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="exactly-bench-wakeups-"))
    cluster = Cluster(scratch / "c", 3, DEFAULT_SESSION_TIMEOUT_MS, {}, src=args.src.resolve()).start()
    try:
        topic = _place(cluster, "wake", 3)
        time.sleep(5)
        pids = [b.pid for b in cluster.brokers if b.pid is not None]
        for label in ("idle", f"{args.rate}/s"):
            stop = threading.Event()
            t = None
            if label != "idle":
                sent: list[int] = []
                t = threading.Thread(
                    target=_produce, args=(cluster, topic, args.rate, stop, sent), daemon=True
                )
                started = time.perf_counter()
                t.start()
                time.sleep(2)
            counted = _perf_counts(pids, args.seconds)
            files = _trace(pids, args.seconds, scratch / label.replace("/", "_")) if label == "idle" else []
            stop.set()
            if t is not None:
                t.join()
                print(f"{label}: {sent[0] / (time.perf_counter() - started):.0f} Produce/s sent", flush=True)
            for i, (blocking, calls) in enumerate(counted):
                print(
                    f"{label} broker-{i} perf: blocking_waits/s={blocking:.1f} epoll_calls/s={calls:.1f}",
                    flush=True,
                )
            for i, f in enumerate(files):
                print(f"{label} broker-{i} strace: {_summary(f, args.seconds)}", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
