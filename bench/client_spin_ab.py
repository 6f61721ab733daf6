#!/usr/bin/env python3
"""Paired A/B of the 1,000 msg/s loop's client, one cluster: the old spinning poll against the new one.

    PYTHONPATH=src .venv/bin/python bench/client_spin_ab.py [--pairs 4] [--seconds 10]

Why: ``fixed_rate_latency`` (``cluster-latency-1k``) called ``poll(left)`` with under 1 ms left,
which confluent-kafka truncates to ``poll(0)``: the loop spun through the rest of every interval,
about a core of the 2-core box the brokers share (bench/results/rf3tail-s18.md). One cluster of
this checkout's brokers; per pair the loop runs once with ``LATENCY_POLL_MIN_S = 0`` (A, the spin,
the default) and once with 0.001 (B, blocking in ``poll``), order alternating; the client process's CPU is reported beside the
ack percentiles, with B/A per pair.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import drivers, workloads
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster
from benchlib.cluster_workloads import _place
from benchlib.workloads import Context, fixed_rate_latency

SIDES = {"A": 0.0, "B": 0.001}


def _client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="exactly-bench-spin-ab-"))
    ctx = Context(
        quick=False,
        records=0,
        repeat=args.pairs,
        scratch=scratch,
        kcat_env={},
        latency_seconds=args.seconds,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=[],
        pool=drivers.payload_pool(),
    )
    rows: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    cluster = Cluster(scratch / "c", 3, DEFAULT_SESSION_TIMEOUT_MS, {}).start()
    try:
        for rep in range(args.pairs):
            for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                workloads.LATENCY_POLL_MIN_S = SIDES[side]
                topic = _place(cluster, "spin-ab", 3)
                load1 = os.getloadavg()[0]
                c0 = _client_cpu()
                lat = fixed_rate_latency(ctx, cluster, topic)
                cluster.delete_topic(topic)
                if not lat["ok"]:
                    raise RuntimeError(lat["error"])
                row = {
                    "load1": load1,
                    "ack_p50_ms": lat["ack_p50_ms"],
                    "ack_p99_ms": lat["ack_p99_ms"],
                    "ack_p999_ms": lat["ack_p999_ms"],
                    "client_cores": (_client_cpu() - c0) / lat["wall_s"],
                    "broker_cores": lat["broker_cores"],
                }
                rows[side].append(row)
                print(f"{rep} {side} " + " ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
    finally:
        cluster.stop()
    print("\n| figure | A (spin) | B (poll >= 1 ms) | B/A per pair | B better |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for fig in rows["A"][0]:
        a, b = [r[fig] for r in rows["A"]], [r[fig] for r in rows["B"]]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]

        def cell(v: list[float]) -> str:
            return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"

        better = sum(y < x for x, y in zip(a, b, strict=True))
        print(f"| {fig} | {cell(a)} | {cell(b)} | {cell(ratios)} | {better}/{len(a)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
