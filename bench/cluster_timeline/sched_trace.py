"""The kernel scheduler's view of a ``run.py`` window (``SCHED_TRACE=1``): who waited for a core, when.

``start()`` opens a tracefs instance of its own recording ``sched_switch`` and ``sched_wakeup`` on
CLOCK_MONOTONIC (the clock of the brokers' traces and the client's ``client.json``); ``stop()``
writes ``OUT/sched.txt``, ``OUT/tgids.txt`` and ``OUT/threads.json`` (each given process's threads
and their names). ``sched_analyze.py OUT`` reads them. Needs root and Linux; a diagnostic only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ("sched/sched_switch", "sched/sched_wakeup")


def start() -> Path:
    inst = TRACEFS / "instances" / f"timeline-{os.getpid()}"
    inst.mkdir(exist_ok=True)
    (inst / "tracing_on").write_text("0")
    (inst / "trace_clock").write_text("mono")
    (inst / "options" / "record-tgid").write_text("1")
    (inst / "buffer_size_kb").write_text("131072")
    for ev in EVENTS:
        (inst / "events" / ev / "enable").write_text("1")
    (inst / "trace").write_text("")
    (inst / "tracing_on").write_text("1")
    return inst


def stop(inst: Path, out: Path, pids: dict[str, int | None]) -> None:
    try:
        (inst / "tracing_on").write_text("0")
        with (inst / "trace").open() as src, (out / "sched.txt").open("w") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copyfile(TRACEFS / "saved_tgids", out / "tgids.txt")
        threads: dict[str, dict[str, str]] = {}
        for name, pid in pids.items():
            if pid is None:
                continue
            rows: dict[str, str] = {}
            for task in Path(f"/proc/{pid}/task").iterdir():
                try:
                    rows[task.name] = (task / "comm").read_text().strip()
                except OSError:
                    continue
            threads[name] = {"pid": str(pid), **rows}
        (out / "threads.json").write_text(json.dumps(threads))
    finally:
        for ev in EVENTS:
            (inst / "events" / ev / "enable").write_text("0")
        inst.rmdir()
