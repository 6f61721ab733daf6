"""The calling thread's EEVDF slice (Linux 6.12+: ``sched_setattr``'s ``sched_runtime`` for a
fair task), which the cleaner's worker shortens to the kernel's minimum.

Why: a task woken on the core the worker holds (the broker's event loop, its clients) does not
preempt it at once: EEVDF protects the running task's slice (``RUN_TO_PARITY``), and what ends a
protected slice is the next scheduler tick (4 ms at HZ=250). The worker's low weight (nice 19 in
an autogroup at nice 19) does not shorten that: weight decides how often it runs, the slice how
long it keeps the core once picked. On a loaded box the worker stays under its CPU share
(``duty_cycle``), so it never sleeps on its own and each time it is picked it runs until that
tick: a tracefs trace (``bench/cleaner_burst_trace.py``) showed every one of its stints ending
preempted, and nice-0 tasks woken on its core waiting 3-4.4 ms with the worker on the core the
whole time -- the busy windows' produce p99 (``bench/results/cleaner-tail-s17.md``). With the
shortest slice (0.1 ms) a wake-up preempts it within 0.1 ms.

Best effort: another architecture, an older kernel (which ignores ``sched_runtime`` for fair
tasks or refuses the call) or a refused call leaves the default slice; nothing else changes.
"""

from __future__ import annotations

import ctypes
import platform
import sys

#: The shortest custom slice the kernel accepts (``sched_setattr`` clamps to 0.1-100 ms).
MIN_SLICE_NS = 100_000
#: System call numbers (``sched_setattr``, ``sched_getattr``) where they are known.
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}


class _SchedAttr(ctypes.Structure):
    """``struct sched_attr``, its first version (SCHED_ATTR_SIZE_VER0, 48 bytes)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
    ]


def _calls() -> tuple[ctypes.CDLL, int, int] | None:
    numbers = _SYSCALLS.get(platform.machine())
    if not sys.platform.startswith("linux") or numbers is None:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True), *numbers
    except OSError:
        return None


def _get(libc: ctypes.CDLL, getattr_nr: int, pid: int = 0) -> _SchedAttr | None:
    attr = _SchedAttr()
    if libc.syscall(getattr_nr, pid, ctypes.byref(attr), ctypes.sizeof(_SchedAttr), 0) != 0:
        return None
    return attr


def slice_ns(pid: int = 0) -> int | None:
    """A thread's slice (default: the caller's) as the kernel reports it: 6.12+ gives the slice
    in use (custom or default), older kernels 0 for a fair task; None when it cannot be read."""
    calls = _calls()
    if calls is None:
        return None
    attr = _get(calls[0], calls[2], pid)
    return None if attr is None else int(attr.sched_runtime)


def set_own_slice(slice_ns: int = MIN_SLICE_NS) -> bool:
    """Give the calling thread a slice of ``slice_ns``, keeping its policy and nice value (read
    first); True when the kernel accepted it (and, before 6.12, may have ignored it)."""
    return set_slice(slice_ns, 0)


def set_slice(slice_ns: int, pid: int) -> bool:
    """``set_own_slice`` for thread ``pid`` (0: the caller); the bench sets the worker's from
    outside for its diagnostic windows."""
    calls = _calls()
    if calls is None:
        return False
    libc, setattr_nr, getattr_nr = calls
    attr = _get(libc, getattr_nr, pid)
    if attr is None:
        return False
    attr.size = ctypes.sizeof(_SchedAttr)
    attr.sched_runtime = slice_ns
    return bool(libc.syscall(setattr_nr, pid, ctypes.byref(attr), 0) == 0)
