"""Jepsen-style chaos runs against the broker: ``python -m tests.chaos.run --runs N --seed S``
(or ``make chaos RUNS=N SEED=S``).

Runs seeds S, S+1, ..., S+N-1 one after another; each prints one line (seed, faults, checker
verdict). A failing run keeps its directory (histories, broker log, report.json) and prints how
to reproduce it: ``python -m tests.chaos.run --runs 1 --seed <seed>``. Exit status 1 if any run
found an anomaly.

    python -m tests.chaos.run --check DIR   # re-run the checker on a kept run directory
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.chaos.checker import check
from tests.chaos.history import load_history
from tests.chaos.runner import ChaosConfig, run_one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of faults per run")
    ap.add_argument("--workdir", type=Path, default=None, help="where run directories go")
    ap.add_argument("--keep", action="store_true", help="keep the directories of passing runs too")
    ap.add_argument("--summary", type=Path, default=None, help="write a JSON summary here")
    ap.add_argument("--check", type=Path, default=None, help="only check an existing run directory")
    args = ap.parse_args(argv)
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
    rows = []
    started = time.monotonic()
    for seed in seeds:
        cfg = ChaosConfig(seed=seed, workdir=base / f"seed-{seed}", duration=args.duration)
        result = run_one(cfg, keep=args.keep)
        fault_counts.update(result.faults)
        anomalies.update({k: v for k, v in result.report.counts.items() if v})
        verdict = result.report.summary()
        print(
            f"seed {seed}: {result.seconds:.0f}s faults={len(result.faults)} "
            f"({','.join(result.faults)}) {verdict}",
            flush=True,
        )
        rows.append(
            {
                "seed": seed,
                "ok": result.ok,
                "seconds": round(result.seconds, 1),
                "faults": result.faults,
                **result.report.as_dict(),
            }
        )
        if not result.ok:
            failed.append(seed)
            print(
                f"  FAILED seed {seed}: kept {result.workdir}; reproduce with "
                f"`python -m tests.chaos.run --runs 1 --seed {seed}`",
                flush=True,
            )
    total = sum(anomalies.values())
    print(
        f"\n{len(seeds)} runs, seeds {seeds[0]}..{seeds[-1]}, {time.monotonic() - started:.0f}s, "
        f"{total} anomalies {dict(anomalies)}; failing seeds: {failed or 'none'}"
    )
    print(f"faults injected: {dict(sorted(fault_counts.items()))}")
    if args.summary is not None:
        args.summary.write_text(
            json.dumps(
                {
                    "seeds": seeds,
                    "failed": failed,
                    "anomalies": dict(anomalies),
                    "faults": dict(fault_counts),
                    "runs": rows,
                },
                indent=1,
                default=str,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
