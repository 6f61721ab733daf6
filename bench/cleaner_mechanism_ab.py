"""Diagnostic for issue #11's busy-window p99: which part of the cleaner's worker costs the produce
p99 -- the core it occupies (scheduling), the memory it sweeps (caches), or its reads and writes.

One broker with ``cleaner-produce-latency``'s compacted backlog (its cleaner in the first pass,
the worker stopped with SIGSTOP outside its windows), ``latency-1k``'s loop in windows of these
phases, in a rotating order per round (every phase meets every position):

- ``idle``: the worker stopped, nothing else;
- ``busy``: the worker resumed, as shipped (own session at nice 19, SCHED_BATCH, 0.1 ms slice);
- ``busy-sched-idle``: the worker resumed under SCHED_IDLE for the window;
- ``busy-cgroup-idle``: the worker resumed inside a cpu cgroup with ``cpu.idle=1`` for the window
  (``compaction_latency.idle_cgroup``: idle at the top level, not only inside its autogroup);
- ``burn-cpu``: no worker; a *synthetic* process with the worker's exact scheduling
  (``priority.lower_priority`` in a session of its own) and duty cycle (``worker.CpuLimiter`` at the
  broker's ``log.cleaner.cpu.max.share``, ticked every ~30 us of pure-Python arithmetic) that touches
  no memory to speak of and does no I/O;
- ``burn-mem``: the same, each tick also reading and writing 64 random 24-byte slots of a 128 MB
  anonymous mapping (the offset map's size and access pattern: cache and TLB misses);
- ``burn-cpu-idle``: ``burn-cpu`` under SCHED_IDLE;
- ``burn-cpuyield`` / ``burn-memyield``: ``burn-cpu`` / ``burn-mem`` calling ``sched_yield()`` after
  every tick that did not sleep (a task woken onto its core runs at once, not after the burst).

If ``burn-cpu`` costs the p99 what ``busy`` does, the worker's I/O and memory are innocent: the
cost is its occupying a core. Ad hoc, Linux only (``/proc``, signals)::

    PYTHONPATH=src:bench .venv/bin/python bench/cleaner_mechanism_ab.py --rounds 4 --seconds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import drivers, kafka, procstat
from benchlib.compaction_latency import (
    Phase,
    autogroup_nice,
    cpu_share,
    in_pass,
    run_delay_s,
    worker_pid,
    worker_running,
)
from benchlib.compaction_workloads import backlog_broker, load1, passes_of, scrape, warm_coordinator
from benchlib.workloads import Context, fixed_rate_latency, percentile
from exactly.storage.cleaner.sched_slice import MIN_SLICE_NS, set_slice

#: ``--emulate-quiet``: the measured chain's session (this process and the broker) and the
#: worker's / burners' sessions get these autogroup nice values, and every thread of the chain
#: the shortest slice, so that the other helpers' nice-0 load on the shared box weighs little on
#: either (see ``emulated``).
CHAIN_GROUP_NICE = -15
WORKER_GROUP_NICE = -10


@contextlib.contextmanager
def emulated(inner: contextlib.AbstractContextManager[Any], pids: list[int]) -> Iterator[None]:
    """Right before a window's first record: every thread of ``pids`` (this process with its
    client threads, the broker) gets the shortest EEVDF slice, so a chain task woken onto a core
    held by another session's nice-0 task preempts it at once (a shorter slice cancels the
    running task's protection) -- but not the worker, whose slice is as short, so the mechanism
    under test (a task woken behind the worker waits out its protected slice and its burst) is
    kept. With the chain's session at nice -15 and the worker's at -10, the box's other load
    mostly drops out of both."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                set_slice(MIN_SLICE_NS, int(tid))
    with inner:
        yield


BURNER = r"""
import mmap, os, random, sys, time
from exactly.storage.cleaner.priority import lower_priority
from exactly.storage.cleaner.worker import CpuLimiter
lower_priority()
share, mem, yld = float(sys.argv[1]), sys.argv[2].startswith("mem"), sys.argv[2].endswith("yield")
m = mmap.mmap(-1, 128 * 1024 * 1024) if mem else None
if m is not None:
    for i in range(0, len(m), 4096):
        m[i] = 1  # resident, as a worked offset map is
slots = (128 * 1024 * 1024) // 24
try:  # since session 19 CpuLimiter yields at every tick it does not sleep: the burner chooses
    cpu = CpuLimiter(share, yield_core=lambda: None)
except TypeError:  # older code: no yield
    cpu = CpuLimiter(share)
cpu.start()
rnd = random.Random(1)
os.write(1, b"ready\n")
while True:
    x = 0
    for i in range(600):  # ~40 us of CPython arithmetic, like 32 records' decode between ticks
        x = (x * 31 + i) & 0xFFFFFFFF
    if m is not None:
        for _ in range(64):
            o = rnd.randrange(slots) * 24
            m[o : o + 24] = m[o + 24 - 24 : o + 24]
    slept = cpu.slept_s
    cpu()
    if yld and cpu.slept_s == slept:
        os.sched_yield()  # hand the core to whatever waits on it
"""


def start_burner(share: float, kind: str, pythonpath: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER, str(share), kind],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=pythonpath),
        start_new_session=True,  # its own autogroup, as the worker
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


@contextlib.contextmanager
def running(pid: int, policy: int | None) -> Iterator[None]:
    p0 = os.sched_getscheduler(pid)
    if policy is not None:
        os.sched_setscheduler(pid, policy, os.sched_param(0))
    os.kill(pid, signal.SIGCONT)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGSTOP)
        os.sched_setscheduler(pid, p0, os.sched_param(0))


def lift_worker(broker_pid: int, timeout: float = 120) -> None:
    """``--emulate-quiet`` on a loaded box: the worker's session at ``WORKER_GROUP_NICE`` from
    the moment it has one until its pass has begun (a nice-19 worker may otherwise take minutes
    over its imports; it sets its own session's nice to 19 first, so this keeps setting it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{broker_pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                for kid in (task / "children").read_text().split():
                    pid = int(kid)
                    if os.getsid(pid) == pid:
                        autogroup_nice(pid, WORKER_GROUP_NICE)
                        if in_pass(pid) and os.getpriority(os.PRIO_PROCESS, pid) == 19:
                            return
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--backlog-mb", type=float, default=150.0)
    ap.add_argument("--phases", default="idle,busy,busy-sched-idle,burn-cpu,burn-mem,burn-cpu-idle")
    ap.add_argument("--broker-opt", action="append", default=[])
    ap.add_argument("--emulate-quiet", action="store_true", help="see ``emulated``")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "cleaner-mech.json")
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="cleaner-mech-"))
    ctx = Context(
        quick=False,
        records=0,
        repeat=1,
        scratch=scratch,
        kcat_env={},
        latency_seconds=args.seconds,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=args.broker_opt,
        pool=drivers.payload_pool(1024),
    )
    phases = args.phases.split(",")
    if args.emulate_quiet:
        if os.getsid(0) != os.getpid():
            os.setsid()  # a session (autogroup) of its own, not the caller's
        Path("/proc/self/autogroup").write_text(f"{CHAIN_GROUP_NICE}\n")
    share = cpu_share(args.broker_opt)
    src = str(Path(__file__).resolve().parents[1] / "src")
    pythonpath = os.environ.get("PYTHONPATH", src)
    b, _, _ = backlog_broker(ctx, scratch / "work", int(args.backlog_mb * 1e6), 100)
    burners: dict[str, subprocess.Popen[bytes]] = {}
    acks: dict[str, list[float]] = {p: [] for p in phases}
    rows: list[dict[str, Any]] = []
    try:
        if args.emulate_quiet:
            lift_worker(b.pid)
        wpid = worker_pid(b)
        os.kill(wpid, signal.SIGSTOP)
        for kind in ("cpu", "mem", "cpuyield", "memyield"):
            if any(p.removesuffix("-idle") == f"burn-{kind}" for p in phases):
                burners[kind] = start_burner(share, kind, pythonpath)
                if args.emulate_quiet:
                    autogroup_nice(burners[kind].pid, WORKER_GROUP_NICE)
        group = WORKER_GROUP_NICE if args.emulate_quiet else None
        n = len(phases)
        sequence = [phases[(r + i) % n] for r in range(args.rounds) for i in range(n)]
        rnd = random.Random(7)
        del rnd
        topics = [f"mech-{i}-{uuid.uuid4().hex[:6]}" for i in range(len(sequence))]
        for t in topics:
            kafka.create_topic(b.bootstrap, t, 1)
        warm_coordinator(b.bootstrap, topics[0])
        for i, ph in enumerate(sequence):
            if ph == "idle":
                win: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
                pid = None
            elif ph.startswith("busy"):
                pid = wpid
                pol = os.SCHED_IDLE if ph == "busy-sched-idle" else None
                cg = ph == "busy-cgroup-idle"
                win = worker_running(wpid, Phase(ph, True, policy=pol, autogroup_nice=group, cgroup_idle=cg))
            else:
                pid = burners[ph.removeprefix("burn-").removesuffix("-idle")].pid
                win = running(pid, os.SCHED_IDLE if ph.endswith("-idle") else None)
            if args.emulate_quiet:
                win = emulated(win, [os.getpid(), b.pid])
            l0, w0 = load1(), run_delay_s(b.pid, b.pid)
            c0 = procstat.cpu_seconds(pid) if pid else 0.0
            s = fixed_rate_latency(ctx, b, topics[i], win, keep_acks=True)
            a = s.pop("ack_ms", [])
            acks[ph].extend(a)
            row = {
                "i": i,
                "phase": ph,
                "p50": s.get("ack_p50_ms"),
                "p99": s.get("ack_p99_ms"),
                "max": s.get("ack_max_ms"),
                "load1": (l0 + load1()) / 2,
                "loop_wait_ms_per_s": (run_delay_s(b.pid, b.pid) - w0) * 1000 / s["wall_s"],
                "other_cores": ((procstat.cpu_seconds(pid) - c0) / s["wall_s"]) if pid else 0.0,
                "ok": s["ok"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        m = scrape(b)
        still = passes_of(m) == 0
    finally:
        for p in burners.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait()
        b.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {
        ph: {
            "acks": len(v),
            "p50": percentile(sorted(v), 50),
            "p99": percentile(sorted(v), 99),
            "p999": percentile(sorted(v), 99.9),
        }
        for ph, v in acks.items()
    }
    idle = summary.get("idle", {}).get("p99")
    for _ph, s in summary.items():
        s["p99_over_idle"] = s["p99"] / idle if idle and s["p99"] else None
    out = {"rows": rows, "summary": summary, "pass_still_running": still, "share": share}
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))
    print("pass still running at the end:", still)
    return 0


if __name__ == "__main__":
    sys.exit(main())
