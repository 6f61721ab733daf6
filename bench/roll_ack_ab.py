"""Produce ack latency under sustained segment rolls, paired across broker versions (mends-s21).

Every version in ``--src`` (label=path; B = this checkout's ``src`` is added last unless
``--no-b``) runs one
broker for the whole session; every round runs ``latency-1k``'s loop (``fixed_rate_latency``:
1,000 msg/s, 1 KB, acks=all, idempotent) for ``--seconds`` to a fresh topic with
``segment.bytes=--segment-bytes`` on each broker in turn, the order rotating per round, so the
log rolls ~15 times a second and the maintenance pass (every 10 s) flushes the rolled segments.
Reports ack p50/p99/max per window and the per-round ratios against the first version.

    PYTHONPATH=src:bench .venv/bin/python bench/roll_ack_ab.py \\
        --src pre=/tmp/mends-pre-offloop/src --src base=/tmp/base-s21/src --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import brokers, drivers, kafka
from benchlib.workloads import Context, fixed_rate_latency

REPO_SRC = Path(__file__).resolve().parents[1] / "src"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", default=[], help="label=path of another version's src")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--segment-bytes", type=int, default=65536)
    ap.add_argument("--no-b", action="store_true", help="only the --src versions")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every window")
    args = ap.parse_args(argv)
    ap_b = [] if args.no_b else [("B", str(REPO_SRC))]
    versions = [tuple(s.split("=", 1)) for s in args.src] + ap_b
    scratch = Path(tempfile.mkdtemp(prefix="roll-ack-ab-"))
    ctx = Context(
        quick=False,
        records=0,
        repeat=1,
        scratch=scratch,
        kcat_env={},
        latency_seconds=args.seconds,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=[],
        pool=drivers.payload_pool(1024),
    )
    running = {label: brokers.start_exactly(scratch / label, src=Path(path)) for label, path in versions}
    windows: list[dict[str, object]] = []
    try:
        for rnd in range(args.rounds):
            order = [versions[(rnd + i) % len(versions)][0] for i in range(len(versions))]
            for label in order:
                b = running[label]
                topic = f"roll-{label}-{rnd}-{uuid.uuid4().hex[:6]}"
                admin = kafka.admin(b.bootstrap)  # kept alive until the result is in
                futs = admin.create_topics(
                    [NewTopic(topic, 1, 1, config={"segment.bytes": str(args.segment_bytes)})]
                )
                futs[topic].result(30)
                kafka.wait_ready(b.bootstrap, time.monotonic() + 30)
                sample = fixed_rate_latency(ctx, b, topic)
                segments = len(list((b.data_dir / f"{topic}-0").glob("*.log")))
                row = {"round": rnd, "version": label, "load": os.getloadavg()[0], "segments": segments}
                row.update({k: sample[k] for k in ("ok", "error", "ack_p50_ms", "ack_p99_ms", "ack_max_ms")})
                windows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for b in running.values():
            b.stop()
    if args.out:
        args.out.write_text(json.dumps(windows, indent=1))
    first = versions[0][0]
    print(
        f"\n| version | ack p50 ms median | ack p99 ms median (min-max) | p99 / {first} per round | better |"
    )
    print("|---|---|---|---|---|")
    for label, _path in versions:
        mine = [w for w in windows if w["version"] == label]
        p99 = [float(w["ack_p99_ms"]) for w in mine]  # type: ignore[arg-type]
        p50 = [float(w["ack_p50_ms"]) for w in mine]  # type: ignore[arg-type]
        ratios = [
            float(w["ack_p99_ms"]) / float(v["ack_p99_ms"])  # type: ignore[arg-type]
            for w in mine
            for v in windows
            if v["version"] == first and v["round"] == w["round"]
        ]
        better = sum(r < 1 for r in ratios)
        print(
            f"| {label} | {statistics.median(p50):.2f} | {statistics.median(p99):.2f} ({min(p99):.2f}-{max(p99):.2f})"
            f" | {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) | {better}/{len(ratios)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
