#!/usr/bin/env python3
"""Event-loop wake-ups per broker process of an RF 3 cluster, idle and at 1,000 msg/s (rf3hop-s21).

    PYTHONPATH=src .venv/bin/python bench/broker_wakeups.py [--src SRC] [--seconds 10]

Why: on a 2-core box every wake-up of a broker process that is not the message path competes
for the core an ack's next hop waits for. ``strace -f -e trace=epoll_wait,epoll_pwait`` is
attached to each broker for ``--seconds``: (1) idle (an RF 3 topic led by broker 0, nothing
produced: every wake-up is a timer, a follower Fetch's max-wait expiry, or ZooKeeper), (2) at
1,000 one-record acks=all Produce v9 a second from a paced raw-socket client. Printed per
broker: wake-ups (epoll_wait returns) per second, how many returned with no event (a timer
fired: its handle ran), and the histogram of the timeouts the loop asked for (the next timer).
"""

from __future__ import annotations

import argparse
import collections
import re
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

_LINE = re.compile(r"epoll_p?wait\(\d+, .*?, (-?\d+)(?:, .*?)?\)\s+= (\d+)")


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


def _summary(path: Path, seconds: float) -> str:
    wakes = empty = 0
    timeouts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        wakes += 1
        t, n = int(m.group(1)), int(m.group(2))
        if n == 0:
            empty += 1
        bucket = (
            "inf"
            if t < 0
            else "0"
            if t == 0
            else "<=10"
            if t <= 10
            else "<=100"
            if t <= 100
            else "<=1000"
            if t <= 1000
            else ">1000"
        )
        timeouts[bucket] += 1
    hist = " ".join(f"{k}:{v / seconds:.1f}" for k, v in sorted(timeouts.items()))
    return f"wakeups/s={wakes / seconds:.1f} timer_only/s={empty / seconds:.1f} timeouts/s[{hist}]"


def _produce(cluster: Cluster, topic: str, rate: int, stop: threading.Event) -> int:
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
    return sent[0]


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
                t = threading.Thread(target=_produce, args=(cluster, topic, args.rate, stop), daemon=True)
                t.start()
                time.sleep(2)
            files = _trace(pids, args.seconds, scratch / label.replace("/", "_"))
            stop.set()
            if t is not None:
                t.join()
            for i, f in enumerate(files):
                print(f"{label} broker-{i}: {_summary(f, args.seconds)}", flush=True)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
