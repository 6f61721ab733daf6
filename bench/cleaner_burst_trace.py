"""Diagnostic for issue #11's busy windows: how long the cleaner's worker holds a CPU at a time
(its *stints*: on-CPU intervals between two context switches), and how long the tasks woken on
that CPU while it ran waited before they got a CPU (*waits behind the worker*).

Attaches to a running broker's worker (``--worker-pid``, or the child at nice 19 of
``--broker-pid``), records the scheduler's switches and wake-ups of every task with the kernel's
tracer (a tracefs instance of its own) for ``--seconds`` and prints both distributions. Run it
beside ``run.py --only cleaner-produce-latency`` (the worker runs only in its busy windows; a
stopped worker has no stint). It measures the mechanism directly, with little of the shared box's
noise: the wake-ups counted are only those that landed on the worker's CPU while it ran.

Needs root (tracefs) and Linux; an ad-hoc tool, not part of ``run.py``::

    PYTHONPATH=src:bench .venv/bin/python bench/cleaner_burst_trace.py --broker-pid PID --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ("sched/sched_switch", "sched/sched_wakeup")
LINE = re.compile(
    r"^\s*.+?-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>[\d.]+):\s+(?P<ev>\w+):\s+(?P<rest>.*)$"
)
SWITCH = re.compile(r"prev_pid=(?P<prev>\d+) .*==> next_comm=.* next_pid=(?P<next>\d+)")
WAKEUP = re.compile(r"pid=(?P<pid>\d+) prio=(?P<prio>\d+) .*target_cpu=(?P<cpu>\d+)")
#: Wake-ups counted: tasks at nice 0 or above it in priority (the broker, its clients), not other
#: background tasks at a low priority (another broker's cleaner worker) that never preempt anyway.
MAX_PRIO = 120


def find_worker(broker_pid: int, niceness: int = 19, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{broker_pid}/task").iterdir():
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for kid in kids:
                try:
                    if os.getpriority(os.PRIO_PROCESS, int(kid)) == niceness:
                        return int(kid)
                except OSError:
                    continue
        time.sleep(0.2)
    raise RuntimeError(f"no worker at nice {niceness} under {broker_pid}")


def record(seconds: float, out: Path, tgids_out: Path) -> None:
    inst = TRACEFS / "instances" / f"burst-{os.getpid()}"
    inst.mkdir(exist_ok=True)
    try:
        (inst / "tracing_on").write_text("0")
        (inst / "trace_clock").write_text("mono")
        (inst / "options" / "record-tgid").write_text("1")
        (inst / "buffer_size_kb").write_text("65536")
        for ev in EVENTS:
            (inst / "events" / ev / "enable").write_text("1")
        (inst / "trace").write_text("")
        (inst / "tracing_on").write_text("1")
        time.sleep(seconds)
        (inst / "tracing_on").write_text("0")
        with (inst / "trace").open() as src, out.open("w") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copyfile(TRACEFS / "saved_tgids", tgids_out)
    finally:
        for ev in EVENTS:
            (inst / "events" / ev / "enable").write_text("0")
        inst.rmdir()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def read_tgids(path: Path) -> dict[int, int]:
    out = {}
    for line in path.read_text().splitlines():
        tid, _, tgid = line.partition(" ")
        if tid.isdigit() and tgid.strip().isdigit():
            out[int(tid)] = int(tgid)
    return out


def analyse(path: Path, worker: int, seconds: float, only: set[int] | None = None) -> dict[str, float]:
    """The worker's stints, and per wake-up of a nice-0 task on the worker's CPU while it ran:
    the whole wait until the task ran, and the part of it the worker itself held that CPU.
    ``only``: count the wake-ups of these threads only (the broker's, the bench client's)."""
    on_cpu: dict[int, tuple[int, int]] = {}  # cpu -> (pid, since)
    stints: list[float] = []
    preempted = 0
    pending: dict[int, tuple[int, int, int]] = {}  # pid -> (woken at, cpu, worker ns on it since)
    waits: list[float] = []
    held: list[float] = []
    with path.open() as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            ts, cpu, ev = round(float(m["ts"]) * 1e9), int(m["cpu"]), m["ev"]
            if ev == "sched_switch":
                s = SWITCH.search(m["rest"])
                if not s:
                    continue
                prev, nxt = int(s["prev"]), int(s["next"])
                pid0, t0 = on_cpu.get(cpu, (-1, ts))
                if prev == worker and pid0 == worker:
                    stints.append((ts - t0) / 1e6)
                    preempted += " prev_state=R" in m["rest"]
                    for pid, (woken, target, ns) in pending.items():
                        if target == cpu:
                            pending[pid] = (woken, target, ns + ts - max(t0, woken))
                on_cpu[cpu] = (nxt, ts)
                if nxt in pending:
                    woken, _target, ns = pending.pop(nxt)
                    waits.append((ts - woken) / 1e6)
                    held.append(ns / 1e6)
            elif ev == "sched_wakeup":
                w = WAKEUP.search(m["rest"])
                if not w:
                    continue
                pid, target = int(w["pid"]), int(w["cpu"])
                if (
                    pid != worker
                    and (only is None or pid in only)
                    and int(w["prio"]) <= MAX_PRIO
                    and on_cpu.get(target, (-1, 0))[0] == worker
                ):
                    pending[pid] = (ts, target, 0)
    cpu_s = sum(stints) / 1000
    return {
        "worker_stints": len(stints),
        "stints_preempted": preempted,
        "stint_ms_p50": pct(stints, 50),
        "stint_ms_p99": pct(stints, 99),
        "stint_ms_max": max(stints, default=0.0),
        "worker_cpu_ms_per_s": sum(stints) / seconds,
        "waits_behind_worker": len(waits),
        "wait_ms_p99": pct(waits, 99),
        "wait_ms_max": max(waits, default=0.0),
        "held_ms_p99": pct(held, 99),
        "held_ms_max": max(held, default=0.0),
        "held_over_1ms": sum(h >= 1.0 for h in held),
        "held_over_1ms_per_worker_cpu_s": sum(h >= 1.0 for h in held) / cpu_s if cpu_s else 0.0,
        "held_ms_per_worker_cpu_s": sum(held) / cpu_s if cpu_s else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker-pid", type=int)
    ap.add_argument("--broker-pid", type=int)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", type=Path, help="keep the raw trace in this file")
    ap.add_argument("--analyse", type=Path, help="only analyse this kept trace (with --worker-pid)")
    ap.add_argument(
        "--tgids", type=int, nargs="*", default=[], help="count wake-ups of these processes' threads only"
    )
    args = ap.parse_args(argv)
    if args.analyse:
        tgids = Path(f"{args.analyse}.tgids")
        only = None
        if args.tgids and tgids.exists():
            only = {tid for tid, tgid in read_tgids(tgids).items() if tgid in args.tgids}
        result = analyse(args.analyse, args.worker_pid, args.seconds, only)
        print(json.dumps({"label": args.label, **result}))
        return 0
    worker = args.worker_pid or find_worker(args.broker_pid)
    with tempfile.TemporaryDirectory() as tmp:
        trace, tgids = Path(tmp) / "trace.txt", Path(tmp) / "trace.txt.tgids"
        record(args.seconds, trace, tgids)
        wanted = set(args.tgids) | ({args.broker_pid} if args.broker_pid else set())
        only = {tid for tid, tgid in read_tgids(tgids).items() if tgid in wanted} if wanted else None
        result = analyse(trace, worker, args.seconds, only)
        if args.keep:
            shutil.copyfile(trace, args.keep)
            shutil.copyfile(tgids, f"{args.keep}.tgids")
    print(json.dumps({"label": args.label, "worker": worker, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
