"""Restart-to-ready of one compacted data dir under two versions of the broker, alternating, with a
fresh broker's start in every round (the compaction-internal workload's restart figure, A/B).

The data dir is built once (``--commits`` offset commits over 20 groups x 100 partitions, then
``--transactions`` transactions over 2,000 transactional ids, through the wire, cleaner on, until
the cleaner is quiet) and every restart starts from a copy of it as the broker left it, so both
versions replay the same log and do the same recovery. Order alternates A,B / B,A per round; the
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
        last, quiet = -1.0, time.monotonic()
        while time.monotonic() - quiet < 3.0:  # until no cleaner pass for 3 s
            p = passes_of(scrape(b))
            if p != last:
                last, quiet = p, time.monotonic()
            time.sleep(0.2)
    finally:
        b.stop()


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
