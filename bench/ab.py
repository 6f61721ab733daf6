#!/usr/bin/env python3
"""Paired A/B comparison of two versions of the exactly broker.  See bench/README.md.

python bench/ab.py --base /tmp/perf-base/src [--only NAME ...] [--pairs N] [--records N]

Why: on this shared, noisy 2-core box a before/after pair of separate ``run.py`` runs mostly
measures the neighbours. Here both brokers (A = ``--base``, another checkout's ``src``; B = this
checkout's ``src``) run for the whole session, and every repetition runs the workload on A and on
B back to back, order alternating, so both see the same noise. The report gives each pair's B/A
ratio and the median of those ratios, next to the medians of the figures themselves.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# this checkout's package (the broker launcher), whatever the venv has installed
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from benchlib import brokers, drivers, procstat
from benchlib.brokers import BrokerProcess
from benchlib.workloads import REGISTRY, Context, Workload

BENCH = Path(__file__).resolve().parent
# figure -> (label, lower is better)
FIGURES = {
    "mb_s": ("MB/s", False),
    "broker_cpu_s_per_gb": ("broker CPU-s/GB", True),
    "broker_cores": ("broker cores", True),
    "ack_p50_ms": ("ack p50 ms", True),
    "ack_p99_ms": ("ack p99 ms", True),
    "ack_p999_ms": ("ack p99.9 ms", True),
    "e2e_p50_ms": ("e2e p50 ms", True),
    "e2e_p99_ms": ("e2e p99 ms", True),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--base", type=Path, required=True, help="src dir of broker A (e.g. a git worktree's src)"
    )
    ap.add_argument("--only", nargs="+", default=["produce-confluent-p4"], help="workload names")
    ap.add_argument("--pairs", type=int, default=4, help="A/B pairs per workload")
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "raw", help="JSON goes here")
    ap.add_argument("--keep", action="store_true", help="keep the /tmp scratch dir")
    ap.add_argument(
        "--warmup",
        action="store_true",
        help="one untimed run per broker before the pairs (the first request of an API on a fresh "
        "broker imports its schema modules, ~20 ms: a fifth of a 100 B produce run's broker CPU)",
    )
    return ap.parse_args(argv)


def ratio_rows(name: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    rows = []
    for key, (label, lower) in FIGURES.items():
        got = [
            (a[key], b[key])
            for a, b in pairs
            if isinstance(a.get(key), float) and isinstance(b.get(key), float)
        ]
        if not got:
            continue
        ratios = [b / a for a, b in got if a]
        med_a = statistics.median(a for a, _ in got)
        med_b = statistics.median(b for _, b in got)
        better = sum(1 for r in ratios if (r < 1) == lower and r != 1)
        rows.append(
            f"| {name} | {label} | {med_a:.3g} | {med_b:.3g} | "
            f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}) | {better}/{len(ratios)} |"
        )
    return rows


def run_pairs(
    wl: Workload, ctx: Context, a: BrokerProcess, b: BrokerProcess, pairs: int, warmup: bool = False
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    states = {"A": wl.setup(ctx, a), "B": wl.setup(ctx, b)}
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    try:
        if warmup:  # untimed: the first-use costs, on both
            for label, broker in (("A", a), ("B", b)):
                wl.run_once(ctx, broker, states[label], -1)
            print("   warm-up runs on A and B done", flush=True)
        for rep in range(pairs):
            order = [("A", a), ("B", b)] if rep % 2 == 0 else [("B", b), ("A", a)]
            got: dict[str, dict[str, Any]] = {}
            for label, broker in order:
                try:
                    got[label] = wl.run_once(ctx, broker, states[label], rep)
                except Exception as exc:
                    traceback.print_exc()
                    got[label] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            line = "  ".join(
                f"{k}: {got[k].get('broker_cpu_s_per_gb') or got[k].get('ack_p99_ms')!s:.5}"
                f"{'' if got[k].get('ok') else ' FAILED ' + str(got[k].get('error'))}"
                for k in ("A", "B")
            )
            print(f"   pair {rep}: {line}", flush=True)
            if got["A"].get("ok") and got["B"].get("ok"):
                out.append((got["A"], got["B"]))
    finally:
        for label, broker in (("A", a), ("B", b)):
            try:
                wl.teardown(ctx, broker, states[label])
            except Exception as exc:
                print(f"   teardown {label} failed: {exc}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = [n for n in args.only if n not in REGISTRY]
    if unknown:
        raise SystemExit(f"unknown workloads: {unknown}")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"stamp": stamp, "base": str(args.base), "workloads": {}}
    table = [
        "| workload | figure | A (base) median | B median | B/A per pair: median (min-max) | B better |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    with brokers.TempDir("exactly-ab-", keep=args.keep) as scratch:
        ctx = Context(
            quick=False,
            records=args.records,
            repeat=args.pairs,
            scratch=scratch,
            kcat_env=drivers.kcat_env("bundled", scratch),
            latency_seconds=args.latency_seconds,
            latency_rate=1000,
            recovery_bytes=0,
            broker_options=[],
            pool=drivers.payload_pool(),
        )
        a = brokers.start_exactly(scratch / "a-data", src=args.base.resolve())
        b = brokers.start_exactly(scratch / "b-data")
        print(f"-- A {a.info['src']} pid {a.pid}; B {b.info['src']} pid {b.pid}", flush=True)
        load0 = Path("/proc/loadavg").read_text().split()[0]
        started = time.monotonic()
        try:
            for name in args.only:
                wl = REGISTRY[name]()
                print(f"== {name}", flush=True)
                pairs = run_pairs(wl, ctx, a, b, args.pairs, args.warmup)
                results["workloads"][name] = pairs
                table.extend(ratio_rows(name, pairs))
        finally:
            for broker in (a, b):
                broker.stop()
        results["load"] = [load0, Path("/proc/loadavg").read_text().split()[0]]
        results["seconds"] = time.monotonic() - started
        results["cpu_ticks"] = procstat.CLK_TCK
    (args.out / f"ab-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nA = {args.base}, B = {brokers.REPO / 'src'}; load {results['load'][0]} -> {results['load'][1]}")
    print("\n".join(table))
    print(f"-- raw: {args.out / f'ab-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
