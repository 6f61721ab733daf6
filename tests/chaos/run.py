"""Jepsen-style chaos runs against the broker: ``python -m tests.chaos.run --runs N --seed S``
(or ``make chaos RUNS=N SEED=S``).

Runs seeds S, S+1, ..., S+N-1 one after another; each prints one line (seed, faults, checker
verdict). A failing run keeps its directory (histories, broker log, report.json) and prints how
to reproduce it: ``python -m tests.chaos.run --runs 1 --seed <seed>``. Exit status 1 if any run
found an anomaly.

    python -m tests.chaos.run --check DIR   # re-run the checker on a kept run directory

Cluster mode (``tests/chaos/cluster_runner.py``): ``--cluster 3`` starts one ZooKeeper for the
whole invocation and, per seed, three brokers in a chroot of their own, with the cluster faults
(broker kill -9 / bounce, a partition leader SIGSTOPped past its session timeout, coordinator
crashes, an isolated broker); ``--seeds A..B`` is the same as ``--seed A --runs B-A+1``:

    python -m tests.chaos.run --cluster 3 --seeds 1..50 --duration 15
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from exactly.cluster.zookeeper import ZooKeeperServer
from tests.chaos.checker import check
from tests.chaos.cluster_runner import CLUSTER_FAULTS, run_cluster
from tests.chaos.history import load_history
from tests.chaos.runner import ChaosConfig, RunResult, run_one


@contextlib.contextmanager
def zookeeper(base: Path, wanted: bool) -> Iterator[str | None]:
    """One ZooKeeper for the whole invocation (cluster mode only); yields its connect string."""
    if not wanted:
        yield None
        return
    server = ZooKeeperServer(base / "zookeeper", port=0)
    server.start()
    try:
        yield server.address.connect
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of faults per run")
    ap.add_argument("--workdir", type=Path, default=None, help="where run directories go")
    ap.add_argument("--keep", action="store_true", help="keep the directories of passing runs too")
    ap.add_argument("--summary", type=Path, default=None, help="write a JSON summary here")
    ap.add_argument("--check", type=Path, default=None, help="only check an existing run directory")
    ap.add_argument("--cluster", type=int, default=0, help="brokers of a ZooKeeper cluster (0: one broker)")
    ap.add_argument("--seeds", default=None, help="A..B: seeds A to B (overrides --seed/--runs)")
    args = ap.parse_args(argv)
    # SIGTERM (and SIGINT, which a background job ignores) end the run through the finally
    # blocks: the round's brokers, clients and ZooKeeper are stopped, not left behind
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if args.seeds is not None:
        first, _, last = args.seeds.partition("..")
        args.seed, args.runs = int(first), int(last or first) - int(first) + 1
    if args.check is not None:
        report = check(load_history(args.check))
        print(report.summary())
        return 0 if report.ok else 1

    base = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seed, args.seed + args.runs))
    failed: list[int] = []
    anomalies: Counter[str] = Counter()
    fault_counts: Counter[str] = Counter()
    rows: list[dict[str, object]] = []
    errors: dict[int, str] = {}
    started = time.monotonic()
    with zookeeper(base, args.cluster > 0) as zk:
        for seed in seeds:
            try:
                result = run_seed(args, base, seed, zk)
            except Exception as exc:  # a round that could not run: say so, go on
                failed.append(seed)
                errors[seed] = repr(exc)
                print(f"seed {seed}: ERROR (the round did not complete) {exc!r}", flush=True)
                continue
            record(result, rows, failed, anomalies, fault_counts, args.cluster)
    total = sum(anomalies.values())
    print(
        f"\n{len(seeds)} runs, seeds {seeds[0]}..{seeds[-1]}, {time.monotonic() - started:.0f}s, "
        f"{total} anomalies {dict(anomalies)}; failing seeds: {failed or 'none'}"
    )
    if errors:
        print(f"rounds that did not complete: {errors}")
    print(f"faults injected: {dict(sorted(fault_counts.items()))}")
    if args.summary is not None:
        args.summary.write_text(
            json.dumps(
                {
                    "seeds": seeds,
                    "failed": failed,
                    "anomalies": dict(anomalies),
                    "faults": dict(fault_counts),
                    "errors": errors,
                    "runs": rows,
                },
                indent=1,
                default=str,
            )
        )
    return 1 if failed else 0


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_seed(args: argparse.Namespace, base: Path, seed: int, zk: str | None) -> RunResult:
    workdir = base / f"seed-{seed}"
    if zk is None:
        return run_one(ChaosConfig(seed=seed, workdir=workdir, duration=args.duration), keep=args.keep)
    cfg = ChaosConfig(seed=seed, workdir=workdir, duration=args.duration, faults=dict(CLUSTER_FAULTS))
    chroot = f"{zk}/chaos-{seed}-{uuid.uuid4().hex[:8]}"
    return run_cluster(cfg, chroot, brokers=args.cluster, keep=args.keep)


def record(
    result: RunResult,
    rows: list[dict[str, object]],
    failed: list[int],
    anomalies: Counter[str],
    fault_counts: Counter[str],
    cluster: int,
) -> None:
    seed = result.seed
    mode = f" --cluster {cluster}" if cluster else ""
    fault_counts.update(result.faults)
    anomalies.update({k: v for k, v in result.report.counts.items() if v})
    verdict = result.report.summary()
    print(
        f"seed {seed}: {result.seconds:.0f}s faults={len(result.faults)} "
        f"({','.join(result.faults)}) {verdict}",
        flush=True,
    )
    if result.notes:
        print(f"  seed {seed} notes: {result.notes}", flush=True)
    rows.append(
        {
            "seed": seed,
            "ok": result.ok,
            "seconds": round(result.seconds, 1),
            "faults": result.faults,
            "notes": result.notes,
            **result.report.as_dict(),
        }
    )
    if not result.ok:
        failed.append(seed)
        print(
            f"  FAILED seed {seed}: kept {result.workdir}; reproduce with "
            f"`python -m tests.chaos.run{mode} --runs 1 --seed {seed}`",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
