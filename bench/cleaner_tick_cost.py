"""Diagnostic: the cleaner pass's throughput with ``worker.CpuLimiter`` as its tick (share 1.0,
unlimited) yielding at every tick or not, alternating in one process: CPU seconds and wall
seconds per MB read. The yield's cost when nothing waits on the core is its system call.

    PYTHONPATH=src:. .venv/bin/python bench/cleaner_tick_cost.py --mb 20 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.storage.cleaner.helpers import append_keyed
from tests.storage.helpers import NOW, TP

from exactly.storage.cleaner.cleanable import cleanable_offsets, log_to_clean
from exactly.storage.cleaner.cleaner import run_pass
from exactly.storage.cleaner.job import describe_pass, remove_cleaned_files
from exactly.storage.cleaner.offset_map import OffsetMap
from exactly.storage.cleaner.worker import CpuLimiter
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tick-cost-"))
    config = LogConfig(cleanup_policy="compact", segment_bytes=4 * 1024 * 1024)
    log = PartitionLog.open(tmp, TP, config, recovery_point=0, now_ms=NOW)
    value = 10**95  # ~100 B values
    per_batch, key = 2000, 0
    while log.log_end_offset * 110 < args.mb * 1e6:
        append_keyed(log, [(k % 50_000, value) for k in range(key, key + per_batch)])
        key += per_batch
    append_keyed(log, [0])  # a fresh active segment
    offsets = cleanable_offsets(
        log.segments,
        log_start_offset=log.log_start_offset,
        log_end_offset=log.log_end_offset,
        last_stable_offset=log.last_stable_offset,
        high_watermark=log.high_watermark,
        checkpoint=None,
        config=log.config,
        now_ms=NOW,
    )
    job = describe_pass(log, log_to_clean(log.segments, offsets, log.config, NOW), NOW)
    omap = OffsetMap(64 * 1024 * 1024)
    results: dict[str, list[tuple[float, float]]] = {"no-yield": [], "yield": []}
    for r in range(args.rounds):
        for name in ("no-yield", "yield") if r % 2 == 0 else ("yield", "no-yield"):
            lim = CpuLimiter(1.0, yield_core=os.sched_yield if name == "yield" else (lambda: None))
            lim.start()
            written: list[int] = []
            c0, w0 = time.process_time(), time.perf_counter()
            _, stats = run_pass(job, omap, lambda c, w=written: w.append(c.base_offset), tick=lim)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            remove_cleaned_files(job.directory, written)
            mb = stats.bytes_read / 1e6
            results[name].append((mb / cpu, mb / wall))
            print(
                f"{name:9s} read {mb:.1f} MB: {mb / cpu:.2f} MB per CPU-s, {mb / wall:.2f} MB/s wall, "
                f"yields {lim.yields}, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    for name, v in results.items():
        cpu_rate, wall_rate = statistics.median(x for x, _ in v), statistics.median(y for _, y in v)
        print(f"{name}: median {cpu_rate:.2f} MB per CPU-s, {wall_rate:.2f} MB/s wall")
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
