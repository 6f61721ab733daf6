"""Diagnostic for issue #11's busy-window stalls: what every thread on the box did while a slow
produce ack was outstanding, with the cleaner's worker running (busy) or stopped (idle).

Builds ``cleaner-produce-latency``'s broker (a compacted 100 B backlog, the cleaner in its first
pass), runs ``latency-1k``'s loop in alternating windows (worker resumed / stopped, as the bench
does) and records, with the kernel's tracer (tracefs, ``trace_clock=mono`` so its timestamps are
``time.perf_counter_ns()``'s), the scheduler's switches and wake-ups of every task, the broker
main thread's system calls, and the file system's journal commits and fsyncs. Each ack is kept as
(send, ack) on the same clock. For every ack slower than ``--slow-ms`` it prints where the
broker's event loop thread, the client's threads and the worker spent that interval: on a CPU,
runnable but waiting, asleep (S), blocked on I/O (D), and the system calls that took longest.

Needs root (tracefs) and Linux; an ad-hoc tool, not part of ``run.py``::

    PYTHONPATH=src:bench .venv/bin/python bench/cleaner_stall_trace.py --windows 8 --seconds 5
"""

from __future__ import annotations

import argparse
import bisect
import collections
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
from benchlib.compaction_workloads import backlog_broker, scrape, warm_coordinator
from benchlib.workloads import Context, warm_up_producer

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = (
    "sched/sched_switch",
    "sched/sched_wakeup",
    "jbd2/jbd2_start_commit",
    "jbd2/jbd2_end_commit",
    "ext4/ext4_sync_file_enter",
    "ext4/ext4_sync_file_exit",
)


class Tracer:
    """A tracefs instance of its own (other users of the tracer are left alone)."""

    def __init__(self, name: str, syscall_pids: list[int]) -> None:
        self.dir = TRACEFS / "instances" / name
        self.dir.mkdir(exist_ok=True)
        (self.dir / "tracing_on").write_text("0")
        (self.dir / "trace_clock").write_text("mono")
        (self.dir / "buffer_size_kb").write_text("65536")
        for ev in EVENTS:
            path = self.dir / "events" / ev / "enable"
            if path.exists():
                path.write_text("1")
        flt = " || ".join(f"common_pid == {p}" for p in syscall_pids)
        for ev in ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit"):
            (self.dir / "events" / ev / "filter").write_text(flt)
            (self.dir / "events" / ev / "enable").write_text("1")
        (self.dir / "trace").write_text("")

    def on(self) -> None:
        (self.dir / "tracing_on").write_text("1")

    def dump(self, out: Path) -> None:
        (self.dir / "tracing_on").write_text("0")
        with (self.dir / "trace").open() as src, out.open("w") as dst:
            shutil.copyfileobj(src, dst)

    def remove(self) -> None:
        try:
            (self.dir / "tracing_on").write_text("0")
            for ev in (*EVENTS, "raw_syscalls/sys_enter", "raw_syscalls/sys_exit"):
                path = self.dir / "events" / ev / "enable"
                if path.exists():
                    path.write_text("0")
            self.dir.rmdir()
        except OSError as exc:
            print(f"tracefs instance left behind: {exc}", file=sys.stderr)


def window(bootstrap: str, topic: str, seconds: float, rate: int, pad: bytes) -> list[tuple[int, int]]:
    """``fixed_rate_latency``'s loop (linger.ms=0, acks=all, idempotent, 1 KB, a consumer reading
    along); returns (send ns, ack ns) per record on ``perf_counter_ns``."""
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

    p = Producer({"bootstrap.servers": bootstrap, **drivers.PRODUCE_CONF, "linger.ms": 0, **kafka.QUIET})
    p.list_topics(topic, timeout=30)
    warm_up_producer(p, topic, pad)  # else the producer-id timer may hold the first records
    drivers.deprioritise_io_threads()
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


LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>[\d.]+):\s+(?P<ev>\w+):\s+(?P<rest>.*)$"
)


def parse(path: Path) -> list[tuple[int, int, str, str, str]]:
    """(ts ns, pid, comm, event, rest) per trace line."""
    out = []
    with path.open() as f:
        for line in f:
            m = LINE.match(line)
            if m:
                ts = round(float(m["ts"]) * 1e9)
                out.append((ts, int(m["pid"]), m["comm"].strip(), m["ev"], m["rest"]))
    return out


def states(
    events: list[tuple[int, int, str, str, str]], tids: dict[int, str]
) -> dict[int, list[tuple[int, int, str]]]:
    """Per watched tid: intervals (start, end, state) with state 'cpu', 'runnable', 'S', 'D', ..."""
    cur: dict[int, tuple[int, str]] = {}
    out: dict[int, list[tuple[int, int, str]]] = collections.defaultdict(list)
    sw = re.compile(
        r"prev_comm=.* prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=.* next_pid=(\d+)"
    )
    wk = re.compile(r"pid=(\d+)")
    for ts, _pid, _comm, ev, rest in events:
        if ev == "sched_switch":
            m = sw.search(rest)
            if not m:
                continue
            prev, pstate, nxt = int(m[1]), m[2], int(m[3])
            if prev in tids:
                if prev in cur:
                    out[prev].append((cur[prev][0], ts, cur[prev][1]))
                st = "runnable" if pstate.startswith("R") else pstate[0]
                cur[prev] = (ts, st)
            if nxt in tids:
                if nxt in cur:
                    out[nxt].append((cur[nxt][0], ts, cur[nxt][1]))
                cur[nxt] = (ts, "cpu")
        elif ev == "sched_wakeup":
            m = wk.search(rest.split("comm=")[-1]) if "comm=" in rest else wk.search(rest)
            m = re.search(r"\bpid=(\d+)", rest)
            if m and int(m[1]) in tids:
                t = int(m[1])
                if t in cur and cur[t][1] != "cpu":
                    out[t].append((cur[t][0], ts, cur[t][1]))
                    cur[t] = (ts, "runnable")
    return out


def occupancy(path: Path) -> dict[int, tuple[list[int], list[str]]]:
    """Per CPU: the switch times and who ran from each (``comm:pid``), from ``sched_switch``."""
    line_re = re.compile(
        r"^\s*.+?-\d+\s+\[(\d+)\]\s+\S+\s+([\d.]+):\s+sched_switch:.* next_comm=(.*) next_pid=(\d+)"
    )
    out: dict[int, tuple[list[int], list[str]]] = {}
    with path.open() as f:
        for line in f:
            m = line_re.match(line)
            if m:
                times, who = out.setdefault(int(m[1]), ([], []))
                times.append(round(float(m[2]) * 1e9))
                who.append(f"{m[3]}:{m[4]}")
    return out


def held_by(occ: dict[int, tuple[list[int], list[str]]], a: int, b: int) -> collections.Counter[str]:
    """Milliseconds each task ran on any CPU within [a, b)."""
    acc: collections.Counter[str] = collections.Counter()
    for times, who in occ.values():
        i = max(bisect.bisect_right(times, a) - 1, 0)
        while i < len(times) - 1 and times[i] < b:
            lo, hi = max(times[i], a), min(times[i + 1], b)
            if hi > lo:
                acc[who[i]] += (hi - lo) / 1e6
            i += 1
    return acc


def summarize(intervals: list[tuple[int, int, str]], a: int, b: int) -> dict[str, float]:
    acc: dict[str, float] = collections.defaultdict(float)
    for s, e, st in intervals:
        lo, hi = max(s, a), min(e, b)
        if hi > lo:
            acc[st] += (hi - lo) / 1e6
    return {k: round(v, 2) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}


def longest(intervals: list[tuple[int, int, str]], a: int, b: int, state: str) -> float:
    best = 0.0
    for s, e, st in intervals:
        if st == state and min(e, b) > max(s, a):
            best = max(best, (min(e, b) - max(s, a)) / 1e6)
    return round(best, 2)


def syscalls(events: list[tuple[int, int, str, str, str]], pid: int) -> list[tuple[int, int, int]]:
    """(enter ns, exit ns, nr) of ``pid``'s system calls."""
    open_: dict[int, tuple[int, int]] = {}
    out = []
    for ts, p, _c, ev, rest in events:
        if p != pid:
            continue
        if ev == "sys_enter":
            m = re.match(r"NR (\d+)", rest)
            if m:
                open_[p] = (ts, int(m[1]))
        elif ev == "sys_exit" and p in open_:
            s, nr = open_.pop(p)
            out.append((s, ts, nr))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=8, help="windows, ABBA from idle (default 8)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--backlog-mb", type=float, default=60.0)
    ap.add_argument("--slow-ms", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "cleaner-stall")
    ap.add_argument("--broker-opt", action="append", default=[])
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--analyse", action="store_true", help="only analyse an earlier run's --out")
    args = ap.parse_args(argv)
    if args.analyse:
        analyse(args.out, args.slow_ms)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
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
    work = args.out / f"work-{uuid.uuid4().hex[:6]}"
    b, _, _ = backlog_broker(ctx, work, int(args.backlog_mb * 1e6), 100)
    tracer: Tracer | None = None
    result: dict[str, Any] = {"windows": []}
    try:
        pid = worker_pid(b)
        os.kill(pid, signal.SIGSTOP)
        names = ["idle", "busy", "busy", "idle"]
        seq = [names[i % 4] for i in range(args.windows)]
        topics = [f"stall-{i}-{uuid.uuid4().hex[:6]}" for i in range(len(seq))]
        for t in topics:
            kafka.create_topic(b.bootstrap, t, 1)
        warm_coordinator(b.bootstrap, topics[0])
        tids = {
            int(t): Path(f"/proc/{b.pid}/task/{t}/comm").read_text().strip()
            for t in os.listdir(f"/proc/{b.pid}/task")
        }
        if not args.no_trace:
            tracer = Tracer(f"cleaner-stall-{os.getpid()}", [b.pid])
            tracer.on()
        pad = ctx.pool[0][8:]
        for i, (name, topic) in enumerate(zip(seq, topics, strict=True)):
            if name == "busy":
                os.kill(pid, signal.SIGCONT)
            t0 = time.perf_counter_ns()
            acks = window(b.bootstrap, topic, args.seconds, 1000, pad)
            t1 = time.perf_counter_ns()
            if name == "busy":
                os.kill(pid, signal.SIGSTOP)
            lat = sorted((a - s) / 1e6 for s, a in acks)
            p99 = lat[int(0.99 * (len(lat) - 1))] if lat else None
            print(f"window {i} {name}: p99 {p99:.2f} ms max {lat[-1]:.2f} ms", file=sys.stderr)
            result["windows"].append({"name": name, "t0": t0, "t1": t1, "acks": acks, "p99": p99})
        self_tids = {
            int(t): Path(f"/proc/self/task/{t}/comm").read_text().strip()
            for t in os.listdir("/proc/self/task")
        }
        result["passes"] = scrape(b).get("exactly_log_cleaner_passes_total")
        if tracer is not None:
            tracer.dump(args.out / "trace.txt")
    finally:
        if tracer is not None:
            tracer.remove()
        b.stop()
        shutil.rmtree(work, ignore_errors=True)
    watched = {b.pid: "broker-loop", pid: "worker"}
    for t, c in tids.items():
        watched.setdefault(t, f"broker:{c}")
    for t, c in self_tids.items():
        watched.setdefault(t, f"client:{c}")
    result["watched"] = {str(k): v for k, v in watched.items()}
    result["broker_pid"], result["worker_pid"] = b.pid, pid
    (args.out / "acks.json").write_text(json.dumps(result))
    if args.no_trace:
        return 0
    analyse(args.out, args.slow_ms)
    return 0


def analyse(out: Path, slow_ms: float) -> None:
    """Print, per window, where the threads were during its slow acks (see the module docstring)."""
    result = json.loads((out / "acks.json").read_text())
    watched = {int(k): v for k, v in result["watched"].items()}
    broker_pid, pid = result["broker_pid"], result["worker_pid"]
    events = parse(out / "trace.txt")
    st = states(events, watched)
    occ = occupancy(out / "trace.txt")
    calls = syscalls(events, broker_pid)
    commits = [e for e in events if e[3].startswith("jbd2")]
    syncs = [e for e in events if e[3].startswith("ext4_sync")]
    for w in result["windows"]:
        slow = [(s, a) for s, a in w["acks"] if (a - s) / 1e6 >= slow_ms]
        print(f"\n== {w['name']} window: {len(slow)} acks >= {slow_ms} ms, p99 {w['p99']:.2f}")
        wsum = summarize(st.get(pid, []), w["t0"], w["t1"])
        print(f"   worker over the window: {wsum}")
        loop_acc: collections.Counter[str] = collections.Counter()
        cpus: collections.Counter[str] = collections.Counter()
        end = 0
        for s, a in slow:
            if s >= end:
                loop_acc.update(summarize(st.get(broker_pid, []), s, a))
                cpus.update(held_by(occ, s, a))
                end = a
        print(f"   over all its stalls: broker loop {dict(loop_acc)}; CPUs held by {cpus.most_common(6)}")
        shown = 0
        last_end = 0
        for s, a in slow:
            if s < last_end:
                continue  # one stall, several acks
            last_end = a
            shown += 1
            if shown > 12:
                break
            print(f"  ack {(a - s) / 1e6:.1f} ms at +{(s - w['t0']) / 1e9:.3f} s")
            for t, label in watched.items():
                summ = summarize(st.get(t, []), s, a)
                if summ and (label in ("broker-loop", "worker") or summ.get("runnable", 0) > 1):
                    print(
                        f"    {label:<24} {summ}  longest runnable {longest(st.get(t, []), s, a, 'runnable')}"
                    )
            top = ", ".join(f"{k} {v:.1f}" for k, v in held_by(occ, s, a).most_common(5))
            print(f"    CPUs held by (ms): {top}")
            long_calls = sorted(
                ((e - x) / 1e6, nr) for x, e, nr in calls if x < a and e > s and (e - x) > 1e6
            )
            if long_calls:
                print(f"    broker-loop syscalls > 1 ms: {long_calls[-5:]}")
            near = [
                f"{ev}@{(ts - s) / 1e6:+.1f}ms {c}"
                for ts, _p, c, ev, _r in commits + syncs
                if s - 20e6 < ts < a
            ]
            if near:
                print(f"    fs: {near[:8]}")


if __name__ == "__main__":
    sys.exit(main())
