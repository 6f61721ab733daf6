"""Log compaction (issue #11): produce latency while the cleaner runs vs while it is idle.

- ``cleaner-produce-latency``: a compacted backlog (100 B values, ``compaction_workloads.backlog_broker``)
  and a restart with the cleaner on; the bench stops the cleaner's worker process (SIGSTOP) at once and
  runs ``latency-1k``'s loop (1,000 msg/s, 1 KB, linger.ms=0, acks=all) in windows that alternate
  between the worker resumed (SIGCONT, **busy**) and stopped (**idle**, as idle as a cleaner with
  nothing to do: the broker's cleaner thread waits on its pipe), in ABBA order: one broker, one
  uptime, one box load for both. Ratio = busy p99 / idle p99 per repetition.
- ``cleaner-produce-latency-priority``: adds busy phases under other worker scheduling
  (SCHED_IDLE, the worker's session at nice 0), set by the bench for their windows only.

An earlier form measured busy right after the restart and idle minutes later, with a twin broker
(cleaner off) running beside the busy one as a control: the twin loaded the very box it was meant
to control for. Linux only (``/proc``, signals, x86_64 system call numbers).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import kafka, procstat
from benchlib.brokers import BrokerProcess
from benchlib.compaction_workloads import (
    backlog_broker,
    bytes_read_of,
    load1,
    passes_of,
    scrape,
    wait_passes,
    warm_coordinator,
)
from benchlib.workloads import Context, Target, Workload, fixed_rate_latency, percentile, register
from exactly.storage.cleaner import sched_slice
from exactly.storage.cleaner.priority import WORKER_NICENESS
from exactly.storage.cleaner.runner import DEFAULT_CPU_SHARE

SEGMENT_LOG = re.compile(r"/\d{20}\.log$")


def in_pass(pid: int) -> bool:
    """The worker has a segment file open: it is reading the log (its pass has begun)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if SEGMENT_LOG.search(os.readlink(f"/proc/{pid}/fd/{fd}")):  # not its stderr's broker log
                return True
        except OSError:
            continue
    return False


def worker_pid(broker: BrokerProcess, timeout: float = 60) -> int:
    """The broker's cleaner worker process (its only child process), once it has lowered its own
    priority (nice 19, the first thing it does): a worker stopped before that would keep the
    broker's priority, and ``worker_running`` would restore that priority after every window.
    And once it has begun its pass (a segment open): since 2026-11-25 the worker lowers its
    priority before its imports (~0.7 s of CPU), which would otherwise fall into the first busy
    window (before, they ran before the priority was lowered, so before the bench stopped it)."""
    deadline = time.monotonic() + timeout
    while True:
        for task in Path(f"/proc/{broker.pid}/task").iterdir():
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            if (
                kids
                and os.getpriority(os.PRIO_PROCESS, int(kids[0])) == WORKER_NICENESS
                and in_pass(int(kids[0]))
            ):
                return int(kids[0])
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no cleaner worker at nice {WORKER_NICENESS} in its pass under broker pid {broker.pid}"
            )
        time.sleep(0.01)


def autogroup_nice(pid: int, value: int | None = None) -> int | None:
    """Read (and with ``value``, first set) the nice value of ``pid``'s autogroup (its session's
    scheduling group); None without autogroups."""
    path = Path(f"/proc/{pid}/autogroup")
    try:
        if value is not None:
            path.write_text(f"{value}\n")
        return int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_SHIFT = 13
SYS_IOPRIO_SET = 251  # x86_64
SYS_IOPRIO_GET = 252


def ioprio(pid: int, value: int | None = None) -> int:
    """Read (and with ``value``, first set) the I/O priority of ``pid``'s main thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    if value is not None and libc.syscall(SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, pid, value) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")
    return int(libc.syscall(SYS_IOPRIO_GET, IOPRIO_WHO_PROCESS, pid))


def run_delay_s(pid: int, tid: int | None = None) -> float:
    """Seconds thread ``tid`` (default: every thread) of ``pid`` has spent runnable but waiting
    for a CPU (``/proc/.../schedstat``, field 2)."""
    tids = [str(tid)] if tid is not None else os.listdir(f"/proc/{pid}/task")
    total = 0
    for t in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def sched_slice_ns(pid: int, runtime_ns: int | None = None) -> int:
    """Read (and with ``runtime_ns``, first set: the EEVDF custom slice of a fair task, Linux
    6.12+) ``pid``'s slice, through the cleaner's own ``sched_slice``."""
    if runtime_ns is not None and not sched_slice.set_slice(runtime_ns, pid):
        raise OSError(ctypes.get_errno(), "sched_setattr")
    current = sched_slice.slice_ns(pid)
    if current is None:
        raise OSError(ctypes.get_errno(), "sched_getattr")
    return current


#: An ack at least this slow counts as a stall in the per-window counts.
STALL_MS = 10.0


def stalls(acks_ms: list[float]) -> int:
    """Separate stalls in a window: runs of consecutive acks (in delivery order) >= ``STALL_MS``
    count once (one stall delays every record sent during it)."""
    count, inside = 0, False
    for a in acks_ms:
        slow = a >= STALL_MS
        count += slow and not inside
        inside = slow
    return count


def cpu_share(options: list[str]) -> float:
    """``log.cleaner.cpu.max.share`` from ``--broker-opt`` options, else the broker's default."""
    for opt in reversed(options):
        key, _, value = opt.partition("=")
        if key == "log.cleaner.cpu.max.share":
            return float(value)
    return DEFAULT_CPU_SHARE


@dataclass(frozen=True, slots=True)
class Phase:
    """One kind of measured window: the cleaner worker running (``busy``) or stopped, and the
    scheduling the bench gives the worker for it (None: as the broker started it)."""

    name: str
    busy: bool
    nice: int | None = None
    io_class: int | None = None  # (class << 13) | level
    policy: int | None = None  # os.SCHED_*
    slice_ns: int | None = None  # sched_setattr's sched_runtime: the task's EEVDF slice
    autogroup_nice: int | None = None  # the nice value of the worker's session (autogroup)
    cgroup_idle: bool = False  # the worker in a cpu cgroup with cpu.idle=1 (``idle_cgroup``)


CPU_CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))  # v1's cpu controller, v2


def idle_cgroup(name: str = "exactly-bench-idle") -> tuple[Path, Path] | None:
    """(a cpu cgroup with ``cpu.idle=1``, its root) under cgroup v1's cpu controller or a v2
    hierarchy with the cpu controller; None where neither can be made (not root, no cpu.idle).

    Why a cgroup: the scheduler's *idle entity* rules (a woken non-idle task preempts an idle
    entity at once, an idle entity weighs 3) apply per level of the group hierarchy. The worker
    runs in a session (autogroup) of its own, so SCHED_IDLE on the worker itself is idle only
    inside its autogroup; its autogroup competes with the broker's as a normal entity. A cgroup
    with cpu.idle=1 is an idle entity at the top level (a task outside the root task group has no
    autogroup)."""
    for root in CPU_CGROUP_ROOTS:
        if not (root / "cgroup.procs").exists():
            continue
        controllers = root / "cgroup.controllers"  # v2 only: the cpu controller must be there
        if controllers.exists() and "cpu" not in controllers.read_text().split():
            continue
        group = root / name
        try:
            group.mkdir(exist_ok=True)
            (group / "cpu.idle").write_text("1\n")
        except OSError:
            continue
        return group, root
    return None


@contextlib.contextmanager
def in_cgroup(pid: int, cgroup: tuple[Path, Path] | None) -> Iterator[None]:
    """``pid`` (every thread) in ``cgroup[0]`` for the block, back in its root after."""
    if cgroup is None:
        yield
        return
    group, root = cgroup
    (group / "cgroup.procs").write_text(f"{pid}\n")
    try:
        yield
    finally:
        (root / "cgroup.procs").write_text(f"{pid}\n")


@contextlib.contextmanager
def worker_running(pid: int, phase: Phase) -> Iterator[None]:
    """The worker resumed (SIGCONT) for the window if ``phase.busy``, under ``phase``'s priority, and
    stopped again (SIGSTOP, priority restored) when it ends. Stopped, the worker is exactly as
    idle as a cleaner with nothing to do: the broker's cleaner thread waits on its pipe."""
    if not phase.busy:
        yield
        return
    nice0, io0, policy0 = os.getpriority(os.PRIO_PROCESS, pid), ioprio(pid), os.sched_getscheduler(pid)
    slice0, group0 = sched_slice_ns(pid), autogroup_nice(pid)
    if phase.policy is not None:
        os.sched_setscheduler(pid, phase.policy, os.sched_param(0))
    if phase.nice is not None:
        os.setpriority(os.PRIO_PROCESS, pid, phase.nice)
    if phase.io_class is not None:
        ioprio(pid, phase.io_class)
    if phase.slice_ns is not None:
        sched_slice_ns(pid, phase.slice_ns)
    if phase.autogroup_nice is not None:
        autogroup_nice(pid, phase.autogroup_nice)
    cgroup = None
    if phase.cgroup_idle:
        cgroup = idle_cgroup()
        if cgroup is None:
            raise RuntimeError("no cpu cgroup with cpu.idle can be made here")
    try:
        with in_cgroup(pid, cgroup):
            os.kill(pid, signal.SIGCONT)
            try:
                yield
            finally:
                os.kill(pid, signal.SIGSTOP)
    finally:
        os.sched_setscheduler(pid, policy0, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, pid, nice0)
        sched_slice_ns(pid, slice0)
        ioprio(pid, io0)
        if phase.autogroup_nice is not None and group0 is not None:
            autogroup_nice(pid, group0)


@register
class CleanerProduceLatency(Workload):
    name = "cleaner-produce-latency"
    kind = "compaction"
    title = "produce ack latency at 1,000 msg/s while the cleaner runs vs while it is idle"
    targets = (Target("p99_ratio", "<=", 1.5, "x idle p99 (busy / idle ack p99)", "#11"),)
    peer_ok = False
    own_broker = True
    default = False

    value_size = 100  # per-record costs make the pass slow: it outlasts the windows
    #: measured in this order, then reversed, ``rounds`` times (ABBA: drift in the box's load
    #: weighs on every phase alike)
    phases: tuple[Phase, ...] = (Phase("idle", False), Phase("busy", True))
    #: 4 rounds: 4 windows per phase. With 2 (before 2026-11-24 21:00) one stall in one window
    #: decided a repetition's ratio (0.80 and 17.9 in the same run).
    rounds = 4
    #: backlog per second of busy window for an unthrottled worker with a whole idle core (a quiet
    #: box reads 100 B records at up to ~10 MB/s; at 8 the pass once ended before the last busy
    #: window); scaled by the worker's CPU share (``log.cleaner.cpu.max.share``), with a margin
    mb_per_busy_second = 20.0
    #: how long to wait for the pass to end on its own before the *idle after* window (skipped
    #: past it)
    idle_after_wait_s = 90.0

    def backlog_bytes(self, ctx: Context) -> int:
        # the pass must outlast every busy window (the worker is stopped outside them)
        busy_windows = sum(p.busy for p in self.phases) * self.rounds
        share = cpu_share(ctx.broker_options)
        per_second = self.mb_per_busy_second * min(1.0, 2 * share)
        return int(max(40.0, per_second * busy_windows * ctx.latency_seconds) * 1_000_000)

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        work = Path(ctx.scratch) / f"cleaner-lat-{uuid.uuid4().hex[:6]}"
        b, _records, _ = backlog_broker(ctx, work, self.backlog_bytes(ctx), self.value_size)
        windows: dict[str, list[dict[str, Any]]] = {p.name: [] for p in self.phases}
        worker_cpu: dict[str, float] = {p.name: 0.0 for p in self.phases}
        try:
            pid = worker_pid(b)
            os.kill(pid, signal.SIGSTOP)
            sequence = [
                p
                for r in range(self.rounds)
                for p in (self.phases if (rep + r) % 2 == 0 else self.phases[::-1])
            ]
            names = [p.name for p in sequence] + ["idle-after"]
            topics = {i: f"lat-{n}-{i}-{uuid.uuid4().hex[:6]}" for i, n in enumerate(names)}
            for t in topics.values():
                kafka.create_topic(b.bootstrap, t, 1)
            # The broker's first group use creates __consumer_offsets (50 partitions) while it answers:
            # the measured loop's consumer has a group.id, so the first window would pay for it.
            warm_coordinator(b.bootstrap, topics[0])
            for i, phase in enumerate(sequence):
                l0, c0, w0 = load1(), procstat.cpu_seconds(pid), run_delay_s(b.pid, b.pid)
                s = fixed_rate_latency(ctx, b, topics[i], worker_running(pid, phase), keep_acks=True)
                s["load1"] = (l0 + load1()) / 2
                s["loop_wait_ms_per_s"] = (run_delay_s(b.pid, b.pid) - w0) * 1000 / s["wall_s"]
                worker_cpu[phase.name] += procstat.cpu_seconds(pid) - c0
                s["stalls"] = stalls(s.get("ack_ms", []))
                windows[phase.name].append(s)
            m_busy = scrape(b)
            still_running = passes_of(m_busy) == 0
            # diagnostic: the same broker once the pass has ended on its own (the cleaner thread
            # polls every 100 ms and finds nothing): a broker that has cleaned, not a stopped pass
            # Only if the pass ends within ``idle_after_wait_s``: a worker held to a fifth of a
            # core on a loaded box can take many minutes over the backlog.
            os.kill(pid, signal.SIGCONT)
            after = {"ok": True, "error": "", "skipped": True}
            with contextlib.suppress(RuntimeError):
                wait_passes(b, 1, self.idle_after_wait_s)
                time.sleep(0.5)
                l0 = load1()
                after = fixed_rate_latency(ctx, b, topics[len(sequence)])
                after["load1"] = (l0 + load1()) / 2
        finally:
            b.stop()
            shutil.rmtree(work, ignore_errors=True)
        errors = [f"{name}: {s['error']}" for name, ws in windows.items() for s in ws if not s["ok"]]
        if not after["ok"]:
            errors.append(f"idle-after: {after['error']}")
        if not still_running:
            errors.append("the cleaner's pass ended inside the busy windows (backlog too small)")
        sample: dict[str, Any] = {"ok": not errors, "error": "; ".join(errors)[:1000]}
        keys = (
            "ack_p50_ms",
            "ack_p99_ms",
            "ack_p999_ms",
            "ack_max_ms",
            "achieved_rate",
            "broker_cores",
            "load1",
            "loop_wait_ms_per_s",
        )
        idle_after = [] if after.get("skipped") else [after]
        for name, ws in [*windows.items(), ("idle_after", idle_after)]:
            for key in keys:
                vals = [w[key] for w in ws if w.get(key) is not None]
                sample[f"{name}_{key}"] = sum(vals) / len(vals) if vals else None
            sample[f"{name}_windows"] = len(ws)
            sample[f"{name}_p99_per_window"] = [w.get("ack_p99_ms") for w in ws]
        for name, ws in windows.items():
            pooled = sorted(a for w in ws for a in w.pop("ack_ms", []))
            sample[f"{name}_pooled_ack_p99_ms"] = percentile(pooled, 99)
            sample[f"{name}_pooled_ack_p999_ms"] = percentile(pooled, 99.9)
            sample[f"{name}_max_per_window"] = [w.get("ack_max_ms") for w in ws]
            sample[f"{name}_stalls_per_window"] = [w.get("stalls") for w in ws]
        for name, cpu in worker_cpu.items():
            wall = sum(w.get("wall_s", 0.0) for w in windows[name])
            sample[f"{name}_worker_cores"] = cpu / wall if wall else None
        sample["load1"] = sum(w["load1"] for ws in windows.values() for w in ws) / sum(
            map(len, windows.values())
        )
        sample["cleaner_busy_whole_window"] = still_running
        sample["cleaner_bytes_read_in_window"] = bytes_read_of(m_busy)
        sample["sequence"] = [p.name for p in sequence]
        # The ratio: p99 of all the busy windows' acks pooled / the same of the idle windows'
        # (one stall weighs as what it is, 1/N of the acks, not a whole window's p99); the
        # earlier form (mean of the window p99s) is kept beside it, and the per-round ratios.
        idle = sample.get("idle_pooled_ack_p99_ms")
        idle_mean = sample.get("idle_ack_p99_ms")
        for p in self.phases:
            if p.busy:
                suffix = "" if p.name == "busy" else f"_{p.name.replace('-', '_')}"
                busy = sample.get(f"{p.name}_pooled_ack_p99_ms")
                sample[f"p99_ratio{suffix}"] = busy / idle if busy and idle else None
                busy_mean = sample.get(f"{p.name}_ack_p99_ms")
                sample[f"mean_window_p99_ratio{suffix}"] = (
                    busy_mean / idle_mean if busy_mean and idle_mean else None
                )
        busy_p99s, idle_p99s = sample["busy_p99_per_window"], sample["idle_p99_per_window"]
        sample["round_p99_ratios"] = [
            b_ / i_ if b_ and i_ else None for b_, i_ in zip(busy_p99s, idle_p99s, strict=False)
        ]
        after_p99 = sample.get("idle_after_ack_p99_ms")
        sample["p99_ratio_idle_after"] = sample["busy_pooled_ack_p99_ms"] / after_p99 if after_p99 else None
        return sample


@register
class CleanerProduceLatencyPriority(CleanerProduceLatency):
    """Diagnostic: the worker's scheduling compared in one run on one broker - as shipped (its own
    session at nice 19, SCHED_BATCH), with SCHED_IDLE instead, and with its session at
    nice 0 (as heavy as any other session on the box: what the worker amounted to when it ran in
    the broker's session, whose weight it drew on)."""

    name = "cleaner-produce-latency-priority"
    title = "produce ack latency at 1,000 msg/s, cleaner busy under different worker priorities"
    targets = ()
    phases = (
        Phase("idle", False),
        Phase("busy", True),
        Phase("busy-sched-idle", True, policy=os.SCHED_IDLE),
        Phase("busy-session-nice0", True, autogroup_nice=0),
    )
    rounds = 2
    mb_per_busy_second = 10.0  # the worker is stopped in the idle windows: 6 busy of 8
