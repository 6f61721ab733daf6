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
    r"^\s*.+?-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>[\d.]+):\s+(?P<ev>\w+):\s+(?P<rest>.*)$"
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


def record(seconds: float, out: Path) -> None:
    inst = TRACEFS / "instances" / f"burst-{os.getpid()}"
    inst.mkdir(exist_ok=True)
    try:
        (inst / "tracing_on").write_text("0")
        (inst / "trace_clock").write_text("mono")
        (inst / "buffer_size_kb").write_text("65536")
        for ev in EVENTS:
            (inst / "events" / ev / "enable").write_text("1")
        (inst / "trace").write_text("")
        (inst / "tracing_on").write_text("1")
        time.sleep(seconds)
        (inst / "tracing_on").write_text("0")
        with (inst / "trace").open() as src, out.open("w") as dst:
            shutil.copyfileobj(src, dst)
    finally:
        for ev in EVENTS:
            (inst / "events" / ev / "enable").write_text("0")
        inst.rmdir()


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def analyse(path: Path, worker: int, seconds: float) -> dict[str, float]:
    running: dict[int, int] = {}  # cpu -> pid on it
    since: dict[int, int] = {}  # cpu -> when the worker got it
    stints: list[float] = []
    pending: dict[int, int] = {}  # pid woken on the worker's CPU while it ran -> wake time
    waits: list[float] = []
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
                if prev == worker and cpu in since:
                    stints.append((ts - since.pop(cpu)) / 1e6)
                if nxt == worker:
                    since[cpu] = ts
                running[cpu] = nxt
                if nxt in pending:
                    waits.append((ts - pending.pop(nxt)) / 1e6)
            elif ev == "sched_wakeup":
                w = WAKEUP.search(m["rest"])
                if not w:
                    continue
                pid, target = int(w["pid"]), int(w["cpu"])
                if pid != worker and int(w["prio"]) <= MAX_PRIO and running.get(target) == worker:
                    pending[pid] = ts
    return {
        "worker_stints": len(stints),
        "stint_ms_p50": pct(stints, 50),
        "stint_ms_p99": pct(stints, 99),
        "stint_ms_max": max(stints, default=0.0),
        "worker_cpu_ms_per_s": sum(stints) / seconds,
        "waits_behind_worker": len(waits),
        "wait_ms_p50": pct(waits, 50),
        "wait_ms_p99": pct(waits, 99),
        "wait_ms_max": max(waits, default=0.0),
        "waits_over_1ms": sum(w >= 1.0 for w in waits),
        "wait_ms_per_s": sum(waits) / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker-pid", type=int)
    ap.add_argument("--broker-pid", type=int)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", type=Path, help="keep the raw trace in this file")
    args = ap.parse_args(argv)
    worker = args.worker_pid or find_worker(args.broker_pid)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.txt"
        record(args.seconds, trace)
        result = analyse(trace, worker, args.seconds)
        if args.keep:
            shutil.copyfile(trace, args.keep)
    print(json.dumps({"label": args.label, "worker": worker, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
