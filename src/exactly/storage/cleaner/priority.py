"""The cleaner worker's background priority (why: ``worker``'s docstring, *Priority*). Kept light
(no import of the cleaner itself) so ``worker_main`` lowers the priority before it imports the
rest: those imports are ~0.7 s of CPU, which ran at the broker's priority before."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from exactly.storage.cleaner.sched_slice import MIN_SLICE_NS, set_own_slice

log = logging.getLogger(__name__)

#: The worker's nice value and its session's (autogroup's): the lowest priority a fair task has.
WORKER_NICENESS = 19
AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority() -> None:
    """Background priority (``worker``'s docstring); best effort, each step on its own. Running it
    twice changes nothing (nice is clamped at 19)."""
    if sys.platform.startswith("linux"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except (OSError, AttributeError) as exc:
            log.warning("could not lower the cleaner worker's scheduling policy: %s", exc)
    try:
        os.nice(WORKER_NICENESS)
    except OSError as exc:
        log.warning("could not lower the cleaner worker's nice value: %s", exc)
    if os.getsid(0) == os.getpid():  # the broker started it in a session of its own
        try:
            AUTOGROUP.write_text(f"{WORKER_NICENESS}\n")
        except OSError:  # no autogroups in this kernel: the task's own priority is what counts
            pass
    # the shortest EEVDF slice: a task woken on the worker's core preempts it at once instead of
    # at the next tick (``sched_slice``); an older kernel ignores it
    set_own_slice(MIN_SLICE_NS)
