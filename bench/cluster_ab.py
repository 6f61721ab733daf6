#!/usr/bin/env python3
"""Paired A/B of two versions of the exactly broker as a replicated cluster.  See bench/README.md.

python bench/cluster_ab.py --base /tmp/perf-base/src [--pairs N] [--records N] [--latency-seconds S]

Why: the cluster figures (issue #9) move with the box's load far more than any change does. Both
clusters (A = ``--base``, another checkout's ``src``; B = this checkout's ``src``), each ZooKeeper +
3 brokers started as ``cluster-*`` workloads start theirs, stay up for the whole session, and each
repetition runs the same loops on A and on B back to back, order alternating: ``cluster-latency-1k``'s
1,000 msg/s acks=all loop to an RF 3 topic (min.insync.replicas=2), and ``cluster-produce-p1``'s
produce loop to an RF 3 and an RF 1 topic (broker 0 leads every measured partition). The report
gives each figure per side (median, min-max) and the B/A ratio of each pair, with the 1-minute
load average of every repetition.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from benchlib import drivers
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster
from benchlib.cluster_workloads import LEADER, _place
from benchlib.workloads import GB, Context, fixed_rate_latency

BENCH = Path(__file__).resolve().parent
# figure -> lower is better
FIGURES = {
    "rf3_ack_p50_ms": True,
    "rf3_ack_p99_ms": True,
    "rf3_ack_p999_ms": True,
    "rf3_latency_broker_cpu_us_per_record": True,
    "rf3_mb_s": False,
    "rf1_mb_s": False,
    "rf3_over_rf1": False,
    "rf3_cpu_s_per_gb": True,
    "rf3_leader_cpu_s_per_gb": True,
    "rf3_followers_cpu_s_per_gb": True,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--base", type=Path, required=True, help="src dir of cluster A (e.g. a git worktree's src)"
    )
    ap.add_argument("--pairs", type=int, default=4, help="A/B repetitions")
    ap.add_argument("--records", type=int, default=100_000, help="1 KB records per throughput run")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--skip", nargs="*", default=[], choices=["latency", "throughput"])
    ap.add_argument(
        "--client-io-nice", type=int, metavar="N", help="see run.py --client-io-nice (both sides alike)"
    )
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "raw", help="JSON goes here")
    return ap.parse_args(argv)


def _produce(ctx: Context, cluster: Cluster, rf: int, warmup: str) -> dict[str, float]:
    topic = _place(cluster, "ab", rf)
    per0 = cluster.broker_cpu()
    run = drivers.confluent_produce(
        cluster.bootstrap,
        topic,
        ctx.records,
        ctx.pool,
        ctx.timeout_for(ctx.records * 1024),
        warmup_topic=warmup,
    )
    per1 = cluster.broker_cpu()
    cluster.delete_topic(topic)
    if run.errors or run.records != ctx.records:
        raise RuntimeError(f"rf {rf}: {run.records} records, errors {run.errors[:3]}")
    gb = run.bytes / GB
    cpu = {b: per1[b] - per0.get(b, 0.0) for b in per1}
    leader = cpu.get(LEADER, 0.0)
    total = sum(cpu.values())
    return {
        "mb_s": run.bytes / 1e6 / run.wall_s,
        "cpu_s_per_gb": total / gb,
        "leader_cpu_s_per_gb": leader / gb,
        "followers_cpu_s_per_gb": (total - leader) / gb,
    }


def one(ctx: Context, cluster: Cluster, warmup: str, skip: list[str]) -> dict[str, float]:
    out: dict[str, float] = {"load1": os.getloadavg()[0]}
    if "latency" not in skip:
        topic = _place(cluster, "ab-latency", 3)
        lat = fixed_rate_latency(ctx, cluster, topic)
        cluster.delete_topic(topic)
        if not lat["ok"]:
            raise RuntimeError(f"latency: {lat['error']}")
        for q in ("p50", "p99", "p999"):
            out[f"rf3_ack_{q}_ms"] = lat[f"ack_{q}_ms"]
        # CPU of the three brokers per acknowledged record: what the load cannot inflate much
        out["rf3_latency_broker_cpu_us_per_record"] = lat["broker_cpu_s"] / lat["records"] * 1e6
    if "throughput" not in skip:
        rf3 = _produce(ctx, cluster, 3, warmup)
        rf1 = _produce(ctx, cluster, 1, warmup)
        out.update({f"rf3_{k}": v for k, v in rf3.items()})
        out["rf1_mb_s"] = rf1["mb_s"]
        out["rf3_over_rf1"] = rf3["mb_s"] / rf1["mb_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    drivers.CLIENT_IO_NICE = args.client_io_nice
    scratch = Path(tempfile.mkdtemp(prefix="exactly-bench-cluster-ab-"))
    ctx = Context(
        quick=False,
        records=args.records,
        repeat=args.pairs,
        scratch=scratch,
        kcat_env={},
        latency_seconds=args.latency_seconds,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=[],
        pool=drivers.payload_pool(),
    )
    sides = {"A": args.base.resolve(), "B": (Path(__file__).resolve().parents[1] / "src")}
    clusters: dict[str, Cluster] = {}
    rows: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    try:
        for side, src in sides.items():
            clusters[side] = Cluster(
                scratch / f"cluster-{side}", 3, DEFAULT_SESSION_TIMEOUT_MS, {}, src=src
            ).start()
            print(f"-- {side}: {src} at {clusters[side].bootstrap}", flush=True)
        warmups = {side: _place(c, "ab-warmup", 1) for side, c in clusters.items()}
        for rep in range(args.pairs):
            for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                row = one(ctx, clusters[side], warmups[side], args.skip)
                rows[side].append(row)
                print(f"{rep} {side} " + " ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
    finally:
        for c in clusters.values():
            c.stop()
    report(rows, args)
    return 0


def report(rows: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    print(f"\n| figure | A ({args.base}) | B (this checkout) | B/A per pair |")
    print("| --- | ---: | ---: | ---: |")
    for fig in ["load1", *FIGURES]:
        a = [r[fig] for r in rows["A"] if fig in r]
        b = [r[fig] for r in rows["B"] if fig in r]
        if not a or not b:
            continue
        ratios = [y / x for x, y in zip(a, b, strict=False) if x]
        print(f"| {fig} | {cell(a)} | {cell(b)} | {cell(ratios) if ratios else '-'} |")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.out / f"cluster-ab-{stamp}-{uuid.uuid4().hex[:4]}.json"
    path.write_text(json.dumps({"base": str(args.base), "rows": rows, "when": time.time()}, indent=1))
    print(f"\nraw: {path}")


if __name__ == "__main__":
    sys.exit(main())
