"""Restart-to-ready of one compacted data dir under two versions of the broker, alternating, with a
fresh broker's start in every round (the compaction-internal workload's restart figure, A/B).

The data dir is built once (``--commits`` offset commits over 20 groups x 100 partitions, then
``--transactions`` transactions over 2,000 transactional ids, through the wire, cleaner on, until
the cleaner is done: no pass for 3 s and no log above the cleanable dirty ratio) and every
restart starts from a copy of it as the broker left it (fsynced before the start, like data a
clean shutdown left), so both versions replay the same log and do the same recovery. Ready means
the listener answers OffsetFetch with the last committed offset and InitProducerId succeeds:
both coordinators loaded (they load before the listener opens). Order alternates A,B / B,A per round; the
1-minute load average is reported with the medians, since every figure depends on it on a shared
box.

    python bench/restart_ab.py --base /path/to/other/src --rounds 6
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import brokers, kafka, procstat
from benchlib.compaction_workloads import Wire, offset_commits, passes_of, ready_s, scrape, transactions

GROUPS = 20
OPTIONS = [
    "offsets.topic.num.partitions=1",
    "transaction.state.log.num.partitions=1",
    "offsets.topic.segment.bytes=1048576",
    "transaction.state.log.segment.bytes=1048576",
    "metrics.port=0",
]


def build(data: Path, commits: int, txns: int) -> None:
    b = brokers.start_exactly(data, [*OPTIONS, "log.cleaner.backoff.ms=200"], log_name="build.log")
    try:
        kafka.create_topic(b.bootstrap, "bench-offsets", 100)
        w = Wire(b.bootstrap)
        offset_commits(w, commits, GROUPS, "bench-offsets")
        transactions(w, txns, 2000, "bench-offsets")
        w.close()
        # Until the cleaner is done: no pass for 3 s *and* its last look found no log above
        # min.cleanable.dirty.ratio (50 %). "No pass for 3 s" alone also holds while one long
        # pass runs (a pass under load takes tens of seconds), and stopping then left a data
        # dir with a 95 %-dirty transaction log, a state a running broker leaves within seconds.
        last, quiet = -1.0, time.monotonic()
        while True:
            m = scrape(b)
            p = passes_of(m)
            if p != last:
                last, quiet = p, time.monotonic()
            elif time.monotonic() - quiet >= 3.0 and m.get("exactly_log_cleaner_max_dirty_percent", 0.0) < 50:
                break
            time.sleep(0.2)
    finally:
        b.stop()


def settle(data: Path) -> None:
    """fsync every file and directory of a just-made data dir before its broker starts.

    A broker restarted in production finds its data on disk (a clean shutdown flushed it); a copy
    made a moment before the start is still dirty in the page cache, and the start's first file
    creations, truncations and fsyncs then wait while the filesystem journal writes back megabytes
    of copy: a cost of the bench, not of the restart (measured: the open phase's wall time 2-4x
    its CPU time). Every start, fresh ones included, begins from settled data."""
    for root, _dirs, files in os.walk(data, topdown=False):
        for name in [*files, "."]:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(data.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="src dir of broker A (e.g. main's)")
    ap.add_argument(
        "--src", type=Path, default=Path(__file__).resolve().parent.parent / "src", help="broker B"
    )
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--commits", type=int, default=100_000)
    ap.add_argument("--transactions", type=int, default=20_000)
    ap.add_argument(
        "--data",
        type=Path,
        help="restart from copies of this data dir (built by an earlier run with the same --commits) "
        "instead of building one",
    )
    args = ap.parse_args()
    # Byte-code compiled up front for both trees: a tree from ``git archive`` has no
    # __pycache__, and with PYTHONDONTWRITEBYTECODE set (or a read-only tree) every start would
    # compile each module it imports again, a cost of the tree and not of the version.
    for tree in (args.base, args.src):
        compileall.compile_dir(tree, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="restart-ab-"))
    pristine = args.data or work / "pristine" / "data"
    if args.data is None:
        build(pristine, args.commits, args.transactions)
    last_group = f"group-{(args.commits // 100 - 1) % GROUPS}"
    expected = args.commits // 100 - 1
    times: dict[str, list[float]] = {"A": [], "B": [], "fresh": []}
    cpus: dict[str, list[float]] = {"A": [], "B": [], "fresh": []}  # the broker process's, at ready
    loads: list[float] = []
    for r in range(args.rounds):
        for v in ("A", "B", "fresh") if r % 2 == 0 else ("B", "A", "fresh"):
            data = work / f"{v}-{r}" / "data"
            if v == "fresh":
                data.mkdir(parents=True)
            else:
                shutil.copytree(pristine, data)
            settle(data)
            b = brokers.start_exactly(
                data, OPTIONS, log_name="restart.log", timeout=600, src=args.src if v != "A" else args.base
            )
            try:
                t = ready_s(b, None, None) if v == "fresh" else ready_s(b, last_group, expected)
                cpu = procstat.cpu_seconds(b.pid, include_children=False)  # not the cleaner's worker
            finally:
                b.stop()
            times[v].append(t)
            cpus[v].append(cpu)
            loads.append(os.getloadavg()[0])
            print(f"round {r} {v}: {t:.3f} s, {cpu:.2f} CPU-s (load {loads[-1]:.2f})", flush=True)
    for v, xs in times.items():
        print(
            f"{v}: median {statistics.median(xs):.3f} s, min {min(xs):.3f} s; "
            f"CPU-s to ready median {statistics.median(cpus[v]):.3f}"
        )
    # Paired per round: each restart against the fresh start of its own round (the box's load
    # moves between rounds; within one round the three starts ran back to back).
    for what, xs in (("wall", times), ("CPU", cpus)):
        ra = [a / f for a, f in zip(xs["A"], xs["fresh"], strict=True)]
        rb = [b / f for b, f in zip(xs["B"], xs["fresh"], strict=True)]
        print(
            f"per-round {what} restart/fresh: A {' '.join(f'{x:.2f}' for x in ra)} "
            f"(median {statistics.median(ra):.2f}); B {' '.join(f'{x:.2f}' for x in rb)} "
            f"(median {statistics.median(rb):.2f}); B below A in "
            f"{sum(b < a for a, b in zip(ra, rb, strict=True))}/{len(ra)}; B under 2x in "
            f"{sum(b < 2 for b in rb)}/{len(rb)}"
        )
    fresh = statistics.median(times["fresh"])
    fresh_cpu = statistics.median(cpus["fresh"])
    print(
        f"A / fresh {statistics.median(times['A']) / fresh:.2f}, B / fresh {statistics.median(times['B']) / fresh:.2f}; "
        f"CPU-s A / fresh {statistics.median(cpus['A']) / fresh_cpu:.2f}, "
        f"B / fresh {statistics.median(cpus['B']) / fresh_cpu:.2f}; "
        f"load avg mean {statistics.mean(loads):.2f}, max {max(loads):.2f}; data in {work}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
