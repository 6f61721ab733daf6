"""Where a micro-batch's time goes: timers inside the connector, collected for the benchmark.

Spark's progress reports time the driver's phases (``latestOffset``, ``getBatch``,
``queryPlanning``, ``walCommit``, ``addBatch``, ``commitOffsets``), but ``addBatch`` is one number
for everything the executors do. The connector's own code runs in Python workers that cannot hand
anything back to the benchmark except through the sink's commit messages, so every timed section
(the source's read of one range, the sink's prepare in one task, the driver's commit) appends one
JSON line to a file of its own process when ``EXACTLY_SPARK_TIMINGS`` names a directory. Spark's
Python workers inherit the driver's environment, so setting the variable before the SparkSession
starts is enough on a local master (on a cluster it must be set on the executors, and the files
stay there).

Off (the variable unset) this costs one ``os.environ`` lookup per task. A line is written once per
task, never per record; a failing write is ignored (timings never fail a job).

Each line: ``{"kind": ..., "query": ..., "batch": ..., "partition": ..., "pid": ...,
"worker_start_s": ..., <section>: seconds, ...}``. ``worker_start_s`` is set on the first line of a
process only: the time from the process's creation to the start of that first timed section
(fork, imports, unpickling the reader or writer) - Spark reuses a Python worker for later tasks
(``spark.python.worker.reuse``), which then pay nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

ENV = "EXACTLY_SPARK_TIMINGS"

_LOCK = threading.Lock()
_FIRST_IN_PROCESS = [True]


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def _process_age_s() -> float | None:
    """Seconds since this process was created (Linux /proc), or None where unknown."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def record(kind: str, query: str | None, batch: int | None, partition: int, sections: dict[str, Any]) -> None:
    """Append one timed section's line (no-op unless ``EXACTLY_SPARK_TIMINGS`` is set)."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    line: dict[str, Any] = {
        "kind": kind,
        "query": query,
        "batch": batch,
        "partition": partition,
        "pid": os.getpid(),
        "at": time.time(),
        **sections,
    }
    with _LOCK:
        if _FIRST_IN_PROCESS[0]:
            _FIRST_IN_PROCESS[0] = False
            age = _process_age_s()
            if age is not None:
                line["worker_start_s"] = max(0.0, age - float(sections.get("total", 0.0)))
        try:
            with open(Path(directory) / f"{os.getpid()}.jsonl", "a") as f:
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
        except OSError:
            pass


def load(directory: Path) -> list[dict[str, Any]]:
    """Every line written under ``directory`` (for the benchmark)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except ValueError:
                continue
    return lines
