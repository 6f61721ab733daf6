"""CPU and memory accounting from /proc.

``/proc/<pid>/stat`` utime+stime covers every thread of the process.  Child processes the broker may
fork (worker pools) are added by walking the process tree; reaped children show up in cutime/cstime.

Resolution: ``/proc/<pid>/stat`` counts in clock ticks (10 ms at USER_HZ 100), so a 0.1 CPU-s run
(100 B records, ~90 MB) moves in steps of ~10%: every figure read 1.222 or 1.333 CPU-s/GB. The
process's own CPU therefore comes from the kernel's per-process CPU clock (``clock_gettime`` on
the clock id ``clock_getcpuclockid`` would give: the scheduler's runtime in ns, every thread,
exited ones included -- the same quantity the ticks are rounded from); the ticks remain the
fallback where that clock cannot be read, and for descendants (rare, and whole ticks suffice).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def _own_ticks(fields: list[str]) -> int:
    # Fields after comm start at field 3 (state): utime=14, stime=15, cutime=16, cstime=17.
    return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])


def _children(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None:
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    stack = [root]
    for _ in range(100_000):  # bounded walk
        if not stack:
            break
        pid = stack.pop()
        for child in kids.get(pid, []):
            out.append(child)
            stack.append(child)
    return out


_CPUCLOCK_SCHED = 2  # Linux's process CPU clock id: ((~pid) << 3) | CPUCLOCK_SCHED


def process_cpu_ns(pid: int) -> int | None:
    """CPU ns of ``pid`` (all its threads, exited ones too; not its children) from the kernel's
    per-process CPU clock; None where it cannot be read (not Linux, the process is gone)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
    except (OSError, OverflowError, AttributeError):
        return None


def cpu_seconds(pid: int, include_children: bool = True) -> float:
    """User+system CPU seconds consumed so far by ``pid`` (all threads, ns resolution, see the
    module docstring) and, optionally, its descendants (in ticks; reaped ones via cutime/cstime)."""
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    own_ns = process_cpu_ns(pid)
    if own_ns is None:
        ticks = _own_ticks(fields)
    else:
        ticks = int(fields[13]) + int(fields[14])  # reaped children only; the process's own is own_ns
    if include_children:
        for child in _children(pid):
            cf = _stat_fields(child)
            if cf is not None:
                ticks += _own_ticks(cf)
    return ticks / CLK_TCK + (own_ns or 0) / 1e9


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MB for ``pid``; (0, 0) if it is gone."""
    cur = peak = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return cur, peak


def self_cpu_seconds() -> float:
    """CPU seconds of this whole process (all threads, so librdkafka's threads are included)."""
    t = os.times()
    return t.user + t.system


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies for the whole machine from /proc/stat, to spot a noisy neighbour."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [int(v) for v in first]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total
